"""Dynamic splits: the sources of a pipeline, split by index, for distributed_epoch.

The dispatcher finds the pipeline's source datasets in its GraphDef (walking
upstream from the `_Retval` node through dataset inputs), learns how many
elements ("splits") each has, and hands out contiguous index ranges of them.
A worker rebuilds the pipeline with each source replaced by a dataset that
produces the source's elements for the index ranges the dispatcher gives it,
so everything downstream of the source (map, filter, interleave, shuffle,
batch...) runs unchanged over the worker's stream of splits.

Sources feeding one `zip` form one split group: they get the same index
ranges, so zipped elements stay paired.

A `repeat()` over a single source is mostly left to run: each time it restarts
the source, the source reads the dispatcher's next repetition of its group.
Two kinds are taken into the source instead, as TensorFlow's split providers
repeat a source's splits: an infinite `repeat()` over one source, and a
`repeat(count)` over one source below a zip (`zip(range(50),
range(10).repeat(10))` runs 50 elements, as TensorFlow's does). Such a source
counts `count` times its splits (INFINITE_SPLITS for ever), split index i
gives its element i mod cardinality, and the repeat itself runs once; so
every worker can read a `from_tensors(x).repeat()` input of
sample_from_datasets as long as it needs to, where a repetition of one split
would leave all but one worker with an empty repetition, which ends a
repeat() in tf.data.

The selector of sample_from_datasets/choose_from_datasets runs whole on
every worker, as in TensorFlow's service (15 choices over 3 workers make 45
elements), and so does a dataset marked `replicate_on_split` (the counter of
`enumerate()`: each worker counts its own elements from the start).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
import secrets
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from dataservice import tf_internal
from dataservice.modes import INFINITE_SPLITS
from dataservice.pipeline import graph as graph_lib

log = logging.getLogger(__name__)

_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
SPLITTABLE_OPS = ("RangeDataset", "TensorSliceDataset", "TensorDataset")
# Dataset inputs that are not split: they run whole on every worker.
_LOCAL_INPUTS = {"DirectedInterleaveDataset": frozenset({0})}


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
    # How many times the repeat()s taken into the source run it, -1 for ever (see the module
    # docstring): its split indices go up to cardinality x repeats.
    repeats: int = 1
    # Those repeat nodes, which run once in the rebuilt pipeline.
    absorbed_repeats: tuple[str, ...] = ()

    @property
    def splits(self) -> int:
        if self.cardinality and self.repeats < 0:
            return INFINITE_SPLITS
        return min(self.cardinality * self.repeats, INFINITE_SPLITS)


def _node_name(input_name: str) -> str:
    return input_name.lstrip("^").split(":")[0]


def _is_dataset(node: node_def_pb2.NodeDef) -> bool:
    return bool(_DATASET_OP.search(node.op))


def _const_value(node: node_def_pb2.NodeDef) -> np.ndarray:
    # parse_tensor, unlike make_ndarray, reads string tensors stored as tensor_content.
    tensor = node.attr["value"].tensor
    with tf_internal.eager_mode():  # also when a graph-mode client checks its pipeline
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
        inputs = _dataset_inputs(nodes, node, skip=_LOCAL_INPUTS.get(node.op, frozenset()))
        if "replicate_on_split" in node.attr and node.attr["replicate_on_split"].b:
            # Marked to run whole on every worker (enumerate()'s counter): not a source to split.
            sources_below[name] = []
            return []
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
    repeats, absorbed = _absorbed_repeats(nodes, sources_below)
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
        result.append(
            Source(
                name,
                node.op,
                tuple(inputs),
                _cardinality(node.op, inputs),
                group,
                repeats.get(name, 1),
                tuple(absorbed.get(name, ())),
            )
        )
    return result


def _absorbed_repeats(
    nodes: dict[str, node_def_pb2.NodeDef], sources_below: dict[str, list[str]]
) -> tuple[dict[str, int], dict[str, list[str]]]:
    """For each source, how many times the repeat() nodes taken into it run it (-1: for ever), and
    those nodes (see the module docstring): repeats over that one source with a constant count,
    infinite ones anywhere, finite ones below a zip."""
    below_zip: set[str] = set()
    pending = [n for n in sources_below if nodes[n].op == "ZipDataset"]
    while pending:
        for child in _dataset_inputs(nodes, nodes[pending.pop()]):
            if child not in below_zip:
                below_zip.add(child)
                pending.append(child)
    # Repeats over one source with a constant count: (node, count) by source.
    candidates: dict[str, list[tuple[str, int]]] = {}
    for name in sorted(sources_below):
        node = nodes[name]
        if node.op != "RepeatDataset" or len(sources_below[name]) != 1:
            continue
        count_node = nodes.get(_node_name(node.input[1]))
        if count_node is not None and count_node.op == "Const":
            candidates.setdefault(sources_below[name][0], []).append((name, int(_const_value(count_node))))
    repeats: dict[str, int] = {}
    absorbed: dict[str, list[str]] = {}
    for source, found in candidates.items():
        # Under an infinite repeat, every repeat of the source goes into it (a repeat left in the
        # pipeline would restart a source whose splits never end).
        forever = any(count < 0 for _, count in found)
        taken = [(name, count) for name, count in found if forever or name in below_zip]
        if taken:
            absorbed[source] = [name for name, _ in taken]
            repeats[source] = -1 if forever else math.prod(count for _, count in taken)
    return repeats, absorbed


def _dataset_inputs(
    nodes: dict[str, node_def_pb2.NodeDef], node: node_def_pb2.NodeDef, skip: frozenset[int] = frozenset()
) -> list[str]:
    """The names of the node's dataset inputs, but those at the input positions in `skip`."""
    return [
        _node_name(i)
        for position, i in enumerate(node.input)
        if not i.startswith("^")
        and position not in skip
        and _node_name(i) in nodes
        and _is_dataset(nodes[_node_name(i)])
    ]


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
        sizes[s.group] = min(sizes.get(s.group, s.splits), s.splits)
    return [sizes[g] for g in range(len(sizes))]


def range_dataset(source: Source, node: node_def_pb2.NodeDef, begin: tf.Tensor, end: tf.Tensor) -> tf.data.Dataset:
    """The source's elements with split indices in [begin, end) (index i is element
    i mod cardinality of a repeated source)."""
    if source.repeats != 1:
        return _repeated_range_dataset(source, node, begin, end)
    if source.op == "RangeDataset":
        start, _, step = (int(x) for x in source.inputs[:3])
        dtype = tf.as_dtype(node.attr["output_types"].list.type[0])
        return tf.data.Dataset.range(start + begin * step, start + end * step, step, output_type=dtype)
    if source.op == "TensorSliceDataset":
        components = tuple(tf.constant(c)[begin:end] for c in source.inputs)
        return tf.data.Dataset.from_tensor_slices(components)
    return tf.data.Dataset.from_tensors(tuple(tf.constant(c) for c in source.inputs)).take(end - begin)


def _repeated_range_dataset(
    source: Source, node: node_def_pb2.NodeDef, begin: tf.Tensor, end: tf.Tensor
) -> tf.data.Dataset:
    cardinality = max(source.cardinality, 1)
    indices = tf.data.Dataset.range(begin, end if source.cardinality else begin).map(lambda i: i % cardinality)
    if source.op == "RangeDataset":
        start, _, step = (int(x) for x in source.inputs[:3])
        dtype = tf.as_dtype(node.attr["output_types"].list.type[0])
        return indices.map(lambda i: tf.cast(start + i * step, dtype))
    if source.op == "TensorSliceDataset":
        components = tuple(tf.constant(c) for c in source.inputs)
        return indices.map(lambda i: tuple(tf.gather(c, i) for c in components))
    return indices.map(lambda _: tuple(tf.constant(c) for c in source.inputs))


# One source's split ranges for one task: called each time the pipeline (re)starts the source, it
# yields that repetition's (begin, end) pairs.
RangeSupply = Callable[[Source], Iterator[tuple[int, int]]]

_NO_RANGE = (np.int64(-1), np.int64(-1))
_NO_END = 2**63 - 1


class SplitPipeline:
    """A pipeline rebuilt once over its sources' split ranges, made into a dataset per task.

    Rebuilding imports the whole graph into a wrapped function with every
    source replaced, which costs tens of milliseconds; a worker would pay it at
    the start of every task of every epoch. So the pipeline is rebuilt once,
    each source reading its ranges through a Python call that takes a key, and
    the graph of the rebuilt pipeline is kept, as it is and in each form the
    caller finishes it in (finished(): a worker chunks it by a cap that follows
    the pipeline's measured rate, so one pipeline is finished several ways). A
    task's dataset is such a graph with the task's key in place of a marker
    constant, made with DatasetFromGraph (a few milliseconds, one dataset
    object, and no functions left in the eager context); the call finds the
    task's RangeSupply under the key.
    """

    def __init__(self, graph_bytes: bytes, element_spec: Any, sources: Sequence[Source]):
        """`sources` are the graph's (find_sources)."""
        self.sources = list(sources)
        self._supplies: dict[int, RangeSupply] = {}
        # Seconds each task's supply took to give its ranges (the worker waiting on the
        # dispatcher's answers): time the pipeline spent, but not on its own work.
        self._waited: dict[int, float] = {}
        # (key, source node): the ranges of the repetition each task's source is reading.
        self._open: dict[tuple[int, str], Iterator[tuple[int, int]]] = {}
        self._keys = itertools.count(1)
        # Stands for a task's key in the rebuilt graph; random, so that no constant of the
        # pipeline's own is taken for it.
        self._marker = secrets.randbits(62) | (1 << 62)
        self._rebuilt, self._keepalive = _rebuild(graph_bytes, element_spec, self.sources, self._ranges)
        self.plain = self.finished(None)

    def finished(
        self, finish: Callable[[tf.data.Dataset], tf.data.Dataset] | None, finalize: bool = False
    ) -> FinishedPipeline:
        """The pipeline with `finish` applied (None: as it is), for the caller to keep: each call
        serializes the graph again, a few milliseconds, where rebuilding costs tens. `finalize`:
        its graph finalized here once (graph_lib.finalized_template), for task datasets that
        are iterated as they are, so that no task pays tf.data's static optimizations."""
        dataset = self._rebuilt if finish is None else finish(self._rebuilt)
        template = graph_lib.finalized_template(dataset) if finalize else graph_lib.template(dataset)
        key_nodes = self._key_nodes(template.graph)
        if self.sources and not key_nodes and template.options is not None:
            log.warning("tf.data's optimizations lost the constant that names a task; each task optimizes anew")
            template = graph_lib.template(dataset)
            key_nodes = self._key_nodes(template.graph)
        if self.sources and not key_nodes:
            raise RuntimeError("the rebuilt pipeline lost the constant that names its task")
        return FinishedPipeline(self, template, key_nodes)

    def _key_nodes(self, graph: graph_pb2.GraphDef) -> list[str]:
        return [node.name for node in graph.node if _is_int64_scalar(node, self._marker)]

    def dataset(
        self, supply: RangeSupply, rewrite: Callable[[bytes], bytes] | None = None
    ) -> tuple[tf.data.Dataset, TaskLease]:
        """The pipeline as it is, over the ranges `supply` yields (FinishedPipeline.dataset)."""
        return self.plain.dataset(supply, rewrite)

    def lease(self, supply: RangeSupply) -> TaskLease:
        """A new task's key, its supply under it until the lease is gone."""
        key = next(self._keys)
        self._supplies[key] = supply
        self._waited[key] = 0.0
        lease = TaskLease(self, key)
        weakref.finalize(lease, self._forget, key)
        return lease

    def _ranges(self, source: Source) -> tf.data.Dataset:
        """The source's ranges in the rebuilt graph: those of the supply under the task's key.

        One Python call per range, asked for only when the pipeline starts the range, and
        the end signalled by a (-1, -1) pair rather than an error: TensorFlow keeps a few
        hundred bytes for good for every error a step ends with (a generator's end is one)."""
        marker = tf.constant(self._marker, tf.int64)

        def next_range(key: np.int64, index: np.int64) -> tuple[np.int64, np.int64]:
            return self._next_range(int(key), source, int(index))

        def fetch(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            begin, end = tf.numpy_function(next_range, [marker, index], (tf.int64, tf.int64), stateful=True)
            return tf.reshape(begin, []), tf.reshape(end, [])

        return tf.data.Dataset.range(_NO_END).map(fetch).take_while(lambda begin, end: begin >= 0)

    def _next_range(self, key: int, source: Source, index: int) -> tuple[np.int64, np.int64]:
        """Range `index` of the source's current repetition for the task under `key`; index 0
        starts a repetition (the pipeline started the source anew)."""
        started = time.perf_counter()
        if index == 0:
            supply = self._supplies.get(key)
            if supply is None:  # the task's dataset is gone
                return _NO_RANGE
            self._open[key, source.node_name] = supply(source)
        ranges = self._open.get((key, source.node_name))
        split_range = next(ranges, None) if ranges is not None else None
        if key in self._waited:
            self._waited[key] += time.perf_counter() - started
        if split_range is None:
            self._open.pop((key, source.node_name), None)
            return _NO_RANGE
        return np.int64(split_range[0]), np.int64(split_range[1])

    def waited_s(self, key: int) -> float:
        """Seconds the task under `key` has waited for its ranges so far."""
        return self._waited.get(key, 0.0)

    def _forget(self, key: int) -> None:
        self._supplies.pop(key, None)
        self._waited.pop(key, None)
        for open_key in [k for k in list(self._open) if k[0] == key]:
            self._open.pop(open_key, None)


class TaskLease:
    """Keeps a SplitPipeline (the Python function its ranges call) alive while a task's dataset is."""

    def __init__(self, pipeline: SplitPipeline, key: int):
        self.pipeline = pipeline
        self.key = key

    def waited_s(self) -> float:
        """Seconds the task's dataset has waited for its ranges so far (SplitPipeline.waited_s)."""
        return self.pipeline.waited_s(self.key)


class FinishedPipeline:
    """A SplitPipeline in one finished form: its graph, kept, and made into each task's dataset."""

    def __init__(self, pipeline: SplitPipeline, template: graph_lib.Template, key_nodes: list[str]):
        self.pipeline = pipeline
        self._template = template
        self._key_nodes = key_nodes

    def dataset(
        self, supply: RangeSupply, rewrite: Callable[[bytes], bytes] | None = None
    ) -> tuple[tf.data.Dataset, TaskLease]:
        """A dataset of the pipeline over the ranges `supply` yields, and what to keep referenced
        while it is iterated (the supply is forgotten when that goes). `rewrite`, where given,
        changes the task's graph (its seeds) before it is made."""
        lease = self.pipeline.lease(supply)
        graph = graph_pb2.GraphDef()
        graph.CopyFrom(self._template.graph)
        nodes = {node.name: node for node in graph.node}
        for name in self._key_nodes:
            nodes[name].attr["value"].tensor.CopyFrom(tf.make_tensor_proto(lease.key, tf.int64))
        graph_bytes = graph.SerializeToString()
        if rewrite is not None:
            graph_bytes = rewrite(graph_bytes)
        return self._template.dataset(graph_bytes), lease


def _parse(graph_bytes: bytes) -> graph_pb2.GraphDef:
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(graph_bytes)
    return graph


def _is_int64_scalar(node: node_def_pb2.NodeDef, value: int) -> bool:
    if node.op != "Const" or node.attr["dtype"].type != tf.int64.as_datatype_enum:
        return False
    array = tf.make_ndarray(node.attr["value"].tensor)
    return array.shape == () and int(array) == value


def _rebuild(
    graph_bytes: bytes,
    element_spec: Any,
    sources: Sequence[Source],
    split_ranges: Callable[[Source], tf.data.Dataset],
) -> tuple[tf.data.Dataset, Any]:
    """The pipeline with every source replaced by its elements for the ranges `split_ranges(source)` yields.

    `split_ranges(source)` returns a dataset of (begin, end) int64 pairs; it is
    re-iterated each time the pipeline restarts the source (a repeat()).
    Returns (dataset, keepalive): keep `keepalive` referenced while the dataset is used.
    """
    graph = _parse(graph_bytes)
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
    for name in sorted({r for s in sources for r in s.absorbed_repeats}):
        # The source's splits already count the repetitions: the repeat runs once.
        once = graph.node.add(name=f"{name}/dataservice_once", op="Const")
        once.attr["dtype"].type = tf.int64.as_datatype_enum
        once.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(1, tf.int64))
        nodes[name].input[1] = once.name

    def build():
        input_map = {}
        for s in sources:
            original = originals[s.node_name]
            local = split_ranges(s).flat_map(
                lambda begin, end, s=s, original=original: range_dataset(s, original, begin, end)
            )
            input_map[s.node_name + ":0"] = tf_internal.variant_tensor(local)
        return tf.graph_util.import_graph_def(graph, input_map=input_map, return_elements=[output], name="")[0]

    # Python functions the pipeline calls (the ranges' generators) live as long as the outermost
    # graph they were made under: a graph of the pipeline's own, held by the wrapped function, or
    # they would stay in the process's default graph for good.
    with tf.Graph().as_default():
        wrapped = tf.compat.v1.wrap_function(build, [])
    variant = wrapped()
    # The call added the functions the rebuilt pipeline uses to the eager context: they go with
    # the keepalive, or every pipeline rebuilt would leave its own there for the process's life.
    used = [f.signature.name for f in wrapped.graph.as_graph_def().library.function]
    weakref.finalize(wrapped, tf_internal.remove_eager_functions, used)
    return tf.data.experimental.from_variant(variant, element_spec), wrapped
