"""Service iterators in tf.train.Checkpoint: saved, restored in the same process or (SIGKILLed
trainer) in a new one, continuing where the checkpoint was taken."""

import collections
import gc
import os
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import REPO_ROOT, in_process_cluster

import dataservice as service

pytestmark = pytest.mark.timeout(300)


def _read(iterator, count=None) -> list:
    out = []
    for element in iterator:
        out.append(int(element))
        if count is not None and len(out) == count:
            break
    return out


def _pipeline(n: int) -> tf.data.Dataset:
    """Deterministic given its input: a seeded shuffle and a deterministic interleave."""
    return (
        tf.data.Dataset.range(n)
        .shuffle(64, seed=3)
        .interleave(lambda x: tf.data.Dataset.from_tensors(x).repeat(1), cycle_length=4, deterministic=True)
        .map(lambda x: x * 10)
    )


def test_distributed_epoch_save_and_restore_gives_each_element_once(cluster2, tmp_path):
    ds = _pipeline(5000).apply(service.distribute("distributed_epoch", cluster2.target))
    iterator = iter(ds)
    before = _read(iterator, 1500)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    lost = _read(iterator, 700)  # read after the save: they must come again after the restore
    checkpoint.restore(path)
    after = _read(iterator)
    assert sorted(before + after) == [10 * i for i in range(5000)]
    assert set(lost) <= set(after)


def test_parallel_epochs_restore_yields_exactly_the_rest_in_order(cluster, tmp_path):
    ds = tf.data.Dataset.range(2000).map(lambda x: x + 1).apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(ds)
    assert _read(iterator, 777) == list(range(1, 778))
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _read(iterator, 300)
    checkpoint.restore(path)
    assert _read(iterator) == list(range(778, 2001))


def test_repeat_after_distribute_resumes_in_the_saved_epoch(cluster2, tmp_path):
    epochs, n = 3, 400
    ds = _pipeline(n).apply(service.distribute("distributed_epoch", cluster2.target)).repeat(epochs)
    iterator = iter(ds)
    before = _read(iterator, 620)  # in the second epoch
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _read(iterator, 100)
    checkpoint.restore(path)
    seen = before + _read(iterator)
    assert len(seen) == epochs * n
    for epoch in range(epochs):
        assert sorted(seen[epoch * n : (epoch + 1) * n]) == [10 * i for i in range(n)], f"epoch {epoch}"


def test_a_checkpoint_taken_at_the_end_restores_an_ended_iterator_without_a_new_iteration(tmp_path):
    cluster = in_process_cluster(1)
    try:
        ds = tf.data.Dataset.range(300).apply(service.distribute("parallel_epochs", cluster.target))
        iterator = iter(ds)
        assert _read(iterator) == list(range(300))
        with pytest.raises(StopIteration):
            next(iterator)
        path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
        iterations = cluster.dispatcher.state_summary()["iterations"]
        restored = iter(ds)
        tf.train.Checkpoint(iterator=restored).restore(path)
        with pytest.raises(StopIteration):
            next(restored)
        # Neither a second call past the end nor the restored iterator resumed a reader.
        assert cluster.dispatcher.state_summary()["iterations"] == iterations
    finally:
        cluster.stop()


def test_from_dataset_id_iterators_save_and_restore(cluster2, tmp_path):
    dataset_id = service.register_dataset(cluster2.target, _pipeline(800))
    ds = service.from_dataset_id("distributed_epoch", cluster2.target, dataset_id)
    iterator = iter(ds)
    before = _read(iterator, 300)
    path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    _read(iterator, 100)
    restored = iter(service.from_dataset_id("distributed_epoch", cluster2.target, dataset_id))
    tf.train.Checkpoint(iterator=restored).restore(path)
    assert sorted(before + _read(restored)) == [10 * i for i in range(800)]


def test_saved_before_the_first_element_restores_the_whole_epoch(cluster2, tmp_path):
    ds = tf.data.Dataset.range(300).apply(service.distribute("distributed_epoch", cluster2.target))
    iterator = iter(ds)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _read(iterator, 50)
    checkpoint.restore(path)
    assert sorted(_read(iterator)) == list(range(300))


def test_large_elements_resume_one_at_a_time(cluster2, tmp_path):
    # 512 KiB elements go to tf.data one a call, not in stacked chunks.
    ds = (
        tf.data.Dataset.range(60)
        .map(lambda i: tf.fill([128 * 1024], tf.cast(i, tf.float32)))
        .apply(service.distribute("distributed_epoch", cluster2.target))
    )
    iterator = iter(ds)
    before = [int(x[0]) for x in _elements(iterator, 25)]
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _elements(iterator, 10)
    checkpoint.restore(path)
    after = [int(x[0]) for x in _elements(iterator)]
    assert sorted(before + after) == list(range(60))


def _elements(iterator, count=None) -> list:
    out = []
    for element in iterator:
        out.append(element.numpy())
        if count is not None and len(out) == count:
            break
    return out


def test_ragged_elements_resume(cluster2, tmp_path):
    ds = (
        tf.data.Dataset.range(200)
        .map(lambda i: tf.RaggedTensor.from_row_lengths(tf.range(i % 5 + 1), [i % 5 + 1]))
        .apply(service.distribute("parallel_epochs", cluster2.target))
    )
    iterator = iter(ds)
    before = [e.flat_values.numpy().tolist() for e in _take(iterator, 150)]
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _take(iterator, 30)
    checkpoint.restore(path)
    after = [e.flat_values.numpy().tolist() for e in _take(iterator)]
    counts = collections.Counter(tuple(x) for x in before + after)
    assert counts == {tuple(range(k + 1)): 80 for k in range(5)}  # 2 workers x 40 each


def _take(iterator, count=None) -> list:
    out = []
    for element in iterator:
        out.append(element)
        if count is not None and len(out) == count:
            break
    return out


def test_checkpoint_is_small_whatever_was_read(cluster2, tmp_path):
    ds = tf.data.Dataset.range(200_000).apply(service.distribute("distributed_epoch", cluster2.target))
    iterator = iter(ds)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    sizes, seconds = [], []
    for read in (1000, 50_000, 100_000):
        _read(iterator, read)
        started = time.perf_counter()
        path = checkpoint.save(str(tmp_path / f"after-{read}"))
        seconds.append(time.perf_counter() - started)
        sizes.append(sum(os.path.getsize(p) for p in tf.io.gfile.glob(path + "*")))
    print(f"checkpoint bytes {sizes}, save seconds {[round(s, 4) for s in seconds]}")
    # Per-task progress and the rest of the current chunk (at most 1,024 int64s here), not the
    # 800 KB of elements read.
    assert max(sizes) < 24 * 1024


def test_restore_into_another_pipeline_is_an_error_naming_the_mismatch(cluster, tmp_path):
    saved = iter(tf.data.Dataset.range(100).apply(service.distribute("parallel_epochs", cluster.target)))
    _read(saved, 10)
    path = tf.train.Checkpoint(iterator=saved).save(str(tmp_path / "ckpt"))
    other = iter(tf.data.Dataset.range(1, 101).apply(service.distribute("parallel_epochs", cluster.target)))
    tf.train.Checkpoint(iterator=other).restore(path)
    # (What the checkpoint holds of the current chunk comes first: the error comes at the first fetch.)
    with pytest.raises(tf.errors.OpError, match="FailedPreconditionError.*cannot restore the iterator into a differ"):
        _read(other)


def _range_100(cluster):
    return iter(tf.data.Dataset.range(100).apply(service.distribute("parallel_epochs", cluster.target)))


def _restored(cluster, path: str):
    """A new iterator of _range_100's pipeline, restored from the checkpoint at `path`."""
    iterator = _range_100(cluster)
    tf.train.Checkpoint(iterator=iterator).restore(path)
    return iterator


def test_restore_after_the_dispatcher_forgot_the_job_is_an_error(tmp_path):
    cluster = in_process_cluster(1)
    try:
        iterator = _range_100(cluster)
        _read(iterator, 10)
        path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
        cluster.restart_dispatcher()  # not fault tolerant: it forgets every job
        restored = _restored(cluster, path)
        with pytest.raises(tf.errors.OpError, match="NotFoundError.*restarted without fault_tolerant_mode"):
            _read(restored)
    finally:
        cluster.stop()


def test_restore_after_retention_dropped_the_iteration_is_an_error_naming_it(tmp_path):
    """A checkpoint resumes while its iteration is retained, and is NotFoundError naming
    iteration_retention_ms once the ended iteration has been dropped (with its job)."""
    cluster = in_process_cluster(1, iteration_retention_ms=1_000, job_gc_check_interval_ms=100)
    try:
        iterator = _range_100(cluster)
        _read(iterator, 10)
        path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
        restored = _restored(cluster, path)
        assert _read(restored) == list(range(10, 100))
        del iterator, restored  # their clients release the iterations, which end

        deadline = time.monotonic() + 30
        while cluster.dispatcher.state_summary()["jobs"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.dispatcher.state_summary()["jobs"] == 0, "the ended iterations were not dropped"
        assert cluster.dispatcher.status()["jobs"] == []
        late = _restored(cluster, path)
        with pytest.raises(tf.errors.OpError, match="NotFoundError.*dropped after iteration_retention_ms"):
            _read(late)
    finally:
        cluster.stop()


def test_tf_distribute_per_replica_batches_save_and_restore(cluster2, tmp_path):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = tf.data.Dataset.range(500).apply(service.distribute("distributed_epoch", cluster2.target)).batch(16)
    iterator = service.distributed_iterator(strategy, ds)

    @tf.function
    def step(per_replica):
        # Each replica gets its half of the global batch.
        return strategy.run(lambda x: x + 0, args=(per_replica,))

    def take(steps=None) -> list:
        out = []
        for i, per_replica in enumerate(iterator):
            parts = strategy.experimental_local_results(step(per_replica))
            assert abs(len(parts[0]) - len(parts[1])) <= 1
            out += [int(x) for part in parts for x in part]
            if steps is not None and i + 1 == steps:
                break
        return out

    before = take(10)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    take(5)
    checkpoint.restore(path)
    assert sorted(before + take()) == list(range(500))


def _resume_example(*flags: str) -> str:
    """Runs examples/resume_training.py (cluster processes, a trainer process SIGKILLed after a
    checkpoint, resumed in a new process) with small sizes; returns its output."""
    command = [
        sys.executable,
        os.path.join(REPO_ROOT, "examples", "resume_training.py"),
        "--examples=1200",
        "--epochs=2",
        "--batch=20",
        "--checkpoint_every=10",
        "--kill_after_step=70",  # in the second epoch for distributed_epoch, the first for parallel_epochs
        *flags,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "trainer SIGKILLed after its checkpoint at step 70" in result.stdout
    assert "trainer: restored step " in result.stdout
    return result.stdout


def test_killed_trainer_resumes_parallel_epochs_streams():
    out = _resume_example("--mode=parallel_epochs")
    assert "epoch 0: each of 1200 examples seen 2x" in out and "epoch 1: each of 1200 examples seen 2x" in out
    assert "epoch 0: each worker's stream in order" in out and "epoch 1: each worker's stream in order" in out


def test_killed_trainer_resumes_after_dispatcher_restart_and_new_workers():
    out = _resume_example("--mode=distributed_epoch", "--restart_dispatcher", "--replace_workers")
    # (The same run without the restart resumes through the same ResumeIteration path: the
    # numpy reader's SIGKILL test and the in-process tests above take it.)
    assert "dispatcher restarted" in out and "workers replaced" in out
    assert "epoch 0: each of 1200 examples seen 1x" in out and "epoch 1: each of 1200 examples seen 1x" in out
    assert "every example seen once per epoch" in out


def test_a_restored_iterator_releases_its_reader_when_dropped(tmp_path):
    cluster = in_process_cluster(1)
    try:
        ds = tf.data.Dataset.range(10**9).apply(service.distribute("parallel_epochs", cluster.target))
        iterator = iter(ds)
        _read(iterator, 2000)
        path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
        del iterator
        gc.collect()  # (an iterator in a reference cycle goes only when collected)
        restored = iter(ds)
        tf.train.Checkpoint(iterator=restored).restore(path)
        assert _read(restored, 3000)[-1] == 4999
        assert cluster.dispatcher.state_summary()["iteration_clients"] == 1
        del restored
        deadline = time.monotonic() + 20
        while cluster.dispatcher.state_summary()["iteration_clients"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.dispatcher.state_summary()["iteration_clients"] == 0, "the restored reader was not released"
    finally:
        cluster.stop()


def test_an_iterator_restored_while_the_saved_one_lives_reads_on_its_own(tmp_path):
    # The restored iterator brings the saved one's token: it must not take over (nor, when the
    # saved one goes, lose) the saved one's reader. A CI run saw the dispatcher release the
    # restored reader's client when the saved iterator was collected after the restore.
    cluster = in_process_cluster(1)
    try:
        ds = tf.data.Dataset.range(10**9).apply(service.distribute("parallel_epochs", cluster.target))
        saved = iter(ds)
        assert _read(saved, 2000)[-1] == 1999
        path = tf.train.Checkpoint(iterator=saved).save(str(tmp_path / "ckpt"))
        restored = iter(ds)
        tf.train.Checkpoint(iterator=restored).restore(path)
        # Far past the chunk the checkpoint holds: both have fetched again.
        assert _read(restored, 20000) == list(range(2000, 22000))
        assert _read(saved, 20000) == list(range(2000, 22000)), "the saved iterator reads on from where it was"
        assert cluster.dispatcher.state_summary()["iteration_clients"] == 2
        # When TensorFlow lets the saved iterator go is its affair (in this module, not before the
        # test ends): whenever it does, the restored reader is not closed with it.
        del saved
        gc.collect()
        assert _read(restored, 5000) == list(range(22000, 27000)), "the restored one lost nothing"
        assert cluster.dispatcher.state_summary()["iteration_clients"] >= 1
    finally:
        cluster.stop()
