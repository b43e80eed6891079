"""The worker's file sandbox (worker/sandbox.py), attacked as a client with the cluster's token
would: pipelines that read the worker's TLS key and token by paths computed at run time, through
`..`, a symlink under the data root, /proc and a directory listing, against a TLS + token cluster
of `data-server` processes whose worker has `--data_roots`. Each read is a permission error on
the worker, while the data under the root is read and a legitimate trainer goes on reading."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf

import dataservice
from dataservice.config import WorkerConfig
from dataservice.worker import sandbox


@pytest.fixture(scope="module", autouse=True)
def landlock_available():
    if sandbox.abi_version() < 1:
        message = "this kernel has no Landlock, which data_roots needs"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the sandbox tests must run)")
        pytest.skip(message)


def reversed_path(path: str) -> tf.data.Dataset:
    """A dataset of one string: `path` reversed, so the path exists in the graph only as what a map
    computes at run time (no constant the dispatcher could look for)."""
    return tf.data.Dataset.from_tensors(path[::-1])


def read_computed(path: str) -> tf.data.Dataset:
    return reversed_path(path).map(lambda s: tf.io.read_file(tf.strings.reduce_join(tf.strings.bytes_split(s)[::-1])))


def served(secure_cluster, dataset: tf.data.Dataset) -> list:
    return list(dataset.apply(dataservice.distribute("parallel_epochs", secure_cluster.target)).as_numpy_iterator())


def test_pipelines_read_files_under_the_data_root(secure_cluster):
    for i in range(3):
        with open(os.path.join(secure_cluster.data_dir, f"shard-{i}.txt"), "w") as f:
            f.write(f"line {i}\n")
    lines = tf.data.Dataset.list_files(os.path.join(secure_cluster.data_dir, "*.txt"), shuffle=False).interleave(
        tf.data.TextLineDataset
    )
    assert sorted(served(secure_cluster, lines)) == [b"line 0", b"line 1", b"line 2"]
    assert served(secure_cluster, read_computed(os.path.join(secure_cluster.data_dir, "shard-1.txt"))) == [b"line 1\n"]


@pytest.mark.parametrize("what", ["tls key", "tls certificate", "token", "dotdot", "symlink", "proc environ", "mem"])
def test_credentials_and_anything_outside_the_roots_read_as_permission_errors(secure_cluster, what):
    certs = secure_cluster.certs
    link = os.path.join(secure_cluster.data_dir, "innocent.txt")
    if not os.path.lexists(link):
        os.symlink(certs.server_key_file, link)
    path = {
        "tls key": certs.server_key_file,
        "tls certificate": certs.server_cert_file,
        "token": secure_cluster.token_file,
        "dotdot": os.path.join(secure_cluster.data_dir, "..", "token"),
        "symlink": link,
        "proc environ": "/proc/self/environ",
        "mem": "/proc/self/mem",
    }[what]
    with pytest.raises(tf.errors.OpError, match="Permission denied") as raised:
        served(secure_cluster, read_computed(path))
    assert secure_cluster.token not in str(raised.value)
    # The worker is unharmed: a legitimate trainer reads on.
    assert served(secure_cluster, tf.data.Dataset.range(20)) == list(range(20))


def test_listing_a_directory_outside_the_roots_shows_nothing(secure_cluster):
    certificates_dir = os.path.dirname(secure_cluster.certs.server_key_file)
    listing = reversed_path(certificates_dir + "/*").map(
        lambda s: tf.strings.reduce_join(tf.io.matching_files(tf.strings.reduce_join(tf.strings.bytes_split(s)[::-1])))
    )
    # TensorFlow's glob skips directories it cannot open: the listing comes back empty.
    assert served(secure_cluster, listing) == [b""]
    assert os.listdir(certificates_dir)  # what the worker would have listed without the sandbox


def test_a_worker_without_landlock_coverage_refuses_to_start(tmp_path, secure_cluster):
    # In this process TensorFlow already runs threads the sandbox could not cover.
    config = WorkerConfig(dispatcher_address="localhost:1", data_roots=[str(tmp_path)])
    from dataservice.worker.worker_server import WorkerServer

    with pytest.raises(sandbox.SandboxError, match="before the worker starts threads"):
        WorkerServer(config, start=False)
    # A root that is not a directory stops data-server before it serves anything.
    result = subprocess.run(
        [
            sys.executable, "-m", "dataservice.cli", "--role=worker", "--port=0", "--no-monitoring",
            f"--dispatcher_address={secure_cluster.dispatcher.address}", f"--data_roots={tmp_path}/missing",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "is not a directory" in result.stderr


def test_data_roots_must_be_absolute_directories():
    for bad in ("/data", ["relative/path"], [""], []):
        with pytest.raises(ValueError, match="data_roots"):
            WorkerConfig(dispatcher_address="localhost:1", data_roots=bad)
