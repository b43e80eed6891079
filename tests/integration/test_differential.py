"""The same pipelines through TensorFlow's own tf.data service and through ours give the same elements."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conformance import tensorflow_servers
from conftest import in_process_cluster

import dataservice as service

pytestmark = pytest.mark.timeout(180)


def _canonical(element):
    """A hashable, order-free form of one element."""

    def leaf(x):
        if isinstance(x, tf.SparseTensor):
            return ("sparse", leaf(x.indices), leaf(x.values), leaf(x.dense_shape))
        array = np.asarray(x)
        return (array.dtype.str, array.shape, array.tobytes() if array.dtype != object else tuple(array.ravel()))

    return tuple(leaf(x) for x in tf.nest.flatten(element))


def _multiset(dataset):
    return collections.Counter(_canonical(e) for e in dataset)


PIPELINES = {
    "range_map": lambda: tf.data.Dataset.range(200).map(lambda x: x * x),
    "nested_dict": lambda: tf.data.Dataset.range(50).map(
        lambda x: {"id": x, "feat": (tf.cast(x, tf.float32) / 3, tf.strings.as_string(x)), "v": tf.fill([4], x)}
    ),
    "batched_varying": lambda: tf.data.Dataset.range(1, 40).map(lambda i: tf.range(i % 7)).padded_batch(5),
    "filter_shuffle": lambda: tf.data.Dataset.range(300).filter(lambda x: x % 3 == 0).shuffle(64, seed=1),
    "slices_strings": lambda: tf.data.Dataset.from_tensor_slices(
        {"word": ["alpha", "beta", "gamma", "delta"], "n": [1, 2, 3, 4]}
    ).repeat(5),
    "sparse": lambda: tf.data.Dataset.range(6).map(
        lambda i: tf.sparse.SparseTensor([[0, i]], [tf.cast(i, tf.float32)], [1, 6])
    ),
    "unbatch_flat_map": lambda: (
        tf.data.Dataset.range(10).batch(3).unbatch().flat_map(lambda x: tf.data.Dataset.from_tensors(x).repeat(x % 3))
    ),
}


@pytest.fixture(scope="module")
def tf_service():
    """TensorFlow's dispatcher and two workers; the dispatcher's target."""
    with tensorflow_servers(2) as target:
        yield target


@pytest.fixture(scope="module")
def ours():
    cluster = in_process_cluster(2)
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_multiset_as_tensorflow_service(name, tf_service, ours):
    make = PIPELINES[name]
    theirs = make().apply(tf.data.experimental.service.distribute("parallel_epochs", tf_service))
    mine = make().apply(service.distribute("parallel_epochs", ours.target))
    assert mine.element_spec == theirs.element_spec
    expected = _multiset(theirs)
    assert sum(expected.values()) > 0
    assert _multiset(mine) == expected


def test_ragged_elements_where_tensorflow_service_fails(ours):
    """TensorFlow's service cannot send RaggedTensor elements; ours yields what a local pipeline does."""
    make = lambda: tf.data.Dataset.from_tensor_slices(  # noqa: E731
        tf.ragged.constant([[1, 2], [3], [], [4, 5, 6]])
    ).map(lambda r: r * 2)
    mine = make().apply(service.distribute("parallel_epochs", ours.target))
    local = collections.Counter(tuple(r.numpy().tolist()) for r in make())
    got = collections.Counter(tuple(r.numpy().tolist()) for r in mine)
    assert got == collections.Counter({k: 2 * v for k, v in local.items()})


def _outcome(call):
    """What a user sees of a call: ("ok", result) or (exception type name, None)."""
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e).__name__, None


@pytest.mark.parametrize("compression", ["AUTO", None, "SNAPPY", "gzip", "snappy", 0])
def test_compression_values_as_tensorflow(compression, tf_service, ours):
    make = PIPELINES["nested_dict"]

    def read(module, target):
        return lambda: _multiset(make().apply(module.distribute("parallel_epochs", target, compression=compression)))

    theirs = _outcome(read(tf.data.experimental.service, tf_service))
    mine = _outcome(read(service, ours.target))
    assert mine[0] == theirs[0], (mine, theirs)
    assert mine[1] == theirs[1]


@pytest.mark.parametrize("value", [None, 1, 5000, -1])
def test_job_gc_timeout_values_as_tensorflow(value):
    """TensorFlow's DispatcherConfig takes -1 as "never collect"; so does ours."""
    theirs = _outcome(lambda: tf.data.experimental.service.DispatcherConfig(job_gc_timeout_ms=value))
    mine = _outcome(lambda: service.DispatcherConfig(job_gc_timeout_ms=value))
    assert mine[0] == theirs[0] == "ok"
    if value is not None:
        assert mine[1].job_gc_timeout_ms == theirs[1].job_gc_timeout_ms == value
