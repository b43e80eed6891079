"""Dynamic splits: the sources of a pipeline, split by index, for distributed_epoch.

The dispatcher finds the pipeline's source datasets in its GraphDef (walking
upstream from the `_Retval` node through dataset inputs), learns how many
elements ("splits") each has, and hands out contiguous index ranges of them.
A worker rebuilds the pipeline with each source replaced by a dataset that
produces the source's elements for the index ranges the dispatcher gives it,
so everything downstream of the source (map, filter, interleave, shuffle,
batch...) runs unchanged over the worker's stream of splits.

Sources feeding one `zip` form one split group: they get the same index
ranges, so zipped elements stay paired. The selector of
sample_from_datasets/choose_from_datasets runs whole on every worker, as in
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from dataservice import tf_internal

_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
SPLITTABLE_OPS = ("RangeDataset", "TensorSliceDataset", "TensorDataset")
# Dataset inputs that are not split: they run whole on every worker.
_LOCAL_INPUTS = {"DirectedInterleaveDataset": {0}}


class UnsplittableDatasetError(ValueError):
    """distributed_epoch cannot split this pipeline: the message names the op and says what to do."""


@dataclasses.dataclass(frozen=True)
class Source:
    node_name: str
    op: str
    # Constant inputs of the source node, in input order.
    inputs: tuple
    cardinality: int
    group: int


def _node_name(input_name: str) -> str:
    return input_name.lstrip("^").split(":")[0]


def _is_dataset(node: node_def_pb2.NodeDef) -> bool:
    return bool(_DATASET_OP.search(node.op))


def _const_value(node: node_def_pb2.NodeDef) -> np.ndarray:
    # parse_tensor, unlike make_ndarray, reads string tensors stored as tensor_content.
    tensor = node.attr["value"].tensor
    return tf.io.parse_tensor(tensor.SerializeToString(), out_type=tf.as_dtype(tensor.dtype)).numpy()


def find_sources(graph: graph_pb2.GraphDef) -> list[Source]:
    """The splittable sources of the pipeline, grouped; UnsplittableDatasetError if any source is not."""
    nodes = {node.name: node for node in graph.node}
    retvals = [n for n in graph.node if n.op == "_Retval"]
    if not retvals:
        raise UnsplittableDatasetError("the dataset graph has no '_Retval' node")
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    sources: list[str] = []
    sources_below: dict[str, list[str]] = {}

    def visit(name: str) -> list[str]:
        if name in sources_below:
            return sources_below[name]
        node = nodes[name]
        local = _LOCAL_INPUTS.get(node.op, set())
        inputs = [
            _node_name(i)
            for position, i in enumerate(node.input)
            if not i.startswith("^")
            and position not in local
            and _node_name(i) in nodes
            and _is_dataset(nodes[_node_name(i)])
        ]
        if not inputs:
            found = [name]
            if name not in sources:
                sources.append(name)
        else:
            found = []
            for child in inputs:
                found.extend(s for s in visit(child) if s not in found)
        if node.op == "ZipDataset":
            for s in found[1:]:
                union(s, found[0])
        sources_below[name] = found
        return found

    visit(_node_name(retvals[0].input[0]))
    group_ids: dict[str, int] = {}
    result = []
    for name in sources:
        node = nodes[name]
        if node.op not in SPLITTABLE_OPS:
            raise UnsplittableDatasetError(
                f"distributed_epoch cannot split the source op {node.op} (node {name!r}): only "
                f"{', '.join(SPLITTABLE_OPS)} sources (Dataset.range, from_tensor_slices, list_files, "
                "from_tensors, and TFRecordDataset/TextLineDataset over a list of files) can be split; "
                "use processing_mode='parallel_epochs' or a static ShardingPolicy instead"
            )
        inputs = []
        for i in node.input:
            if i.startswith("^"):
                continue
            producer = nodes.get(_node_name(i))
            if producer is None or producer.op != "Const":
                raise UnsplittableDatasetError(
                    f"distributed_epoch cannot split {node.op} (node {name!r}): its input {i!r} is computed by "
                    f"{producer.op if producer else 'an unknown node'}, not a constant; build the source from "
                    "concrete values, or use processing_mode='parallel_epochs'"
                )
            if producer.attr["value"].tensor.dtype in (tf.variant.as_datatype_enum, tf.resource.as_datatype_enum):
                raise UnsplittableDatasetError(
                    f"distributed_epoch cannot split {node.op} (node {name!r}): it slices sparse or ragged "
                    "tensors (variant constants); slice dense tensors, or use processing_mode='parallel_epochs'"
                )
            inputs.append(_const_value(producer))
        root = find(name)
        group = group_ids.setdefault(root, len(group_ids))
        result.append(Source(name, node.op, tuple(inputs), _cardinality(node.op, inputs), group))
    return result


def _cardinality(op: str, inputs: Sequence[np.ndarray]) -> int:
    if op == "RangeDataset":
        start, stop, step = (int(x) for x in inputs[:3])
        return len(range(start, stop, step))
    if op == "TensorSliceDataset":
        return int(inputs[0].shape[0]) if inputs and inputs[0].ndim else 0
    return 1  # TensorDataset: the one element is one split


def group_sizes(sources: Sequence[Source]) -> list[int]:
    """Splits per group: a zip ends with its shortest input."""
    sizes: dict[int, int] = {}
    for s in sources:
        sizes[s.group] = min(sizes.get(s.group, s.cardinality), s.cardinality)
    return [sizes[g] for g in range(len(sizes))]


def range_dataset(source: Source, node: node_def_pb2.NodeDef, begin: tf.Tensor, end: tf.Tensor) -> tf.data.Dataset:
    """The source's elements with indices in [begin, end)."""
    if source.op == "RangeDataset":
        start, _, step = (int(x) for x in source.inputs[:3])
        dtype = tf.as_dtype(node.attr["output_types"].list.type[0])
        return tf.data.Dataset.range(start + begin * step, start + end * step, step, output_type=dtype)
    if source.op == "TensorSliceDataset":
        components = tuple(tf.constant(c)[begin:end] for c in source.inputs)
        return tf.data.Dataset.from_tensor_slices(components)
    return tf.data.Dataset.from_tensors(tuple(tf.constant(c) for c in source.inputs)).take(end - begin)


SplitRanges = Callable[[Source], tf.data.Dataset]


def rebuild_with_splits(graph_bytes: bytes, element_spec, sources: Sequence[Source], split_ranges: SplitRanges):
    """The pipeline with every source replaced by its elements for the ranges `split_ranges(source)` yields.

    `split_ranges(source)` returns a dataset of (begin, end) int64 pairs; it is
    re-iterated each time the pipeline restarts the source (a repeat()).
    Returns (dataset, keepalive): keep `keepalive` referenced while the dataset is used.
    """
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(graph_bytes)
    nodes = {node.name: node for node in graph.node}
    originals = {s.node_name: node_def_pb2.NodeDef.FromString(nodes[s.node_name].SerializeToString()) for s in sources}
    retval = next(n for n in graph.node if n.op == "_Retval")
    output = retval.input[0] if ":" in retval.input[0] else retval.input[0] + ":0"
    graph.node.remove(retval)
    for s in sources:
        node = nodes[s.node_name]
        node.op = "Placeholder"
        del node.input[:]
        for key in list(node.attr):
            del node.attr[key]
        node.attr["dtype"].type = tf.variant.as_datatype_enum
        node.ClearField("experimental_type")

    def build():
        input_map = {}
        for s in sources:
            original = originals[s.node_name]
            local = split_ranges(s).flat_map(
                lambda begin, end, s=s, original=original: range_dataset(s, original, begin, end)
            )
            input_map[s.node_name + ":0"] = tf_internal.variant_tensor(local)
        return tf.graph_util.import_graph_def(graph, input_map=input_map, return_elements=[output], name="")[0]

    wrapped = tf.compat.v1.wrap_function(build, [])
    variant = wrapped()
    return tf.data.experimental.from_variant(variant, element_spec), wrapped
