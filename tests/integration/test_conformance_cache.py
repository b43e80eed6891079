"""TensorFlow's cross-trainer cache scenarios (cross_trainer_cache_test.py), run against ours and
against TensorFlow's service, eagerly and in graph mode (conformance.py). Trainers reading one
named job with a CrossTrainerCache of their own share its elements through a sliding window on
each worker."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import pytest
import tensorflow as tf
from conformance import (
    MODES,
    SERVICES,
    cluster_pool,
    distribute_of,
    eager_only,
    from_dataset_id_of,
    plain,
    raises_at_read,
    read_dataset,
    register_dataset_of,
    unique_name,
)

import dataservice as service

pytestmark = pytest.mark.timeout(300)

INFINITE = lambda: tf.data.Dataset.range(10_000_000).repeat()  # noqa: E731
DEFAULT_CACHE_BYTES = 10 * 2**30  # TensorFlow's tests' workers


@pytest.fixture(scope="module")
def clusters():
    """(service, number of workers, cache bytes) -> a cluster shared by the module's scenarios."""
    with cluster_pool() as get:
        yield lambda which, num_workers=1, cache_bytes=DEFAULT_CACHE_BYTES: get(which, num_workers, cache_bytes)


@pytest.fixture(params=[(s, m) for s in SERVICES for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, clusters):
    """A scenario's reader: run.dataset(cluster, trainer, job_name, **kwargs) builds a distributed
    INFINITE (or `pipeline`) for one trainer; run.read(make, limit) reads what make() builds."""
    which, mode = request.param

    def dataset(cluster, trainer: str | None, job_name: str | None, pipeline=INFINITE, **kwargs) -> tf.data.Dataset:
        kwargs.setdefault("processing_mode", "parallel_epochs")
        cache = _cache_of(which)(trainer_id=trainer) if trainer is not None else None
        return pipeline().apply(
            distribute_of(which)(service=cluster.target, job_name=job_name, cross_trainer_cache=cache, **kwargs)
        )

    def read(make: Callable[[], tf.data.Dataset], limit: int | None = None) -> list:
        return read_dataset(make, mode, limit)

    run_ = type("Run", (), {})()
    run_.service, run_.mode = which, mode
    run_.cluster = lambda *args, **kwargs: clusters(which, *args, **kwargs)
    run_.dataset, run_.read = dataset, read
    return run_


def _cache_of(which: str):
    return service.CrossTrainerCache if which == "ours" else tf.data.experimental.service.CrossTrainerCache


def test_a_second_trainer_reads_the_cached_elements(run):
    """testEnableCrossTrainerCache and testDifferentJobNames: a second trainer of the job reads
    the same first 10 elements; a trainer of another job reads its own."""
    cluster, job = run.cluster(), unique_name(run, "job")
    for trainer, name in (("Trainer 1", job), ("Trainer 2", job), ("Trainer 3", job + "-2")):
        assert run.read(lambda t=trainer, n=name: run.dataset(cluster, t, n), 10) == list(range(10))


def test_from_dataset_id(run):
    """testFromDatasetId: two trainers reading a registered dataset by id share its elements."""
    cluster, job = run.cluster(), unique_name(run, "job")
    dataset_id = unique_name(run, "dataset_id")
    for trainer in ("Trainer 1", "Trainer 2"):

        def make(trainer: str = trainer) -> tf.data.Dataset:
            registered = register_dataset_of(run.service)(cluster.target, INFINITE(), dataset_id=dataset_id)
            return from_dataset_id_of(run.service)(
                processing_mode="parallel_epochs",
                service=cluster.target,
                dataset_id=registered,
                element_spec=INFINITE().element_spec,
                job_name=job,
                cross_trainer_cache=_cache_of(run.service)(trainer_id=trainer),
            )

        assert run.read(make, 10) == list(range(10))


def test_without_a_cache_or_with_one_trainer_id_readers_split_the_job(run):
    """testDisableCrossTrainerCacheByDefault and testSameTrainerID: the second reader of a job
    without a cache, or with the same trainer id, starts past what the first read."""
    cluster = run.cluster()
    for trainer in (None, "Trainer ID"):
        job = unique_name(run, "job")
        assert run.read(lambda t=trainer, j=job: run.dataset(cluster, t, j), 10) == list(range(10))
        assert run.read(lambda t=trainer, j=job: run.dataset(cluster, t, j), 10)[0] >= 10


def test_concurrent_readers(run):
    """testConcurrentReaders: 20 trainers reading in step (one outstanding request each) with a
    cache of a few elements each read element i at step i."""
    cluster = run.cluster(cache_bytes=(multiprocessing.cpu_count() + 8) * 423)
    job, num_readers, num_elements = unique_name(run, "job"), 20, 50

    def datasets() -> list[tf.data.Dataset]:
        return [run.dataset(cluster, f"Trainer {i}", job, max_outstanding_requests=1) for i in range(num_readers)]

    steps: list[list[int]] = []
    if run.mode == "eager":
        iterators = [iter(d) for d in datasets()]
        for _ in range(num_elements):
            steps.append([int(next(it)) for it in iterators])
    else:
        with tf.Graph().as_default():
            nexts = [tf.compat.v1.data.make_one_shot_iterator(d).get_next() for d in datasets()]
            with tf.compat.v1.Session() as session:
                for _ in range(num_elements):
                    steps.append([int(session.run(n)) for n in nexts])
    assert steps == [[i] * num_readers for i in range(num_elements)]


def test_a_slow_trainer_skips_data_and_a_small_cache_serves_many(run):
    """testSlowClientSkipsData and testSmallCache: with a 500-byte cache a late trainer starts
    past the beginning but still reads 200 elements, and so does each of 20 trainers in turn."""
    cluster, job = run.cluster(cache_bytes=500), unique_name(run, "job")
    assert run.read(lambda: run.dataset(cluster, "Trainer 1", job), 200) == list(range(200))
    late = run.read(lambda: run.dataset(cluster, "Trainer 2", job), 200)
    assert late[0] > 0 and len(late) == 200
    other_job = unique_name(run, "job")
    for i in range(20):
        assert len(run.read(lambda i=i: run.dataset(cluster, f"Trainer {i}", other_job), 200)) == 200


def test_shuffled_elements_are_shared(run):
    """testShuffleDataset: two trainers of a shuffled job read the same 10 elements."""
    cluster, job = run.cluster(), unique_name(run, "job")
    shuffled = lambda: INFINITE().shuffle(buffer_size=100)  # noqa: E731
    first = run.read(lambda: run.dataset(cluster, "Trainer 1", job, pipeline=shuffled), 10)
    assert run.read(lambda: run.dataset(cluster, "Trainer 2", job, pipeline=shuffled), 10) == first


def test_distributed_epoch_trainers_share_elements(run):
    """testDynamicSharding: two trainers of a distributed_epoch job over 2 workers read
    overlapping elements."""
    cluster, job = run.cluster(2), unique_name(run, "job")
    dynamic = service.ShardingPolicy.DYNAMIC if run.service == "ours" else "distributed_epoch"
    first = run.read(lambda: run.dataset(cluster, "Trainer 1", job, processing_mode=dynamic), 100)
    second = run.read(lambda: run.dataset(cluster, "Trainer 2", job, processing_mode=dynamic), 100)
    assert set(first) & set(second)


def test_no_compression(run):
    """testNoCompression: trainers reading without compression share the elements too."""
    cluster, job = run.cluster(), unique_name(run, "job")
    for trainer in ("Trainer 1", "Trainer 2"):
        assert run.read(lambda t=trainer: run.dataset(cluster, t, job, compression=None), 10) == list(range(10))


def test_compression_mismatch(run):
    """testCompressionMismatch: a trainer that asks for no compression from a job whose cache
    holds compressed elements. TensorFlow's client fails to decode them ("Data type mismatch");
    ours sends each client what it asked for (compression is per transfer, not per job), so the
    second read works."""
    cluster, job = run.cluster(), unique_name(run, "job")
    assert run.read(lambda: run.dataset(cluster, "Trainer 1", job), 10) == list(range(10))
    second = lambda: run.dataset(cluster, "Trainer 1", job, compression=None)  # noqa: E731
    if run.service == "tensorflow":
        with pytest.raises(tf.errors.InvalidArgumentError, match="Data type mismatch"):
            run.read(second)
        return
    got = run.read(second, 10)
    assert got == list(range(got[0], got[0] + 10)) and got[0] >= 10


def test_a_job_name_is_required(run):
    """testRequiresJobName: a cross-trainer cache without a job name is an InvalidArgumentError."""
    cluster = run.cluster()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Cross-trainer caching requires named jobs"):
        run.read(lambda: run.dataset(cluster, "Trainer 1", None))


@pytest.mark.parametrize("size", [0, 10])
def test_an_infinite_dataset_is_required(run, size):
    """testRequiresInfiniteDataset: range(0) and range(10) are InvalidArgumentErrors."""
    cluster = run.cluster()
    pipeline = lambda: tf.data.Dataset.range(size).map(lambda x: x + 1)  # noqa: E731
    message = "Cross-trainer caching requires the input dataset to be infinite"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        run.read(lambda: run.dataset(cluster, "Trainer ID", unique_name(run, "job_name"), pipeline=pipeline))


@eager_only
def test_one_dataset_iterated_again_is_refused_in_eager_mode(run):
    """testMultipleIterationsForOneDatasetEagerMode: each eager iteration of a cached dataset is a
    new repetition, which the cache cannot share: InvalidArgumentError."""
    cluster = run.cluster()
    dataset = run.dataset(cluster, "Trainer 1", unique_name(run, "job")).take(10)
    message = "Cross-trainer caching requires infinite datasets and disallows multiple repetitions"
    with raises_at_read(run.service, tf.errors.InvalidArgumentError, message):
        for _ in range(3):
            [plain(e) for e in dataset]


@pytest.mark.parametrize("run", [(s, "graph") for s in SERVICES], indirect=True, ids=lambda p: f"{p[0]}-{p[1]}")
def test_one_dataset_read_three_times_in_a_graph(run):
    """testMultipleIterationsForOneDatasetGraphMode: three iterators of one cached dataset in a
    graph are, for TensorFlow's, three readers of the job's first repetition (30 distinct
    elements between them), and a second trainer then reuses some of them. Ours counts each
    iterator of a dataset as the job's next pass in graph mode as in eager mode, so the second
    iterator is refused as in eager mode (README, "Compatibility")."""
    cluster, job = run.cluster(), unique_name(run, "job")

    def three_reads(trainer: str) -> list:
        with tf.Graph().as_default():
            dataset = run.dataset(cluster, trainer, job).take(10)
            got = []
            with tf.compat.v1.Session() as session:
                for _ in range(3):
                    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
                    session.run(iterator.initializer)
                    nxt = iterator.get_next()
                    try:
                        while True:
                            got.append(int(session.run(nxt)))
                    except tf.errors.OutOfRangeError:
                        pass
        return got

    if run.service == "ours":
        message = "Cross-trainer caching requires infinite datasets and disallows multiple repetitions"
        with raises_at_read(run.service, tf.errors.InvalidArgumentError, message):
            three_reads("Trainer 1")
        return
    first = three_reads("Trainer 1")
    assert len(set(first)) == 30
    assert set(first) & set(three_reads("Trainer 2"))


def test_coordinated_reads_are_refused(run):
    """testDisallowCoordinatedRead: InvalidArgumentError."""
    cluster = run.cluster()
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="Cross-trainer caching does not support coordinated reads"
    ):
        run.read(lambda: run.dataset(cluster, "Trainer 1", unique_name(run, "job"), num_consumers=1, consumer_index=0))


def test_a_named_job_with_and_without_the_cache(run):
    """testNamedJobMismatch: a job made with the cache, asked for without it: InvalidArgumentError."""
    cluster, job = run.cluster(), unique_name(run, "job")
    assert run.read(lambda: run.dataset(cluster, "Trainer 1", job), 10) == list(range(10))
    if run.service == "tensorflow":
        expected = pytest.raises(
            tf.errors.InvalidArgumentError, match="Existing cross-trainer cache: <enabled>; got <disabled>"
        )
    else:
        expected = raises_at_read(
            run.service, tf.errors.InvalidArgumentError, "cross-trainer cache enabled vs disabled"
        )
    with expected:
        run.read(lambda: run.dataset(cluster, None, job))


def test_a_trainer_id_is_required(run):
    """testRequiresNonEmptyTrainerID: a cache without a trainer id is a ValueError."""
    cluster = run.cluster(2)
    with pytest.raises(ValueError, match="non-empty trainer ID"):
        cache = _cache_of(run.service)(trainer_id=None)
        INFINITE().apply(
            distribute_of(run.service)(
                processing_mode="parallel_epochs", service=cluster.target, job_name="job", cross_trainer_cache=cache
            )
        )
