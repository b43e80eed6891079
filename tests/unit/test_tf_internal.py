"""The TensorFlow private APIs that dataservice/tf_internal.py wraps still exist and behave as it relies on.

A TensorFlow upgrade that moves one of them fails here, naming it, rather than deep in a worker.
"""

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_with_grappler_log
from tensorflow.core.framework import graph_pb2

from dataservice import tf_internal


def test_serialized_graph_is_a_graphdef_with_a_retval():
    graph = graph_pb2.GraphDef.FromString(tf_internal.serialize_dataset_graph(tf.data.Dataset.range(3)))
    assert any(node.op == "_Retval" for node in graph.node)
    assert any(node.op == "RangeDataset" for node in graph.node)


def test_variant_tensor_rebuilds_the_dataset():
    dataset = tf.data.Dataset.range(4).map(lambda x: x * 2)
    variant = tf_internal.variant_tensor(dataset)
    assert variant.dtype == tf.variant
    rebuilt = tf.data.experimental.from_variant(variant, dataset.element_spec)
    assert list(rebuilt.as_numpy_iterator()) == [0, 2, 4, 6]


def test_tensor_memory_is_a_view_not_a_copy():
    tensor = tf.constant(np.arange(1024, dtype=np.float32))
    first, second = tf_internal.tensor_memory(tensor), tf_internal.tensor_memory(tensor)
    assert first.ctypes.data == second.ctypes.data
    assert first.ctypes.data != tensor.numpy().ctypes.data  # numpy() copies; the view does not
    bf16 = tf_internal.tensor_memory(tf.constant([1.5, 2.0], dtype=tf.bfloat16))
    assert bf16.dtype.name == "bfloat16"


def test_structure_coder_round_trips_nested_specs():
    spec = {"a": tf.TensorSpec([None, 3], tf.float32), "b": (tf.RaggedTensorSpec([None, None], tf.int64),)}
    assert tf_internal.decode_structure(tf_internal.encode_structure(spec)) == spec


def test_flat_types_and_shapes_encode_composites_as_variants():
    spec = (tf.TensorSpec([2], tf.int32), tf.SparseTensorSpec([None, 4], tf.float32))
    assert tf_internal.flat_tensor_types(spec) == [tf.int32, tf.variant]
    assert [s.as_list() if s.rank is not None else None for s in tf_internal.flat_tensor_shapes(spec)][0] == [2]


def test_iterator_get_next_reads_the_iterator_resource():
    iterator = iter(tf.data.Dataset.range(2))
    resource = tf_internal.iterator_resource(iterator)
    assert resource is not None
    values = [tf_internal.iterator_get_next(resource, [tf.int64], [tf.TensorShape([])])[0].numpy() for _ in range(2)]
    assert values == [0, 1]
    try:
        tf_internal.iterator_get_next(resource, [tf.int64], [tf.TensorShape([])])
    except tf.errors.OutOfRangeError:
        pass
    else:
        raise AssertionError("the end of the iterator raised no OutOfRangeError")


def test_deprecation_silencer_and_sleep_transformation():
    with tf_internal.deprecation_warnings_silenced():
        dataset = tf.data.Dataset.range(3).apply(tf_internal.sleep(10))
    assert list(dataset.as_numpy_iterator()) == [0, 1, 2]


def test_registered_op_names_lists_the_op_registry():
    names = tf_internal.registered_op_names()
    assert len(names) == len(set(names)) > 1000
    assert {"RangeDataset", "MapDataset", "WriteFile", "SaveV2"} <= set(names)


def test_a_finalized_graph_holds_the_rewrites_and_runs_as_the_pipeline_does():
    dataset = tf.data.Dataset.range(10).map(lambda x: x * 3).batch(4)
    graph = tf_internal.finalized_dataset_graph(dataset)
    ops = [node.op for node in graph.node]
    assert "MapAndBatchDataset" in ops and "MapDataset" not in ops, "the default map-and-batch fusion"
    assert ops.count("ModelDataset") == 1, "the autotuning model"
    devices = {node.device for node in graph.node} | {n.device for f in graph.library.function for n in f.node_def}
    assert devices == {""}
    copy = tf.data.experimental.from_variant(
        tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString()), dataset.element_spec
    )
    assert [list(b) for b in copy.as_numpy_iterator()] == [list(b) for b in dataset.as_numpy_iterator()]


def _counting_scan(calls: list[int], end_at: int, error: type[Exception] = StopIteration) -> tf.data.Dataset:
    """range(inf) through an ending scan whose call k gives [0..k] and raises `error` at `end_at`."""

    def fetch(state, k):
        calls.append(int(k))
        if k == end_at:
            raise error("the end")
        return state + 1, np.arange(k + 1, dtype=np.int64)

    def step(state, k):
        state, chunk = tf.numpy_function(fetch, [state, k], [tf.int64, tf.int64], stateful=True)
        state.set_shape([])
        chunk.set_shape([None])
        return state, chunk

    return tf_internal.ending_scan(tf.data.Dataset.range(2**62), tf.constant(0, tf.int64), step)


def test_an_ending_scan_ends_where_its_function_raises_stop_iteration():
    calls: list[int] = []
    dataset = _counting_scan(calls, end_at=3).unbatch()
    assert dataset.element_spec == tf.TensorSpec([], tf.int64)
    iterator = iter(dataset)
    assert [int(x) for x in iterator] == [0, 0, 1, 0, 1, 2]
    # Once ended, unbatch does not call the scan again: the function ran once past the data.
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(iterator)
    assert calls == [0, 1, 2, 3]


def test_an_ending_scan_still_fails_on_other_errors():
    dataset = _counting_scan([], end_at=1, error=ValueError)
    iterator = iter(dataset)
    assert list(next(iterator).numpy()) == [0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="the end"):
        next(iterator)


_SCAN_OPTIMIZATIONS_COUNTED = """
import numpy as np, tensorflow as tf
from dataservice import tf_internal

def fetch(state, k):
    if k == 2:
        raise StopIteration
    return state, np.arange(3, dtype=np.int64)

def step(state, k):
    state, chunk = tf.numpy_function(fetch, [state, k], [tf.int64, tf.int64], stateful=True)
    state.set_shape([])
    chunk.set_shape([None])
    return state, chunk

for scan in ("public", "ending", "ending"):
    start, numbers = tf.constant(0, tf.int64), tf.data.Dataset.range(2**62)
    if scan == "public":
        dataset = numbers.scan(start, step).take(2)
    else:
        dataset = tf_internal.ending_scan(numbers, start, step)
    print("SCAN", scan, flush=True)
    assert [list(c) for c in dataset.as_numpy_iterator()] == [[0, 1, 2], [0, 1, 2]]
print("SCAN done", flush=True)
"""


def test_an_ending_scans_function_is_not_optimized_at_each_iterator():
    """tf.data gives a function it could place on several devices a Grappler pass of its own at
    every iterator; the ending scan's function, marked to run on the iterator's device, none.
    Counted from TensorFlow's log, in a process of its own; the public scan shows the log works."""
    output = run_with_grappler_log(_SCAN_OPTIMIZATIONS_COUNTED)
    items: dict[str, list[str]] = {}
    scan = None
    for line in output.splitlines():
        if line.startswith("SCAN "):
            scan = line.split()[1]
            items.setdefault(scan, [])
        elif scan and "Starting optimization for grappler item:" in line:
            items[scan].append(line.rsplit(":", 1)[1].strip())
    assert "graph" in items["public"] and any("scan" in item.lower() for item in items["public"]), items
    # Two iterators of an ending scan: each pipeline's static optimizations, nothing more.
    assert items["ending"] == ["graph", "graph"], items
