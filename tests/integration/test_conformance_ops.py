"""TensorFlow's data_service_ops_test.py scenarios that test_conformance.py does not run: several
iterators of one job side by side, job names and dataset ids in their forms, job garbage
collection, pipelines with tables, variables and functions, reads of a read. Run against ours
and against TensorFlow's service, in eager and graph mode where TensorFlow's test runs both
(conformance.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import numpy as np
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
    public_distribute_of,
    raises_at_read,
    read_dataset,
    register_dataset_of,
    same_items,
    scenario_reader,
    unique_name,
)

import dataservice as service
from dataservice import tf_internal

pytestmark = pytest.mark.timeout(300)

# The dispatcher settings of TensorFlow's garbage-collection cases: unused jobs go at once.
GC_OPTIONS = {"job_gc_check_interval_ms": 50, "job_gc_timeout_ms": 20}
# The garbage-collection cases' datasets: TensorFlow's have 100 or 1,000 elements, which ours sends
# whole to a client's buffer at once, finishing the task before the test counts it.
GC_ELEMENTS = 10**6


@pytest.fixture(scope="module")
def clusters():
    with cluster_pool() as get:
        yield get


@pytest.fixture(params=[(s, m) for s in SERVICES for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, clusters):
    """A scenario's reader: run(pipeline, num_workers, limit=None, **distribute_kwargs) -> elements."""
    return scenario_reader(*request.param, clusters)


def _distributed(run, dataset: tf.data.Dataset, cluster, **kwargs) -> tf.data.Dataset:
    kwargs.setdefault("processing_mode", "parallel_epochs")
    return dataset.apply(distribute_of(run.service)(service=cluster.target, **kwargs))


def _range(run, n: int, cluster, **kwargs) -> tf.data.Dataset:
    return _distributed(run, tf.data.Dataset.range(n), cluster, **kwargs)


@contextlib.contextmanager
def _stepped(makes: list[Callable[[], tf.data.Dataset]], mode: str) -> Iterator[Callable[[int], object]]:
    """step(i) -> the next element of the dataset makes[i]() builds (None at its end), its
    iterator made at its first step; eagerly, or in one tf.Graph read with one Session."""
    if mode == "eager":
        iterators: dict[int, Iterator] = {}

        def step(i: int) -> object:
            if i not in iterators:
                iterators[i] = iter(makes[i]())
            try:
                return plain(tf.nest.map_structure(lambda t: t.numpy(), next(iterators[i])))
            except StopIteration:
                return None

        yield step
        return
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        nexts: dict[int, object] = {}

        def step(i: int) -> object:
            if i not in nexts:
                iterator = tf.compat.v1.data.make_initializable_iterator(makes[i]())
                nexts[i] = iterator.get_next()
                session.run(iterator.initializer)
            try:
                return plain(session.run(nexts[i]))
            except tf.errors.OutOfRangeError:
                return None

        yield step


def _rest(step: Callable[[int], object], i: int) -> list:
    out = []
    while (element := step(i)) is not None:
        out.append(element)
    return out


# ---- several iterators, one or several jobs ----------------------------------------------------


def test_iterators_read_side_by_side_each_read_everything(run):
    """testConcurrentEpoch: three unnamed datasets read a step each in turn: each gives range(10)
    in order (three jobs)."""
    cluster = run.cluster(1)
    with _stepped([lambda: _range(run, 10, cluster)] * 3, run.mode) as step:
        results = [[step(i) for i in range(3)] for _ in range(10)]
    assert [list(column) for column in zip(*results)] == [list(range(10))] * 3


def test_repeats_of_a_shared_job_share_every_repetition(run):
    """testSharedJobNameRepeat: two readers of one named job, each repeated 3 times, read 60
    elements each in turn, then the rest: together each element of range(100) three times."""
    cluster, name = run.cluster(1), unique_name(run, "repeat")
    make = lambda: _range(run, 100, cluster, job_name=name).repeat(3)  # noqa: E731
    with _stepped([make, make], run.mode) as step:
        results = [step(0) for _ in range(60)] + [step(1) for _ in range(60)]
        results += _rest(step, 0) + _rest(step, 1)
    same_items(results, list(range(100)) * 3)


def test_a_repeated_shared_job_read_after_another_reader(run):
    """testSharedJobNameRepeatEmptyJob: a reader of a named job repeated forever reads range(10)
    three times in order; TensorFlow's second reader of that job, started after, reads 30 more.
    Ours differs: each pass of a dataset reads its job's next repetition from the first, and the
    first three the other reader has read out; an empty pass ends repeat(), so the second reader
    reads nothing (README, Compatibility)."""
    cluster, name = run.cluster(1), unique_name(run, "empty")
    make = lambda: _range(run, 10, cluster, job_name=name).repeat()  # noqa: E731
    with _stepped([make, make], run.mode) as step:
        assert [step(0) for _ in range(30)] == list(range(10)) * 3
        if run.service == "ours":
            assert step(1) is None
        else:
            assert all(step(1) is not None for _ in range(30))


@eager_only
def test_a_named_dataset_read_five_times_gives_everything_each_time(run):
    """testSharedJobNameMultipleEpochs: one dataset of a named job, iterated five times: each
    pass is the job's next iteration and gives range(10)."""
    dataset = _range(run, 10, run.cluster(1), job_name=unique_name(run, "epochs"))
    for _ in range(5):
        assert [int(e) for e in dataset] == list(range(10))


@eager_only
def test_read_inside_a_tf_function(run):
    """testInsideFunction: distribute() and the loop over the dataset in a tf.function; three
    workers each give range(10)."""
    cluster = run.cluster(3)

    @tf.function
    def read_all() -> tf.Tensor:
        dataset = _range(run, 10, cluster)
        result = tf.TensorArray(tf.int64, size=30, dynamic_size=True)
        i = 0
        for element in dataset:
            result = result.write(i, element)
            i += 1
        return result.stack()

    same_items([int(e) for e in read_all().numpy()], list(range(10)) * 3)


def test_no_sharding_policy_and_the_grpc_protocol(run):
    """testNoShardingPolicy, testDistributeExplicitProtocol, testExplicitProtocolFromDatasetId:
    ShardingPolicy.OFF reads everything; data_transfer_protocol="grpc" by distribute() and by
    from_dataset_id()."""
    off = service.ShardingPolicy.OFF if run.service == "ours" else tf.data.experimental.service.ShardingPolicy.OFF
    assert run(lambda: tf.data.Dataset.range(20), 1, processing_mode=off) == list(range(20))
    assert run(lambda: tf.data.Dataset.range(10), 1, data_transfer_protocol="grpc") == list(range(10))
    cluster = run.cluster(1)

    def make() -> tf.data.Dataset:
        numbers = tf.data.Dataset.range(10)
        dataset_id = register_dataset_of(run.service)(cluster.target, numbers)
        return from_dataset_id_of(run.service)(
            "parallel_epochs", cluster.target, dataset_id, numbers.element_spec, data_transfer_protocol="grpc"
        )

    assert read_dataset(make, run.mode) == list(range(10))


def test_a_graph_larger_than_grpcs_default_message(run):
    """testDistributeLargeGraph: a pipeline of 8 MB (a from_tensors of 2x1000x1000 floats)."""
    tensor = np.ones((2, 1000, 1000), dtype=np.float32)
    got = run(lambda: tf.data.Dataset.from_tensors(tensor), 1, processing_mode="parallel_epochs")
    assert len(got) == 1 and np.array_equal(np.asarray(got[0]).reshape(tensor.shape), tensor)


def test_non_deterministic_pipelines_stay_so(run):
    """testApplyDeterminismOption: an interleave with deterministic=False whose first element
    sleeps half a second: the service keeps the option, so the element comes late."""
    elements = list(range(10))

    def pipeline() -> tf.data.Dataset:
        def slow_first(x):
            late = tf.data.Dataset.from_tensors(x).apply(tf_internal.sleep(500_000))
            return tf.cond(tf.equal(x, 0), lambda: late, lambda: tf.data.Dataset.from_tensors(x))

        options = tf.data.Options()
        options.deterministic = False
        return (
            tf.data.Dataset.from_tensor_slices(elements)
            .interleave(slow_first, cycle_length=10, num_parallel_calls=10)
            .with_options(options)
        )

    got = run(pipeline, 1, processing_mode="parallel_epochs")
    same_items(got, elements)
    assert got != elements


# ---- job names and dataset ids ------------------------------------------------------------------


@pytest.mark.parametrize("reader", ["distribute", "from_dataset_id"])
@pytest.mark.parametrize("job_name", ["", "tensor"], ids=["empty", "not-a-string"])
def test_job_names_that_are_empty_or_not_strings_are_value_errors(run, reader, job_name):
    """testEmptyJobNameDistribute, testEmptyJobNameFromDatasetId, testNonStringJobNameDistribute,
    testNonStringJobNameFromDatasetId: a ValueError naming job_name."""
    cluster = run.cluster(1)
    name = tf.constant("foo") if job_name == "tensor" else ""
    with pytest.raises(ValueError, match="job_name"):
        if reader == "distribute":
            tf.data.Dataset.range(10).apply(
                public_distribute_of(run.service)(
                    processing_mode="parallel_epochs", service=cluster.target, job_name=name
                )
            )
        else:
            dataset_id = register_dataset_of(run.service)(cluster.target, tf.data.Dataset.range(10))
            from_dataset_id_of(run.service)(
                processing_mode="parallel_epochs", service=cluster.target, dataset_id=dataset_id, job_name=name
            )


def test_from_dataset_id_with_ids_in_every_form(run):
    """testFromDatasetId, testStringDatasetId, testRegisterWithExplicitDatasetId,
    testRegisterDifferentDatasets: the id register_dataset() returns, as a string tensor, and an
    id chosen at registration read back under its own name; two datasets get two ids."""
    cluster = run.cluster(1)
    register, from_dataset_id = register_dataset_of(run.service), from_dataset_id_of(run.service)
    chosen = unique_name(run, "dataset_id")
    spec = tf.TensorSpec([], tf.int64)

    def read(make_id: Callable[[], object], **kwargs) -> list:
        def make() -> tf.data.Dataset:
            return from_dataset_id(
                "parallel_epochs",
                cluster.target,
                make_id(),
                element_spec=spec,
                job_name=unique_name(run, "j"),
                **kwargs,
            )

        return read_dataset(make, run.mode)

    numbers = lambda: tf.data.Dataset.range(10)  # noqa: E731
    assert read(lambda: register(cluster.target, numbers())) == list(range(10))

    def as_string_tensor() -> tf.Tensor:
        dataset_id = register(cluster.target, numbers())
        return dataset_id if dataset_id.dtype == tf.string else tf.strings.as_string(dataset_id)

    assert read(as_string_tensor) == list(range(10))
    assert read(lambda: register(cluster.target, numbers(), dataset_id=chosen)) == list(range(10))
    assert read(lambda: chosen) == list(range(10))

    def two_ids() -> tf.data.Dataset:
        first = register(cluster.target, tf.data.Dataset.range(10))
        second = register(cluster.target, tf.data.Dataset.range(20))
        return tf.data.Dataset.from_tensors(tf.equal(first, second))

    assert read_dataset(two_ids, run.mode) == [False]


@eager_only
def test_python_string_dataset_ids(run):
    """testPyStringDatasetId, testFromRegisteredStringDatasetId: the id as a Python string, without
    an element_spec; a chosen id read before its registration's value is used."""
    cluster = run.cluster(1)
    dataset_id = register_dataset_of(run.service)(cluster.target, tf.data.Dataset.range(10))
    value = dataset_id.numpy()
    as_str = value.decode() if isinstance(value, bytes) else str(value)
    read = from_dataset_id_of(run.service)
    assert [int(e) for e in read("parallel_epochs", cluster.target, as_str)] == list(range(10))
    chosen = unique_name(run, "chosen")
    register_dataset_of(run.service)(cluster.target, tf.data.Dataset.range(10), dataset_id=chosen)
    spec = tf.TensorSpec([], tf.int64)
    assert [int(e) for e in read("parallel_epochs", cluster.target, chosen, element_spec=spec)] == list(range(10))


def test_register_dataset_inside_a_tf_function(run):
    """testRegisteringDatasetAsTfFunction: register_dataset called through tf.function, with the
    service as a (protocol, address) pair of string tensors. TensorFlow's registers when the
    function runs; ours registers when it is traced, where arguments have no values yet: a
    ValueError saying so (README, Compatibility). Constants made inside the function are known
    when it is traced, and ours takes them."""
    cluster = run.cluster(1)
    address = cluster.target.split("://")[1]
    numbers = lambda: tf.data.Dataset.range(10)  # noqa: E731

    def make() -> tf.data.Dataset:
        register = tf.function(register_dataset_of(run.service))
        dataset_id = register((tf.constant("grpc"), tf.constant(address)), numbers())
        return from_dataset_id_of(run.service)("parallel_epochs", cluster.target, dataset_id, numbers().element_spec)

    if run.service == "ours":
        with pytest.raises(ValueError, match="known only when the graph runs"):
            read_dataset(make, run.mode)
    else:
        assert read_dataset(make, run.mode) == list(range(10))

    @tf.function
    def register_with_constants() -> tf.Tensor:
        return register_dataset_of(run.service)((tf.constant("grpc"), tf.constant(address)), numbers())

    def from_constants() -> tf.data.Dataset:
        dataset_id = register_with_constants()
        return from_dataset_id_of(run.service)("parallel_epochs", cluster.target, dataset_id, numbers().element_spec)

    assert read_dataset(from_constants, run.mode) == list(range(10))


def test_from_dataset_id_errors(run):
    """testFromDatasetIdWrongElementSpec, testFromDatasetIdNotRegistered: a wrong element_spec
    fails the read; an id never registered is NotFoundError naming it."""
    cluster = run.cluster(1)
    variant = tf.TensorSpec([], tf.variant)
    from_dataset_id = from_dataset_id_of(run.service)

    def wrong_spec() -> tf.data.Dataset:
        dataset_id = register_dataset_of(run.service)(cluster.target, tf.data.Dataset.range(10))
        return from_dataset_id("parallel_epochs", cluster.target, dataset_id, variant)

    with pytest.raises(Exception):  # noqa: B017 - TensorFlow's test asks for any error
        read_dataset(wrong_spec, run.mode)
    unknown = unique_name(run, "UnregisteredID")
    with pytest.raises(tf.errors.NotFoundError, match=f"Dataset id {unknown} not found"):
        read_dataset(lambda: from_dataset_id("parallel_epochs", cluster.target, unknown, variant), run.mode)


def test_one_id_for_two_structures_is_refused(run):
    """testDatasetsDoNotMatch: registering a dataset of another structure under an id already
    taken is InvalidArgumentError."""
    cluster, chosen = run.cluster(1), unique_name(run, "taken")
    register = register_dataset_of(run.service)

    def make() -> tf.data.Dataset:
        first = register(cluster.target, tf.data.Dataset.range(10), compression=None, dataset_id=chosen)
        second = register(
            cluster.target,
            tf.data.Dataset.from_tensor_slices(list("Test dataset.")),
            compression=None,
            dataset_id=chosen,
        )
        return tf.data.Dataset.from_tensors((first, second))

    with pytest.raises(tf.errors.InvalidArgumentError, match="same structure"):
        read_dataset(make, run.mode)


def test_zip_of_two_modes_under_one_job_name_is_refused(run):
    """testZipDifferentProcessingModesDatasetsSharedJobName: one job name for a distributed_epoch
    and a parallel_epochs read is InvalidArgumentError at the read."""
    cluster, name = run.cluster(1), unique_name(run, "modes")

    def make() -> tf.data.Dataset:
        first = _range(run, 100, cluster, processing_mode="distributed_epoch", job_name=name)
        second = _range(run, 100, cluster, processing_mode="parallel_epochs", job_name=name)
        return tf.data.Dataset.zip((first, second))

    with raises_at_read(run.service, tf.errors.InvalidArgumentError, "job"):
        read_dataset(make, run.mode)


def test_shared_jobs_of_two_registered_datasets_read_side_by_side(run):
    """testFromDatasetIdSharedJobs: two datasets registered under ids of their own, each read by two
    readers of one job name in distributed_epoch, all four interleaved: range(40), each once."""
    cluster = run.cluster(2)
    ids = [unique_name(run, "dataset_1"), unique_name(run, "dataset_2")]
    name = unique_name(run, "shared_job")

    def make() -> tf.data.Dataset:
        datasets = [
            tf.data.Dataset.range(20, output_type=tf.int32),
            tf.data.Dataset.from_tensor_slices(list(range(20, 40))),
        ]
        registered = [
            register_dataset_of(run.service)(cluster.target, dataset, dataset_id=dataset_id)
            for dataset, dataset_id in zip(datasets, ids)
        ]
        readers = [
            from_dataset_id_of(run.service)(
                "distributed_epoch", cluster.target, dataset_id, dataset.element_spec, job_name=name
            )
            for _ in range(2)
            for dataset, dataset_id in zip(datasets, registered)
        ]
        return tf.data.Dataset.from_tensor_slices(readers).interleave(lambda x: x, cycle_length=len(readers))

    same_items(read_dataset(make, run.mode), list(range(40)))


# ---- job garbage collection ---------------------------------------------------------------------


def _tasks(run, cluster) -> int:
    if run.service == "tensorflow":
        return cluster.num_tasks()
    return sum(len(worker.running_tasks()) for worker in cluster.workers)


def _wait_for_tasks(run, cluster, at_most: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _tasks(run, cluster) > at_most:
        assert time.monotonic() < deadline, f"the workers still run {_tasks(run, cluster)} tasks after {timeout_s} s"
        time.sleep(0.1)


@eager_only
@pytest.mark.parametrize("job_name", [None, "test"], ids=["unnamed", "named"])
def test_an_unused_job_is_collected(run, job_name):
    """testGcUnusedJob: an iterator that read one element is deleted: its job's task goes."""
    cluster = run.cluster(1, dispatcher_options=GC_OPTIONS)
    _wait_for_tasks(run, cluster, 0)
    kwargs = {"job_name": unique_name(run, job_name)} if job_name else {}
    iterator = iter(_range(run, GC_ELEMENTS, cluster, **kwargs))
    assert int(next(iterator)) == 0
    assert _tasks(run, cluster) == 1
    del iterator
    _wait_for_tasks(run, cluster, 0)


@eager_only
@pytest.mark.parametrize("policy", ["used", "visitation_guarantee"])
def test_jobs_that_are_used_or_guarantee_visitation_are_kept(run, policy):
    """testDontGcUsedJob, testDontGcJobsWithVisitationGuarantees: of two jobs whose iterators are
    deleted, the one still read by a third iterator (or, in the second case, the DYNAMIC one) keeps
    its task."""
    cluster = run.cluster(1, dispatcher_options=GC_OPTIONS)
    _wait_for_tasks(run, cluster, 0)
    first, second = unique_name(run, "test1"), unique_name(run, "test2")
    iterators = [iter(_range(run, GC_ELEMENTS, cluster, job_name=first))]
    if policy == "used":
        iterators.append(iter(_range(run, GC_ELEMENTS, cluster, job_name=second)))
        keeper = iter(_range(run, GC_ELEMENTS, cluster, job_name=second))
    else:
        dynamic = (
            service.ShardingPolicy.DYNAMIC
            if run.service == "ours"
            else tf.data.experimental.service.ShardingPolicy.DYNAMIC
        )
        iterators.append(iter(_range(run, GC_ELEMENTS, cluster, job_name=second, processing_mode=dynamic)))
        keeper = None
    for iterator in iterators:
        next(iterator)
    assert _tasks(run, cluster) == 2
    del iterators
    _wait_for_tasks(run, cluster, 1)
    time.sleep(0.5)
    assert _tasks(run, cluster) == 1
    del keeper


@eager_only
def test_a_collected_job_is_made_again(run):
    """testGcAndRecreate: three times, a named job over three workers is read 50 elements and its
    iterator deleted: every task goes each time, and the next one starts anew."""
    cluster = run.cluster(3, dispatcher_options=GC_OPTIONS)
    _wait_for_tasks(run, cluster, 0)
    name = unique_name(run, "test")
    for _ in range(3):
        iterator = iter(_range(run, GC_ELEMENTS, cluster, job_name=name))
        for _ in range(50):
            next(iterator)
        del iterator
        _wait_for_tasks(run, cluster, 0)


@eager_only
def test_a_client_that_waits_before_reading_is_kept(run):
    """testKeepClientAliveBeforeReading: with client_timeout_ms at 1 s, an iterator made and read
    3 s later reads everything."""
    cluster = run.cluster(1, dispatcher_options={**GC_OPTIONS, "client_timeout_ms": 1000})
    iterator = iter(_range(run, 1000, cluster))
    time.sleep(3)
    assert [int(e) for e in iterator] == list(range(1000))


# ---- pipelines with state, functions, and reads of reads ----------------------------------------


@eager_only  # its graph case initializes the table with a Session of TensorFlow's test base
@pytest.mark.parametrize("value_rank", [0, 1])
def test_mutable_hash_table_lookups(run, value_rank):
    """testDistributeMutableHashTable: a MutableHashTable filled before distribute() is looked up
    by the workers with its contents then."""

    def value(v) -> object:
        for _ in range(value_rank):
            v = [v, v]
        return v

    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, value(-1))
    table.insert([0, 1], [value(10), value(11)])
    got = run(lambda: tf.data.Dataset.range(3).map(table.lookup), 1, processing_mode="parallel_epochs")
    assert got == [plain(np.array(value(v))) for v in (10, 11, -1)]


@pytest.mark.parametrize(
    "run, use_resource",
    [((service_, mode), True) for service_ in SERVICES for mode in MODES]
    + [((service_, "graph"), False) for service_ in SERVICES],
    indirect=["run"],
    ids=[f"{service_}-{mode}-resource" for service_ in SERVICES for mode in MODES]
    + [f"{service_}-graph-ref" for service_ in SERVICES],
)
def test_a_variable_in_the_pipeline(run, use_resource):
    """testVariables: a map adding a variable (10) to range(3); a reference variable in graph mode
    only, as TensorFlow's test has it. TensorFlow's serializes the variable's value into the
    graph; ours refuses a pipeline that reads variables (its dataset policy: PermissionDeniedError
    naming the op; in graph mode the graph cannot even be serialized without the variable's
    session, FailedPreconditionError): README, Compatibility."""
    if run.service == "ours":
        with pytest.raises((tf.errors.PermissionDeniedError, tf.errors.FailedPreconditionError)):
            _variable_pipeline_read(run, use_resource)
    else:
        assert _variable_pipeline_read(run, use_resource) == [10, 11, 12]


def _variable_pipeline_read(run, use_resource: bool) -> list[int]:
    """range(3) mapped to x + a variable of 10, read from the service."""
    cluster = run.cluster(1)
    if run.mode == "eager":
        variable = tf.Variable(10, dtype=tf.int64)
        return [int(e) for e in _distributed(run, tf.data.Dataset.range(3).map(lambda x: x + variable), cluster)]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        if use_resource:
            variable = tf.Variable(10, dtype=tf.int64)
        else:
            with tf.compat.v1.variable_scope("foo", use_resource=False):
                variable = tf.compat.v1.Variable(10, dtype=tf.int64)
        session.run(variable.initializer)
        dataset = _distributed(run, tf.data.Dataset.range(3).map(lambda x: x + variable), cluster)
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        next_element = iterator.get_next()
        session.run(iterator.initializer)
        return [int(session.run(next_element)) for _ in range(3)]


def test_a_generator_pipeline(run):
    """testFromGenerator: from_generator's Python runs only in the process that made it; TensorFlow's
    test passes because its workers run in the test's own process. Ours refuses it at distribute()
    (ValueError naming PyFunc: a remote worker cannot run the client's Python); TensorFlow's worker
    in another process fails the read (README, Compatibility)."""

    def pipeline() -> tf.data.Dataset:
        return tf.data.Dataset.from_generator(lambda: iter(range(10)), output_signature=tf.TensorSpec((), tf.int64))

    if run.service == "ours":
        with pytest.raises(ValueError, match="PyFunc"):
            run(pipeline, 1, processing_mode="parallel_epochs")
    else:
        with pytest.raises(tf.errors.OpError):
            run(pipeline, 1, processing_mode="parallel_epochs")


def test_a_read_inside_an_interleave(run):
    """testDistributeFromInterleave: interleave over two reads made in the interleave's function
    from its argument ([0, 10, 1, 11] from TensorFlow's). Ours serializes a pipeline when
    distribute() is called, and this one depends on the function's argument: a ValueError saying
    so (README, Compatibility)."""
    cluster = run.cluster(1)

    def make() -> tf.data.Dataset:
        return tf.data.Dataset.range(2).interleave(
            lambda x: _distributed(run, tf.data.Dataset.range(10 * x, 10 * x + 2), cluster), cycle_length=2
        )

    if run.service == "ours":
        with pytest.raises(ValueError, match="known only when the graph runs"):
            read_dataset(make, run.mode)
    else:
        assert read_dataset(make, run.mode) == [0, 10, 1, 11]


def test_reads_of_a_read(run):
    """testDoubleDistribute, testTwoLevelDistribute: distribute() of a dataset that itself reads the
    service (TensorFlow's serves it: range(10)). Ours refuses it at the outer distribute(): our
    reader is Python (a generator in tf.data) that a remote worker cannot run (ValueError naming
    PyFunc; README, Compatibility)."""
    cluster = run.cluster(1)

    def make() -> tf.data.Dataset:
        return _distributed(run, _range(run, 10, cluster), cluster)

    if run.service == "ours":
        with pytest.raises(ValueError, match="PyFunc"):
            read_dataset(make, run.mode)
    else:
        assert read_dataset(make, run.mode) == list(range(10))


def test_an_unknown_protocol(run):
    """testDistributeInvalidProtocol: "grp://": TensorFlow's fails the read with NotFoundError (no
    credentials factory for the protocol); ours refuses it at distribute() with a ValueError
    naming the protocols it takes (README, Compatibility)."""
    address = run.cluster(1).target.split("://")[1]

    def make() -> tf.data.Dataset:
        return tf.data.Dataset.range(10).apply(
            public_distribute_of(run.service)(processing_mode="parallel_epochs", service="grp://" + address)
        )

    if run.service == "ours":
        with pytest.raises(ValueError, match="protocol must be one of grpc"):
            read_dataset(make, run.mode)
    else:
        with pytest.raises(tf.errors.NotFoundError, match="No credentials factory has been registered for protocol"):
            read_dataset(make, run.mode)
