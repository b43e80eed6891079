"""distributed_save: the workers write a dataset that plain TensorFlow loads, each element once,
also when a worker is killed or the dispatcher restarts mid-save."""

import collections
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import wait_for_workers
from tensorflow.python.data.experimental.ops.testing import sleep

import dataservice as service
from dataservice.local_cluster import ServerProcess

pytestmark = pytest.mark.timeout(240)

# Loads snapshots with TensorFlow alone (dataservice must not even be importable as a helper):
# prints, per path, the elements' "x" values, or the error Dataset.load raised.
_LOAD_WITH_TENSORFLOW = """
import json, sys
import tensorflow as tf
out = {}
for path in sys.argv[1:]:
    try:
        out[path] = sorted(int(e["x"]) for e in tf.data.Dataset.load(path).as_numpy_iterator())
    except (tf.errors.OpError, ValueError) as e:
        out[path] = type(e).__name__ + ": " + str(e)
assert "dataservice" not in sys.modules
print(json.dumps(out))
"""


def load_with_tensorflow(*paths):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_WITH_TENSORFLOW, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def load_here(path: str) -> list[int]:
    """The snapshot's "x" values, loaded by tf.data in this process (test_saved_snapshots_load_in_
    tensorflow_alone shows the same files load where dataservice is not even importable)."""
    return sorted(int(e["x"]) for e in tf.data.Dataset.load(path).as_numpy_iterator())


def wait_until_done(path, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(path, "DONE")) or os.path.exists(os.path.join(path, "ERROR")):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the snapshot at {path} did not finish in {timeout_s} s")


def elements(n):
    """x, its string and a vector: the saved elements have three components of three dtypes."""
    return tf.data.Dataset.range(n).map(
        lambda x: {"x": x, "s": tf.strings.as_string(x), "v": tf.fill([3], tf.cast(x, tf.float32))}
    )


@pytest.fixture
def ft_cluster(tmp_path):
    dispatcher = service.DispatchServer(
        service.DispatcherConfig(work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)
    )
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
        for _ in range(2)
    ]
    yield dispatcher
    for w in workers:
        w.stop()
    dispatcher.stop()


def test_saved_snapshots_load_in_tensorflow_alone(ft_cluster, tmp_path):
    expected = [x for x in range(1500) if x % 7]
    dataset = elements(1500).filter(lambda e: e["x"] % 7 != 0)
    paths = {}
    for compression in ("AUTO", "GZIP", None):
        paths[compression] = str(tmp_path / f"snapshot_{compression}")
        service.distributed_save(dataset, paths[compression], ft_cluster.target, compression=compression)
    for path in paths.values():
        wait_until_done(path)
    loaded = load_with_tensorflow(*paths.values())
    for compression, path in paths.items():
        assert loaded[path] == expected, compression
    with open(os.path.join(paths["AUTO"], "snapshot.metadata")) as f:
        assert 'compression: "SNAPPY"' in f.read()
    # Components keep their values and types.
    first = next(iter(tf.data.Dataset.load(paths[None]).filter(lambda e: e["x"] == 8)))
    assert first["s"].numpy() == b"8" and first["v"].numpy().tolist() == [8.0] * 3
    doc = ft_cluster._core.status()["snapshots"]
    assert {(d["state"], d["elements"]) for d in doc} == {("done", len(expected))}


def test_load_with_wait_reads_while_the_save_runs(ft_cluster, tmp_path):
    path = str(tmp_path / "snapshot")
    dataset = elements(600).apply(sleep(2000))
    service.distributed_save(dataset, path, ft_cluster.target)
    # Started before the first chunk is committed: wait=True reads chunks as they come, up to DONE.
    loaded = tf.data.Dataset.load(path, wait=True)
    assert not os.path.exists(os.path.join(path, "DONE"))
    assert sorted(int(e["x"]) for e in loaded.as_numpy_iterator()) == list(range(600))


def test_save_arguments_and_failures_are_reported(ft_cluster, tmp_path):
    target = ft_cluster.target
    with pytest.raises(ValueError, match="compression"):
        service.distributed_save(elements(3), str(tmp_path / "a"), target, compression="LZ4")
    with pytest.raises(ValueError, match="must not be empty"):
        service.distributed_save(elements(3), str(tmp_path / "a"), "")
    with pytest.raises(ValueError, match="must be a string"):
        service.distributed_save(elements(3), str(tmp_path / "a"), 5050)
    exists = tmp_path / "exists"
    exists.mkdir()
    with pytest.raises(tf.errors.AlreadyExistsError, match="exists already"):
        service.distributed_save(elements(3), str(exists), target)
    with pytest.raises(tf.errors.InvalidArgumentError, match="finite dataset"):
        service.distributed_save(elements(3).repeat(), str(tmp_path / "b"), target)
    with pytest.raises(tf.errors.InvalidArgumentError, match="repeats for ever"):
        service.distributed_save(elements(3).repeat().take(10), str(tmp_path / "b"), target)
    with pytest.raises(ValueError, match="cannot split the source op RandomDataset"):
        unsplittable = tf.data.Dataset.random(seed=1).take(5).map(lambda r: {"x": r})
        service.distributed_save(unsplittable, str(tmp_path / "c"), target)
    # A pipeline that fails: the snapshot ends with its ERROR, which Dataset.load raises.
    failing = str(tmp_path / "failing")

    def fail_from_50(e):
        with tf.control_dependencies([tf.debugging.assert_less(e["x"], tf.constant(50, tf.int64), "x too large")]):
            return {k: tf.identity(v) for k, v in e.items()}

    service.distributed_save(elements(100).map(fail_from_50), failing, target)
    wait_until_done(failing)
    error = load_with_tensorflow(failing)[failing]
    assert error.startswith("ValueError: Failed to load tf.data snapshot") and "x too large" in error
    assert not os.path.exists(os.path.join(failing, "DONE"))


def test_save_needs_a_fault_tolerant_dispatcher(cluster, tmp_path):
    with pytest.raises(tf.errors.InvalidArgumentError, match="fault tolerant mode"):
        service.distributed_save(elements(3), str(tmp_path / "s"), cluster.target)
    assert not (tmp_path / "s").exists()


def _dispatcher(work_dir, port=0):
    return ServerProcess(
        "--role=dispatcher",
        f"--port={port}",
        f"--work_dir={work_dir}",
        "--fault_tolerant_mode",
        "--worker_timeout_ms=1500",
        "--no-monitoring",
    )


def _start_cluster(work_dir, workers=2):
    dispatcher = _dispatcher(work_dir)
    # Side by side: most of a start is importing TensorFlow.
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        started = list(pool.map(_worker, [dispatcher.address] * workers))
    wait_for_workers(dispatcher.address, workers)
    return dispatcher, started


def _worker(address):
    return ServerProcess(
        "--role=worker", f"--dispatcher_address={address}", "--heartbeat_interval_ms=200", "--no-monitoring"
    )


def _committed(path):
    chunks = os.path.join(path, "chunks")
    return len(os.listdir(chunks)) if os.path.isdir(chunks) else 0


def _wait_for_writes(path, count, timeout_s=60.0):
    """Waits until `count` chunks are being written (a worker's file in each chunk's stream folder)."""
    deadline = time.monotonic() + timeout_s
    pattern = os.path.join(path, "streams", "*", "uncommitted_chunks", "*")
    while len({os.path.dirname(f) for f in glob.glob(pattern)}) < count:
        assert time.monotonic() < deadline, f"fewer than {count} chunks are being written at {path}"
        time.sleep(0.05)


# One chunk per worker (two) of 1,200 elements at 2 ms each: about 2.4 s a chunk.
SLOW = 2400


def test_a_killed_workers_chunk_is_redone_not_duplicated(tmp_path):
    dispatcher, workers = _start_cluster(tmp_path / "work")
    replacement = None
    try:
        path = str(tmp_path / "snapshot")
        service.distributed_save(elements(SLOW).apply(sleep(2000)), path, dispatcher.address)
        _wait_for_writes(path, 2)
        assert _committed(path) == 0
        workers[0].kill()  # SIGKILL: its chunk in progress is half-written
        replacement = _worker(dispatcher.address)
        wait_until_done(path)
        assert _committed(path) == 2
        loaded = load_here(path)
        assert collections.Counter(loaded) == collections.Counter(range(SLOW))
    finally:
        for p in [*workers, replacement, dispatcher]:
            if p is not None:
                p.kill()


def test_a_restarted_dispatcher_resumes_the_save(tmp_path):
    dispatcher, workers = _start_cluster(tmp_path / "work")
    restarted = None
    try:
        path = str(tmp_path / "snapshot")
        service.distributed_save(elements(SLOW).apply(sleep(2000)), path, dispatcher.address)
        _wait_for_writes(path, 2)
        dispatcher.kill()
        assert _committed(path) < 2
        restarted = _dispatcher(tmp_path / "work", port=dispatcher.port)
        wait_until_done(path)
        loaded = load_here(path)
        assert collections.Counter(loaded) == collections.Counter(range(SLOW))
        with pytest.raises(tf.errors.AlreadyExistsError):
            service.distributed_save(elements(3), path, restarted.address)
    finally:
        for p in [*workers, restarted, dispatcher]:
            if p is not None:
                p.kill()
