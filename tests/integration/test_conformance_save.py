"""TensorFlow's distributed_save scenarios (distributed_save_test.py, distributed_save_load_test.py,
and the dispatcher restarts of distributed_save_ft_test.py), run against ours and against
TensorFlow's service, eagerly and in graph mode (conformance.py): the save called, and the saved
dataset loaded, in a tf.Graph run by a Session. Either service writes the directory; TensorFlow's
own `Dataset.load` reads it (after the save is done, or with `wait=True` while it runs), so these
scenarios also check that ours writes TensorFlow's snapshot format."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf
from conformance import (
    MODES,
    SERVICES,
    TensorFlowService,
    cluster_pool,
    distribute_of,
    eager_only,
    read_dataset,
    same_items,
    tensorflow_service_on_demand,
)

import dataservice as service
from dataservice.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

SAVE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def clusters():
    """(service, number of workers) -> a fault-tolerant cluster shared by the module's scenarios
    (each saves to a directory of its own)."""
    with cluster_pool() as get:
        yield lambda which, num_workers=1: get(which, num_workers, fault_tolerant=True)


def _save_of(which: str):
    return service.distributed_save if which == "ours" else tf.data.experimental.distributed_save


class Run:
    """One service in one mode: save(), load(), wait_until_saved()."""

    def __init__(self, which: str, mode: str, clusters, directory):
        self.service, self.mode = which, mode
        self._clusters = clusters
        self._directory = directory

    def cluster(self, num_workers: int = 1):
        return self._clusters(self.service, num_workers)

    def path(self, name: str = "snapshot") -> str:
        return str(self._directory / name)

    def save(self, make: Callable[[], tf.data.Dataset], path: str, num_workers: int = 1, **kwargs) -> None:
        """Starts saving what make() builds, as TensorFlow's tests do: in graph mode, the op
        distributed_save returns run by a Session."""
        address = self.cluster(num_workers).address
        save = _save_of(self.service)
        if self.mode == "eager":
            save(make(), path, address, **kwargs)
            return
        with tf.Graph().as_default():
            operation = save(make(), path, address, **kwargs)
            with tf.compat.v1.Session() as session:
                session.run(operation)

    def load(self, path: str, limit: int | None = None, **kwargs) -> list:
        return read_dataset(lambda: tf.data.Dataset.load(path, **kwargs), self.mode, limit)

    def wait_until_saved(self, path: str) -> bool:
        """Waits for the save's end; whether it ended well (DONE), not with an ERROR file."""
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(path, "DONE")):
                return True
            if os.path.exists(os.path.join(path, "ERROR")):
                return False
            time.sleep(0.05)
        raise TimeoutError(f"{self.service}'s save to {path} did not end within {SAVE_TIMEOUT_S} s")

    def saved(self, make: Callable[[], tf.data.Dataset], num_workers: int = 1, name: str = "snapshot", **kwargs):
        """Saves what make() builds, waits for the save's end and loads it: the elements."""
        path = self.path(name)
        self.save(make, path, num_workers, **kwargs)
        assert self.wait_until_saved(path), open(os.path.join(path, "ERROR")).read()
        return self.load(path)


@pytest.fixture(params=[(s, m) for s in SERVICES for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, clusters, tmp_path):
    which, mode = request.param
    return Run(which, mode, clusters, tmp_path)


# ---- distributed_save_test.py and distributed_save_load_test.py: what is saved is what loads ----


@pytest.mark.parametrize(
    "num_workers, num_elements, repetitions, compression",
    # (TensorFlow's tests run every combination; these three cover each value of each.)
    [(1, 0, 1, None), (1, 10, 3, "GZIP"), (3, 10000, 1, "AUTO")],
)
def test_save_load(run, num_workers, num_elements, repetitions, compression):
    """testSaveLoad, testCompression, test_save_load: range(n).repeat(k) on 1 or 3 workers with each
    compression, loaded while the save runs (wait=True) and after it is done; in order when one
    worker wrote one pass of ten elements (one chunk: the load interleaves chunks)."""
    path = run.path()
    run.save(
        lambda: tf.data.Dataset.range(num_elements).repeat(repetitions), path, num_workers, compression=compression
    )
    expected = list(range(num_elements)) * repetitions
    same_items(run.load(path, wait=True), expected)
    assert run.wait_until_saved(path)
    loaded = run.load(path)
    if num_workers == 1 and num_elements <= 10 and repetitions == 1:
        assert loaded == expected
    else:
        same_items(loaded, expected)


@pytest.mark.parametrize("num_workers, repetitions", [(3, 5)])
def test_repeated_dataset(run, num_workers, repetitions):
    """testRepeatedDataset: range(1000).repeat(k) saved by 1 or 3 workers: every repetition."""
    same_items(
        run.saved(lambda: tf.data.Dataset.range(1000).repeat(repetitions), num_workers), list(range(1000)) * repetitions
    )


@pytest.mark.parametrize("repeated", [False, True], ids=["slices", "repeated-tensors"])
def test_choose_from_datasets(run, repeated):
    """testChooseFromDatasets, testChooseFromRepeatedDatasets: three 5-element sources chosen in
    turn by range(3).repeat(), the choices ending with the sources: a b c five times, in order."""

    def make():
        if repeated:
            sources = [tf.data.Dataset.from_tensors(c).repeat(5) for c in "abc"]
        else:
            sources = [tf.data.Dataset.from_tensor_slices([c] * 5) for c in "abc"]
        return tf.data.Dataset.choose_from_datasets(sources, tf.data.Dataset.range(3).repeat())

    loaded = run.saved(make)
    same_items(loaded, [b"a", b"b", b"c"] * 5)
    if run.service == "ours":
        # In the order TensorFlow's test expects; TensorFlow's 2.21 service loads another order
        # (README, "Compatibility").
        assert loaded == [b"a", b"b", b"c"] * 5


@pytest.mark.parametrize("num_workers", [3])
def test_write_multiple_datasets(run, num_workers):
    """testWriteMultipleDatasets: two saves at once to two directories, each loads its own."""

    def chosen():
        sources = [tf.data.Dataset.from_tensors(c).repeat(5) for c in "abc"]
        return tf.data.Dataset.choose_from_datasets(sources, tf.data.Dataset.range(3).repeat())

    first, second = run.path("first"), run.path("second")
    run.save(lambda: tf.data.Dataset.range(100), first, num_workers)
    run.save(chosen, second, num_workers)
    assert run.wait_until_saved(first) and run.wait_until_saved(second)
    same_items(run.load(first), list(range(100)))
    same_items(run.load(second), [b"a", b"b", b"c"] * 5)


def test_load_with_a_reader_func_over_copied_chunks(run):
    """testLoadWithCustomReaderFunc: the chunk files copied twice over in the snapshot's chunks
    directory, loaded with a reader_func that shuffles and interleaves them: three copies."""
    path = run.path()
    run.save(lambda: tf.data.Dataset.range(10), path)
    assert run.wait_until_saved(path)
    chunks = os.path.join(path, "chunks")
    files = os.listdir(chunks)
    for copy in range(2):
        for name in files:
            shutil.copy(os.path.join(chunks, name), os.path.join(chunks, f"{name}_{copy}"))

    def reader_func(datasets):
        return datasets.shuffle(3).interleave(lambda x: x, num_parallel_calls=tf.data.AUTOTUNE)

    same_items(run.load(path, reader_func=reader_func), list(range(10)) * 3)


def test_imbalanced_zip_and_repeat(run):
    """testImbalancedZipAndRepeat: zip(range(200), range(1000)).repeat(3): the shorter ends each
    repetition, 600 pairs."""
    loaded = run.saved(lambda: tf.data.Dataset.zip((tf.data.Dataset.range(200), tf.data.Dataset.range(1000))).repeat(3))
    same_items(loaded, [(i, i) for i in range(200)] * 3)


@pytest.mark.parametrize("num_workers", [3])
def test_save_before_and_after_sample(run, num_workers):
    """test_save_before_sample, test_save_after_sample: three saved range(10)s loaded and sampled
    together; sample_from_datasets of three range(10).repeat(3)s saved and loaded."""
    paths = [run.path(f"dataset_{i}") for i in range(3)]
    for path in paths:
        run.save(lambda: tf.data.Dataset.range(10), path, num_workers)

    def sampled():
        loaded = [tf.data.Dataset.load(path, wait=True) for path in paths]
        return tf.data.Dataset.sample_from_datasets(loaded, weights=[1.0] * 3, stop_on_empty_dataset=False)

    same_items(read_dataset(sampled, run.mode), list(range(10)) * 3)
    after = run.saved(
        lambda: tf.data.Dataset.sample_from_datasets(
            [tf.data.Dataset.range(10).repeat(3) for _ in range(3)], weights=[1.0] * 3, stop_on_empty_dataset=False
        ),
        num_workers,
        name="after",
    )
    same_items(after, list(range(10)) * 9)


@pytest.mark.parametrize("num_workers", [1])
def test_enumerate(run, num_workers):
    """test_enumerate: ["a", "b", "c"].repeat(3).enumerate(): every letter three times; with one
    worker the indexes 0-8 too (several workers each count their own)."""
    loaded = run.saved(lambda: tf.data.Dataset.from_tensor_slices(["a", "b", "c"]).repeat(3).enumerate(), num_workers)
    same_items([letter for _, letter in loaded], [b"a", b"b", b"c"] * 3)
    if num_workers == 1:
        assert sorted(index for index, _ in loaded) == list(range(9))


@pytest.mark.parametrize("num_workers", [1, 3])
def test_a_batched_dataset_keeps_its_batches(run, num_workers):
    """(Not in TensorFlow's tests; what its streams do.) range(100).batch(10): each worker's share
    runs through one pipeline, so batches are full but for the last of each worker's share; with
    one worker, the ten batches of ten (the load interleaves a stream's chunks: in some order)."""
    loaded = run.saved(lambda: tf.data.Dataset.range(100).batch(10), num_workers)
    same_items([x for batch in loaded for x in batch], list(range(100)))
    assert sum(len(batch) < 10 for batch in loaded) <= num_workers
    if num_workers == 1:
        assert sorted(loaded) == [tuple(range(b, b + 10)) for b in range(0, 100, 10)]


@pytest.mark.parametrize("num_workers", [1])
def test_load_started_before_the_save(run, num_workers):
    """test_concurrent_save_load: a load with wait=True started before the save begins reads the
    whole dataset once the save runs."""
    path = run.path()
    loaded: list = []
    failures: list[BaseException] = []

    def load() -> None:
        try:
            loaded.extend(run.load(path, wait=True))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    reader = threading.Thread(target=load)
    reader.start()
    time.sleep(1.0)
    run.save(lambda: tf.data.Dataset.range(10), path, num_workers)
    reader.join(SAVE_TIMEOUT_S)
    assert not reader.is_alive() and not failures, failures
    same_items(loaded, list(range(10)))


@pytest.mark.parametrize(
    "num_workers, sharding_policy, repeated_load",
    [(3, "OFF", 5), (1, "DYNAMIC", 1)],
)
def test_distributed_load(run, num_workers, sharding_policy, repeated_load):
    """testDistributedLoad, test_distributed_load: a saved range(10), loaded (repeated), read
    through the service that saved it: every worker's copy with OFF, one with DYNAMIC. Ours
    refuses: its dataset policy serves no pipeline that reads saved datasets (PermissionDenied;
    allow_unsafe_ops lifts it), and distributed_epoch cannot split a loaded snapshot (a ValueError
    at distribute(), as for any source it cannot split). README, "Compatibility"."""
    path = run.path()
    run.save(lambda: tf.data.Dataset.range(10), path, num_workers)
    assert run.wait_until_saved(path)
    cluster = run.cluster(num_workers)
    # TensorFlow's enum for both, as its test passes it (ours takes TensorFlow's by name).
    policy = getattr(tf.data.experimental.service.ShardingPolicy, sharding_policy)

    def make():
        loaded = tf.data.Dataset.load(path)
        if repeated_load > 1:
            loaded = loaded.repeat(repeated_load)
        return loaded.apply(distribute_of(run.service)(processing_mode=policy, service=cluster.target))

    if run.service == "ours":
        refusal = (
            pytest.raises(tf.errors.PermissionDeniedError, match="reads saved datasets or checkpoints")
            if sharding_policy == "OFF"
            else pytest.raises(ValueError, match="cannot split the source op ListSnapshotChunksDataset")
        )
        with refusal:
            read_dataset(make, run.mode)
        return
    expected = list(range(10)) * repeated_load * (num_workers if sharding_policy == "OFF" else 1)
    same_items(read_dataset(make, run.mode), expected)


@eager_only
@pytest.mark.parametrize("wait", [False, True], ids=["after-done", "while-saving"])
def test_load_checkpoint(run, wait):
    """testLoadCheckpoint, test_save_load_checkpoint: an iterator of the loaded range(10)
    checkpointed after 4 elements and restored reads the other 6."""
    path = run.path()
    run.save(lambda: tf.data.Dataset.range(10), path)
    if not wait:
        assert run.wait_until_saved(path)
    dataset = tf.data.Dataset.load(path, wait=wait)
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(4)]
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    saved_at = checkpoint.save(run.path("checkpoint/ckpt"))
    restored = iter(tf.data.Dataset.load(path, wait=wait))
    tf.train.Checkpoint(iterator=restored).restore(saved_at)
    same_items(first + [int(x) for x in restored], list(range(10)))


# ---- distributed_save_test.py and distributed_save_load_test.py: failures ----------------------


def test_load_of_a_snapshot_that_does_not_exist(run):
    """testSnapshotDoesNotExist: loading a directory no save wrote, read through the service: NotFoundError."""
    cluster = run.cluster()
    with pytest.raises(tf.errors.NotFoundError):
        read_dataset(
            lambda: tf.data.Dataset.load(run.path("missing")).apply(
                distribute_of(run.service)(processing_mode="parallel_epochs", service=cluster.target)
            ),
            run.mode,
        )


def test_duplicate_save(run):
    """testDuplicateSnapshot: a second save to the same directory: AlreadyExistsError."""
    path = run.path()
    run.save(lambda: tf.data.Dataset.range(10), path)
    with pytest.raises(tf.errors.AlreadyExistsError, match="already started or completed"):
        run.save(lambda: tf.data.Dataset.range(10), path)
    assert run.wait_until_saved(path)


def test_a_pipeline_error_fails_the_save(run):
    """testWorkerFailure, test_worker_failure: check_numerics on a NaN fails the save (an ERROR
    file); a load after it says so (ValueError), a load while saving fails with the pipeline's
    InvalidArgumentError."""

    def make():
        values = tf.data.Dataset.from_tensor_slices(np.array([1.0, 2.0, 3.0, np.nan, 5.0], np.float32))
        return values.map(lambda x: tf.debugging.check_numerics(x, "message"))

    path = run.path()
    run.save(make, path)
    with pytest.raises(tf.errors.InvalidArgumentError):
        run.load(path, wait=True)
    assert not run.wait_until_saved(path)
    with pytest.raises(ValueError, match="The save job failed to write it"):
        run.load(path)


@eager_only
def test_bad_dispatcher_addresses(run):
    """testBadDispatcherAddress: a service address that is not a string, or empty: ValueError."""
    save = _save_of(run.service)
    with pytest.raises(ValueError, match="must be a string"):
        save(tf.data.Dataset.range(10), run.path(), 1)
    with pytest.raises(ValueError, match="must not be empty"):
        save(tf.data.Dataset.range(10), run.path(), "")


def test_an_infinite_dataset_is_refused(run):
    """testBadCardinality: range(10).repeat(): InvalidArgumentError, nothing saved."""
    with pytest.raises(tf.errors.InvalidArgumentError, match="Saving an infinite dataset is not allowed"):
        run.save(lambda: tf.data.Dataset.range(10).repeat(), run.path())


@eager_only
def test_load_with_a_wrong_element_spec_or_compression(run):
    """testBadElementSpec, testBadCompression: TensorFlow's load checks what it is told against
    the snapshot's metadata: both are ValueErrors naming the actual value."""
    path = run.path()
    run.save(lambda: tf.data.Dataset.range(10), path, compression="AUTO")
    assert run.wait_until_saved(path)
    with pytest.raises(ValueError, match="User specified element_spec bad_element_spec, but the actual element_spec"):
        tf.data.Dataset.load(path, element_spec="bad_element_spec")
    with pytest.raises(ValueError, match="User specified compression ZLIB, but the actual compression is SNAPPY"):
        tf.data.Dataset.load(path, compression="ZLIB")


# ---- distributed_save_ft_test.py: a dispatcher restarted during a save --------------------------


class _RestartableCluster:
    """A fault-tolerant cluster of the scenario's own (it is restarted)."""

    def __init__(self, which: str, num_workers: int, tensorflow: Callable[[], TensorFlowService]):
        if which == "ours":
            self._ours = LocalCluster(
                num_workers, processes=False, fault_tolerant_mode=True, worker_options={"heartbeat_interval_ms": 200}
            )
            self.address, self.restart_dispatcher = self._ours.address, self._ours.restart_dispatcher
        else:
            self._ours = None
            theirs = tensorflow().cluster(num_workers, fault_tolerant=True)
            self.address, self.restart_dispatcher = theirs.address, theirs.restart_dispatcher

    def stop(self) -> None:
        if self._ours is not None:
            self._ours.stop()


@pytest.fixture(scope="module")
def tensorflow_service():
    with tensorflow_service_on_demand() as get:
        yield get


@pytest.mark.parametrize("which", SERVICES)
def test_a_restarted_dispatcher_finishes_the_save_and_refuses_it_again(which, tensorflow_service, tmp_path):
    """testSnapshotRecoverySucceeds, testSnapshotRecoveryBlocksOverwrite,
    testLargeMultiSourceSnapshotRecoversAndCompletes: the dispatcher restarted while three
    workers save zip of three range(1000)s; the save ends with every value of each source once,
    and a second save to the directory is AlreadyExistsError. Ours keeps the zip's tuples
    whole; TensorFlow's (2.21) paired values of different sources after the restart ((7, 7, 8)),
    which its test, checking only that the save ends, does not see."""
    cluster = _RestartableCluster(which, 3, tensorflow_service)
    try:
        run = Run(which, "eager", lambda _which, _n: cluster, tmp_path)
        path = run.path()
        make = lambda: tf.data.Dataset.zip((tf.data.Dataset.range(1000),) * 3)  # noqa: E731
        run.save(make, path)
        cluster.restart_dispatcher()
        with pytest.raises(tf.errors.AlreadyExistsError, match="already started or completed"):
            run.save(make, path)
        assert run.wait_until_saved(path)
        loaded = run.load(path)
        for source in range(3):
            same_items([element[source] for element in loaded], list(range(1000)))
        if which == "ours":
            same_items(loaded, [(i, i, i) for i in range(1000)])
    finally:
        cluster.stop()
