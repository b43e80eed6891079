"""Moving a tf.data pipeline between processes.

The client serializes the pipeline to a GraphDef; the dispatcher checks and
fingerprints it; a worker rebuilds a dataset from it. The element spec travels
beside it as a StructuredValue proto.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import struct_pb2

from dataservice import tf_internal

log = logging.getLogger(__name__)

# Ops that call back into the Python interpreter of the process that built
# the pipeline: a worker in another process cannot run them.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
_PYTHON_OP_HINT = (
    "it comes from tf.py_function, tf.numpy_function or Dataset.from_generator, whose Python code "
    "cannot run on a remote worker; express that step with TensorFlow ops, or do it after distribute()"
)


class InvalidDatasetError(ValueError):
    """The pipeline cannot be served: the message says why and what to do."""


def serialize_dataset(dataset: tf.data.Dataset) -> bytes:
    """The pipeline's GraphDef bytes, device assignments stripped so any worker can run it."""
    return tf_internal.serialize_dataset_graph(dataset)


def encode_element_spec(element_spec: Any) -> bytes:
    return tf_internal.encode_structure(element_spec).SerializeToString()


def decode_element_spec(data: bytes) -> Any:
    proto = struct_pb2.StructuredValue()
    proto.ParseFromString(data)
    return tf_internal.decode_structure(proto)


def parse_graph(graph_bytes: bytes) -> graph_pb2.GraphDef:
    """Parses and checks a pipeline GraphDef; InvalidDatasetError says what is wrong."""
    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(graph_bytes)
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise InvalidDatasetError(f"the dataset graph is not a serialized GraphDef ({e})") from None
    if not any(node.op == "_Retval" for node in graph.node):
        raise InvalidDatasetError(
            "the dataset graph has no '_Retval' node: serialize it with Dataset._as_serialized_graph()"
        )
    for op, where in _all_ops(graph):
        if op in PYTHON_OPS:
            raise InvalidDatasetError(f"the dataset uses the op {op} ({where}): {_PYTHON_OP_HINT}")
    return graph


def _all_ops(graph: graph_pb2.GraphDef) -> Iterable[tuple[str, str]]:
    for node in graph.node:
        yield node.op, f"node {node.name!r}"
    for function in graph.library.function:
        for node in function.node_def:
            yield node.op, f"node {node.name!r} of function {function.signature.name!r}"


def fingerprint(graph: graph_pb2.GraphDef) -> str:
    """A digest that is equal for two serializations of the same pipeline.

    Serializing the same pipeline twice differs only in generated names: the
    library functions' counters, the per-graph op ids in `metadata` attrs and
    resource handle names (a shuffle's seed generator). All three are
    canonicalized before hashing.
    """
    canonical = graph_pb2.GraphDef()
    canonical.CopyFrom(graph)
    renames = _canonical_function_names(canonical)
    for node in _all_nodes(canonical):
        if node.op in renames:
            node.op = renames[node.op]
        if "metadata" in node.attr:
            del node.attr["metadata"]
        for value in node.attr.values():
            _rename_in_attr(value, renames)
    for function in canonical.library.function:
        function.signature.name = renames[function.signature.name]
    canonical.library.function.sort(key=lambda f: f.signature.name)
    return hashlib.sha256(canonical.SerializeToString(deterministic=True)).hexdigest()


def _all_nodes(graph: graph_pb2.GraphDef):
    yield from graph.node
    for function in graph.library.function:
        yield from function.node_def


def _canonical_function_names(graph: graph_pb2.GraphDef) -> dict[str, str]:
    """Numbers library functions in the order a walk from the graph's nodes first meets them."""
    functions = {f.signature.name: f for f in graph.library.function}
    order: list[str] = []

    def visit_nodes(nodes) -> None:
        for node in nodes:
            names = [node.op] if node.op in functions else []
            for key in sorted(node.attr):
                names.extend(_functions_in_attr(node.attr[key]))
            for name in names:
                if name in functions and name not in order:
                    order.append(name)
                    visit_nodes(functions[name].node_def)

    visit_nodes(graph.node)
    order.extend(sorted(n for n in functions if n not in order))
    return {name: f"function_{i}" for i, name in enumerate(order)}


def _functions_in_attr(value) -> list[str]:
    kind = value.WhichOneof("value")
    if kind == "func":
        return [value.func.name]
    if kind == "list":
        return [f.name for f in value.list.func]
    return []


def _rename_in_attr(value, renames: dict[str, str]) -> None:
    kind = value.WhichOneof("value")
    if kind == "func" and value.func.name in renames:
        value.func.name = renames[value.func.name]
    elif kind == "list":
        for f in value.list.func:
            if f.name in renames:
                f.name = renames[f.name]
    elif kind == "tensor":
        for handle in value.tensor.resource_handle_val:
            handle.name = ""
            handle.hash_code = 0


def dataset_from_graph(graph_bytes: bytes, element_spec: Any) -> tf.data.Dataset:
    """Rebuilds the pipeline in this process."""
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_bytes)
    return tf.data.experimental.from_variant(variant, element_spec)


@dataclasses.dataclass(frozen=True)
class Template:
    """A pipeline's graph, kept to make datasets from copies of it that differ a little (a
    task's key, its seeds): as it is, or finalized once (finalized_template)."""

    graph: graph_pb2.GraphDef
    element_spec: Any
    # The options of each copy where the graph is finalized (finalized_options), else None.
    options: tf.data.Options | None = None

    def dataset(self, graph_bytes: bytes) -> tf.data.Dataset:
        """A dataset of `graph_bytes`, a copy of the template's graph."""
        dataset = dataset_from_graph(graph_bytes, self.element_spec)
        return dataset if self.options is None else dataset.with_options(self.options)


def template(dataset: tf.data.Dataset) -> Template:
    """The dataset's graph as it is (its ops of external state kept)."""
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(tf_internal.serialize_dataset_graph(dataset, warn_external_state=False))
    return Template(graph, dataset.element_spec)


def finalized_template(dataset: tf.data.Dataset) -> Template:
    """The dataset's graph as its first iterator would run it, for copies that are iterated
    as they are (a transformation applied to one would not be optimized); the graph as it is
    where TensorFlow cannot serialize the finalized pipeline."""
    try:
        graph = tf_internal.finalized_dataset_graph(dataset)
    except tf.errors.OpError as e:
        log.warning("could not keep a pipeline optimized; each copy optimizes anew: %s", e.message)
        return template(dataset)
    _drop_options_datasets(graph)
    return Template(graph, dataset.element_spec, finalized_options(dataset.options()))


def _drop_options_datasets(graph: graph_pb2.GraphDef) -> None:
    """Takes the pipeline's OptionsDataset nodes out of a finalized graph, joining each one's
    consumers to its input: the options are applied, and those a copy still needs come with
    finalized_options; left in, they would have each copy finalized (optimized) anew."""
    dropped = {node.name: node.input[0] for node in graph.node if node.op == "OptionsDataset"}
    if not dropped:
        return

    def upstream(name: str) -> str:
        while name.split(":")[0] in dropped:
            name = dropped[name.split(":")[0]]
        return name

    kept = [node for node in graph.node if node.name not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = upstream(name)
    del graph.node[:]
    graph.node.extend(kept)


def finalized_options(options: tf.data.Options) -> tf.data.Options:
    """The options for datasets made from a finalized graph (tf_internal.finalized_dataset_graph)
    of a pipeline whose options were `options`.

    Each new dataset object's first iterator finalizes it, and for a pipeline
    that means tf.data's static optimizations: Grappler imports, rewrites and
    exports the whole graph, most of what making a task's iterator costs. A
    graph finalized once already holds the rewrites and the thread pools, so
    its copies get options that ask for neither and keep those of `options`
    that act while the pipeline runs. Autotuning is among those: the
    iterator of a copy makes the autotuning model that the graph's own
    ModelDataset then shares, as a first iterator does."""
    kept = tf.data.Options()
    kept.experimental_optimization.apply_default_optimizations = False
    for section, name in _RUNTIME_OPTIONS:
        value = getattr(getattr(options, section) if section else options, name)
        if value is not None:
            setattr(getattr(kept, section) if section else kept, name, value)
    return kept


# Options that act while an iterator runs rather than at finalization: (section, name).
_RUNTIME_OPTIONS = (
    ("", "experimental_warm_start"),
    ("", "experimental_symbolic_checkpoint"),
    ("", "experimental_external_state_policy"),
    ("", "dataset_name"),
    ("autotune", "enabled"),
    ("autotune", "autotune_algorithm"),
    ("autotune", "cpu_budget"),
    ("autotune", "ram_budget"),
    ("autotune", "initial_parallelism"),
    ("autotune", "min_parallelism"),
)


def check_element_spec(element_spec: Any) -> None:
    """Elements travel as dense tensors (composites through their components): the
    spec must flatten to TensorSpecs of transferable dtypes."""
    for spec in tf.nest.flatten(element_spec, expand_composites=True):
        if not isinstance(spec, tf.TensorSpec):
            raise InvalidDatasetError(
                f"elements of type {type(spec).__name__} cannot be sent by the service; "
                "elements must be (nests of) tensors, SparseTensors or RaggedTensors"
            )
        if spec.dtype in (tf.variant, tf.resource):
            raise InvalidDatasetError(
                f"elements containing {spec.dtype.name} tensors (datasets, optionals, "
                "TensorArrays) cannot be sent by the service"
            )
