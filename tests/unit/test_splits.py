"""How distributed_epoch splits a pipeline's sources (pipeline/splits.py), without a cluster: the
split groups found in the graph, and the pipeline rebuilt over given split ranges."""

from __future__ import annotations

import gc
import weakref

import tensorflow as tf

from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import seeds, splits


def _sources(dataset: tf.data.Dataset) -> list[splits.Source]:
    return splits.find_sources(graph_lib.parse_graph(graph_lib.serialize_dataset(dataset)))


def _pipeline(dataset: tf.data.Dataset) -> splits.SplitPipeline:
    graph_bytes = graph_lib.serialize_dataset(dataset)
    return splits.SplitPipeline(graph_bytes, dataset.element_spec, _sources(dataset))


def _rebuilt(dataset: tf.data.Dataset, ranges: list[tuple[int, int]]) -> list:
    """The dataset rebuilt with every source reading `ranges` of its group's splits."""
    pipeline = _pipeline(dataset)
    return _read(pipeline, lambda _: iter(ranges))


def _read(pipeline: splits.SplitPipeline, supply: splits.RangeSupply) -> list:
    rebuilt, keepalive = pipeline.dataset(supply)
    got = [tf.nest.map_structure(_plain, e) for e in rebuilt]
    del keepalive
    return got


def _plain(tensor: tf.Tensor):
    value = tensor.numpy()
    return value.tolist() if hasattr(value, "tolist") else value


def test_zipped_sources_share_a_group_that_ends_with_the_shortest():
    sources = _sources(tf.data.Dataset.zip((tf.data.Dataset.range(50), tf.data.Dataset.range(10))))
    assert len({s.group for s in sources}) == 1
    assert splits.group_sizes(sources) == [10]


def test_a_repeat_between_a_zip_and_its_source_multiplies_the_source_splits():
    long = tf.data.Dataset.range(50)
    short = tf.data.Dataset.range(10).map(lambda x: x * 100).repeat(10)
    sources = _sources(tf.data.Dataset.zip((long, short)))
    assert sorted((s.cardinality, s.repeats) for s in sources) == [(10, 10), (50, 1)]
    assert splits.group_sizes(sources) == [50]
    nested = _sources(tf.data.Dataset.zip((long, tf.data.Dataset.range(5).repeat(2).repeat(3))))
    assert splits.group_sizes(nested) == [30]


def test_the_rebuilt_zip_pairs_split_indices_and_runs_the_absorbed_repeat_once():
    long = tf.data.Dataset.range(50)
    short = tf.data.Dataset.from_tensor_slices([b"a", b"b", b"c"]).repeat(10)
    got = _rebuilt(tf.data.Dataset.zip((long, short)), [(0, 4), (28, 31)])
    assert got == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"a"), (28, b"b"), (29, b"c"), (30, b"a")]


def test_finite_repeats_outside_a_zip_and_repeats_of_several_sources_are_left_to_the_repetitions():
    assert splits.group_sizes(_sources(tf.data.Dataset.range(7).repeat(3))) == [7]
    zipped = tf.data.Dataset.zip((tf.data.Dataset.range(8), tf.data.Dataset.range(4)))
    assert splits.group_sizes(_sources(zipped.repeat(3))) == [4]
    assert splits.group_sizes(_sources(zipped.repeat())) == [4], "the repeat restarts both: pairs stay pairs"
    twice = tf.data.Dataset.range(3).concatenate(tf.data.Dataset.range(5)).repeat()
    assert splits.group_sizes(_sources(twice)) == [3, 5]


def test_an_infinite_repeat_of_one_source_takes_every_repeat_of_it_and_never_ends():
    sources = _sources(tf.data.Dataset.range(5).repeat(2).map(lambda x: x + 1).repeat())
    assert [(s.repeats, len(s.absorbed_repeats)) for s in sources] == [(-1, 2)]
    assert splits.group_sizes(sources) == [splits.INFINITE_SPLITS]
    zipped = tf.data.Dataset.zip((tf.data.Dataset.range(8), tf.data.Dataset.range(4).repeat()))
    assert splits.group_sizes(_sources(zipped)) == [8]
    got = _rebuilt(tf.data.Dataset.from_tensors(7).repeat(), [(0, 3), (10**12, 10**12 + 2)])
    assert got == [7] * 5


def test_the_selector_of_choose_and_sample_runs_whole():
    inputs = [tf.data.Dataset.from_tensors(w).repeat() for w in (b"a", b"b")]
    choices = tf.data.Dataset.from_tensor_slices(tf.constant([0, 1, 1, 0, 1], tf.int64))
    for pipeline in (
        tf.data.Dataset.choose_from_datasets(inputs, choices),
        tf.data.Dataset.sample_from_datasets(inputs, [0.5, 0.5], seed=3),
    ):
        sources = _sources(pipeline)
        assert [s.op for s in sources] == ["TensorDataset", "TensorDataset"]
        assert splits.group_sizes(sources) == [splits.INFINITE_SPLITS] * 2


def test_the_counter_of_enumerate_runs_whole_on_every_worker():
    """enumerate() zips a counter marked replicate_on_split with the dataset: only the dataset is
    split, and each worker counts its own elements from 0."""
    pipeline = tf.data.Dataset.from_tensor_slices([b"a", b"b", b"c", b"d"]).enumerate()
    assert [s.op for s in _sources(pipeline)] == ["TensorSliceDataset"]
    assert _rebuilt(pipeline, [(2, 4)]) == [(0, b"c"), (1, b"d")]


def _eager_functions() -> int:
    from tensorflow.python.eager import context

    gc.collect()
    return len(context.context().list_function_names())


def test_a_rebuilt_pipelines_functions_leave_the_eager_context_with_it():
    """Rebuilding adds the pipeline's functions (its maps, the ranges' generator) to the eager
    context; a worker rebuilds each dataset it runs in distributed_epoch, so they must go
    when the pipeline does."""
    dataset = tf.data.Dataset.range(20).map(lambda x: x * 2).filter(lambda x: x % 3 > 0)
    assert _rebuilt(dataset, [(0, 10)])  # whatever the first rebuild leaves for good
    before = _eager_functions(), _python_functions()
    for _ in range(5):
        assert _rebuilt(dataset, [(0, 10), (10, 20)]) == [x * 2 for x in range(20) if (x * 2) % 3 > 0]
    assert (_eager_functions(), _python_functions()) == before


def _python_functions() -> int:
    """The Python functions (py_func, from_generator) TensorFlow keeps for the process's default graph."""
    return len(getattr(tf.compat.v1.get_default_graph(), "_py_funcs_used_in_graph", []))


class _Supply:
    """A task's ranges; an object, so that the test can see when the pipeline lets it go."""

    def __init__(self, ranges: list[tuple[int, int]]):
        self.ranges = ranges
        self.calls = 0

    def __call__(self, source: splits.Source):
        self.calls += 1
        return iter(self.ranges)


def test_one_rebuilt_pipeline_serves_each_task_its_own_ranges_and_forgets_them_after():
    dataset = tf.data.Dataset.range(100).map(lambda x: x + 1).repeat(2)
    pipeline = _pipeline(dataset)
    first, second = _Supply([(0, 3)]), _Supply([(10, 12), (50, 51)])
    first_dataset, first_lease = pipeline.dataset(first)
    second_dataset, second_lease = pipeline.dataset(second)
    assert [int(x) for x in second_dataset] == [11, 12, 51] * 2
    assert [int(x) for x in first_dataset] == [1, 2, 3] * 2
    assert (first.calls, second.calls) == (2, 2), "each repetition of the repeat asks its task anew"
    before = _eager_functions()
    for _ in range(5):
        assert _read(pipeline, _Supply([(7, 9)])) == [8, 9] * 2
    assert _eager_functions() == before, "a task's dataset leaves no functions behind"
    gone = weakref.ref(first)
    del first, first_dataset, first_lease
    gc.collect()
    assert gone() is None, "the pipeline let the finished task's ranges go"


def test_a_task_of_a_seeded_shuffle_shuffles_by_its_graph_not_by_the_tasks_before_it():
    dataset = tf.data.Dataset.range(50).shuffle(50, seed=7)
    pipeline = _pipeline(dataset)

    def reseeded(instance: str, repetition: int):
        rewrite = lambda graph: seeds.reseed(graph, instance, repetition)  # noqa: E731
        rebuilt, lease = pipeline.dataset(lambda _: iter([(0, 50)]), rewrite)
        return [int(x) for x in rebuilt]

    first = reseeded("a", 0)
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert reseeded("b", 0) == first, "a fresh generator per task: the same order"
    assert reseeded("c", 1) != first, "another repetition reshuffles"
