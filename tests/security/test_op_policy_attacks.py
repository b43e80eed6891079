"""The allowlist op policy (pipeline/policy.py) attacked as a client holding the cluster's token
would, against a TLS + token cluster of `data-server` processes: pipelines that write files
(`cache` to a file), kill the worker (`Abort`), read saved datasets, checkpoints and table files,
and connect to other servers, each sent as a raw RegisterDataset (an attacker's own client). Each
is PERMISSION_DENIED at registration naming the op, nothing is written, and a legitimate trainer
reading at the same time reads every element."""

from __future__ import annotations

import os
import threading

import pytest
import tensorflow as tf

import dataservice
from dataservice import errors
from dataservice.pipeline import graph as graph_lib
from dataservice.rpc import tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import common_pb2


def _aborting(x):
    with tf.control_dependencies([tf.raw_ops.Abort(error_msg="killed by a pipeline")]):
        return tf.identity(x)


def _vocabulary_lookup(path: str) -> tf.data.Dataset:
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER
        ),
        -1,
    )
    return tf.data.Dataset.from_tensor_slices(["a"]).map(table.lookup)


def _outbound_graph() -> bytes:
    """A pipeline whose source is TensorFlow's own service reader, which would connect to any
    address (built by hand, as an attacker would send it: constructing one connects at once)."""
    graph = graph_lib.parse_graph(graph_lib.serialize_dataset(tf.data.Dataset.range(3)))
    for node in graph.node:
        if node.op == "RangeDataset":
            node.op = "DataServiceDatasetV4"
    return graph.SerializeToString()


def attacks(secure_cluster, tmp_path) -> dict[str, tuple[bytes, str]]:
    saved = str(tmp_path / "saved")
    tf.data.Dataset.range(3).save(saved)
    vocabulary = os.path.join(secure_cluster.data_dir, "vocabulary.txt")
    with open(vocabulary, "w") as f:
        f.write("a\nb\n")
    serialize = graph_lib.serialize_dataset
    return {
        "cache to a file": (serialize(tf.data.Dataset.range(5).cache(str(tmp_path / "cache"))), "CacheDatasetV2"),
        "abort": (serialize(tf.data.Dataset.range(5).map(_aborting)), "Abort"),
        "load a saved dataset": (serialize(tf.data.Dataset.load(saved)), "Snapshot|LoadDataset"),
        "table from a file": (serialize(_vocabulary_lookup(vocabulary)), "InitializeTableFromTextFile"),
        "read another service": (_outbound_graph(), "DataServiceDataset"),
    }


@pytest.mark.parametrize(
    "attack", ["cache to a file", "abort", "load a saved dataset", "table from a file", "read another service"]
)
def test_each_attack_is_refused_while_a_trainer_reads_on(secure_cluster, tmp_path, attack):
    graph, op = attacks(secure_cluster, tmp_path)[attack]
    metadata = common_pb2.DatasetMetadata(
        element_spec=graph_lib.encode_element_spec(tf.data.Dataset.range(1).element_spec)
    )
    trainer = tf.data.Dataset.range(2_000).apply(dataservice.distribute("parallel_epochs", secure_cluster.target))
    read: list = []
    reader = threading.Thread(target=lambda: read.extend(trainer.as_numpy_iterator()))
    reader.start()
    try:
        address = secure_cluster.dispatcher.address
        tls_files = tls.TlsFiles(ca_file=secure_cluster.certs.ca_file)
        with DispatcherClient(address, timeout_s=10, tls=tls_files) as attacker:
            with pytest.raises(errors.PermissionDeniedError, match=op) as raised:
                attacker.register_dataset(graph, metadata)
        assert "dataset policy" in raised.value.message
    finally:
        reader.join(120)
    assert sorted(read) == list(range(2_000))
    assert not os.path.exists(tmp_path / "cache.index") and not any(
        p.name.startswith("cache") for p in tmp_path.iterdir()
    )
    assert secure_cluster.worker.proc.poll() is None and secure_cluster.dispatcher.proc.poll() is None
