"""Every use of TensorFlow's private APIs, behind one module.

The service needs a few things that TensorFlow has no public API for: the
serialized graph of a dataset (also as finalized for its first iterator), the
variant tensor behind it, the memory of an eager tensor without a copy, a
scan whose function may end the dataset, the element-spec coder, the flat
types and shapes of a structure, the iterator's resource and the op that
reads it, a Grappler setting in the eager context's configuration, warnings
to silence, and a test transformation. A TensorFlow upgrade that moves one of
them touches this file alone; tests/unit/test_tf_internal.py fails on the
upgrade when one is gone.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, struct_pb2
from tensorflow.python.data.experimental.ops import testing as _data_testing
from tensorflow.python.data.ops import dataset_ops as _dataset_ops
from tensorflow.python.data.ops import structured_function as _structured_function
from tensorflow.python.data.util import structure as _structure
from tensorflow.python.eager import context as _context
from tensorflow.python.ops import gen_dataset_ops as _gen_dataset_ops
from tensorflow.python.ops import gen_experimental_dataset_ops as _gen_experimental_dataset_ops
from tensorflow.python.saved_model import nested_structure_coder as _nested_structure_coder
from tensorflow.python.util import deprecation as _deprecation


def serialize_dataset_graph(dataset: tf.data.Dataset, warn_external_state: bool = True) -> bytes:
    """The pipeline's GraphDef bytes, device assignments stripped so any host can run it; ops with
    external state (a shuffle's seed generator, say) are kept, with a warning unless
    `warn_external_state` is False, as TensorFlow's service does."""
    policy = tf.data.experimental.ExternalStatePolicy
    try:
        return _dataset_value(
            dataset,
            lambda: dataset._as_serialized_graph(
                external_state_policy=policy.WARN if warn_external_state else policy.IGNORE,
                strip_device_assignment=True,
            ),
        )
    except tf.errors.FailedPreconditionError as e:
        # TensorFlow's service words it so (a resource on another device, as a rule).
        raise tf.errors.FailedPreconditionError(
            e.node_def,
            e.op,
            "Serialization error while trying to register a dataset with the service: the dataset may depend on "
            "a resource located on a different device; call register_dataset() on the device that holds the "
            f"resource, then from_dataset_id() to read it on each device. ({e.message})",
        ) from None


def finalized_dataset_graph(dataset: tf.data.Dataset) -> graph_pb2.GraphDef:
    """The graph of `dataset` as its first iterator runs it: after tf.data's finalization (its
    options' static optimizations, the autotuning model, the thread pools they ask for), with
    ops of external state kept and device assignments cleared.

    TensorFlow's own device stripping leaves the functions that finalization placed on a job
    with a malformed device ('/device::0'), so devices are cleared here instead."""
    finalized = tf.raw_ops.FinalizeDataset(
        input_dataset=dataset._variant_tensor,
        output_types=flat_tensor_types(dataset.element_spec),
        output_shapes=flat_tensor_shapes(dataset.element_spec),
    )
    graph_bytes = tf.raw_ops.DatasetToGraphV2(
        input_dataset=finalized,
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
        strip_device_assignment=False,
    )
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(graph_bytes.numpy())
    for node in graph.node:
        node.device = ""
    for function in graph.library.function:
        for node in function.node_def:
            node.device = ""
    return graph


def dataset_cardinality(dataset: tf.data.Dataset) -> int:
    """The dataset's cardinality as a number (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY or >= 0)."""
    return int(_dataset_value(dataset, dataset.cardinality))


def _dataset_value(dataset: tf.data.Dataset, make: Callable[[], tf.Tensor]):
    """The value of the tensor `make()` computes from `dataset`, now: eagerly for a dataset made
    eagerly (also one a tf.function captured), else as value_now does."""
    if not tf.is_symbolic_tensor(dataset._variant_tensor):
        with tf.init_scope():
            return make().numpy()
    return value_now(make())


def value_now(tensor: tf.Tensor):
    """The value of `tensor` now, also in graph mode (a tf.Graph or a tf.function being traced), where
    the tensor is symbolic: its ops are copied into a graph of their own and run in a session, so the
    graph being built is left as it was. A value that depends on a placeholder, a function argument
    or a tensor captured from outside cannot be known before the graph runs: ValueError."""
    if not tf.is_symbolic_tensor(tensor):
        return tensor.numpy()
    graph_def = _ops_behind(tensor.graph.as_graph_def(), tensor.op.name)
    needs_input = sorted(n.name for n in graph_def.node if n.op in ("Placeholder", "PlaceholderWithDefault"))
    if needs_input:
        raise ValueError(
            "distribute() and register_dataset() serialize the pipeline when they are called, and this "
            f"pipeline depends on values known only when the graph runs ({', '.join(needs_input[:3])}): "
            "build it from constants, or outside the tf.function"
        )
    with tf.Graph().as_default() as graph:
        (copy,) = tf.graph_util.import_graph_def(graph_def, return_elements=[tensor.name], name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(copy)


def remove_eager_functions(names: Sequence[str]) -> None:
    """Removes functions from the eager context's library. Calling a function made with
    tf.compat.v1.wrap_function adds the functions its graph uses (a tf.data pipeline's map and
    generator functions) to that library, and nothing removes them when it is gone: a process
    that makes one per task would keep every task's functions for its life."""
    context = _context.context()
    for name in names:
        if context.has_function(name):
            context.remove_function(name)


def leave_out_tfg_function_pass() -> bool:
    """Turns off Grappler's TFG hook (an MLIR import, shape inference and export of each graph)
    in the configuration of this process's TensorFlow context, which the functions it
    instantiates are optimized under. TensorFlow's public optimizer options do not name the
    setting. Only possible before the context starts (its first op): returns whether it was."""
    context = _context.context()
    if context._context_handle is not None:
        return False
    config = config_pb2.ConfigProto()
    if context._config is not None:
        config.CopyFrom(context._config)
    config.graph_options.rewrite_options.disable_tfg_optimizer = True
    context._config = config
    return True


def eager_mode():
    """A context that runs ops eagerly, also while a tf.Graph is being built (graph mode)."""
    return _context.eager_mode()


def dataset_and_inputs(dataset: tf.data.Dataset) -> list[tf.data.Dataset]:
    """The dataset and every dataset upstream of it (the inputs of its transformations)."""
    found, pending = [], [dataset]
    while pending:
        current = pending.pop()
        if any(current is d for d in found):
            continue
        found.append(current)
        pending += list(current._inputs())
    return found


def has_finite_selector(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline has a sample_from_datasets/choose_from_datasets whose selector (the
    first input of the _DirectedInterleaveDataset) is finite."""
    return any(
        type(d).__name__ == "_DirectedInterleaveDataset"
        and dataset_cardinality(d._inputs()[0]) != tf.data.INFINITE_CARDINALITY
        for d in dataset_and_inputs(dataset)
    )


def variant_tensor(dataset: tf.data.Dataset) -> tf.Tensor:
    """The DT_VARIANT tensor that stands for the dataset in graphs and raw ops."""
    return dataset._variant_tensor


class _EndingScanDataset(_dataset_ops.UnaryDataset):
    """`Dataset.scan` whose function ends the dataset by failing with OutOfRange, as the
    ScanDataset op does when told not to preserve its input's cardinality (tf.data's public
    scan always tells it to, and turns the error into InvalidArgument).

    The function is marked `experimental_ints_on_device` (as tf.data's own prefetch_to_device
    marks its functions): tf.data then instantiates it on the iterator's one device, without the
    full Grappler pass it gives every function it could place on several (no placement to
    decide here: the function runs where its iterator does)."""

    def __init__(self, input_dataset: tf.data.Dataset, initial_state: Any, scan_func: Callable):
        self._name = None
        state = _structure.normalize_element(initial_state)
        state_spec = _structure.type_spec_from_value(state)
        # As tf.data's scan does: trace, and trace again with the state's shapes relaxed to what
        # the function returns (a state that starts empty and grows, say) until they hold. Each
        # pass only relaxes, so this ends (at unknown ranks, the least specific shapes).
        while True:
            wrapped = _structured_function.StructuredFunctionWrapper(
                scan_func,
                "ending_scan",
                input_structure=(state_spec, input_dataset.element_spec),
                add_to_graph=False,
                defun_kwargs={"experimental_ints_on_device": True},
            )
            new_state_spec, self._scan_element_spec = wrapped.output_structure
            tf.nest.assert_same_structure(state_spec, new_state_spec)
            for old, new in zip(tf.nest.flatten(state_spec), tf.nest.flatten(new_state_spec)):
                if old.dtype != new.dtype:
                    raise TypeError(f"scan_func's new state {new_state_spec} has other types than {state_spec}")
            relaxed = tf.nest.map_structure(
                lambda old, new: old.most_specific_common_supertype([new]), state_spec, new_state_spec
            )
            if relaxed == state_spec:
                break
            state_spec = relaxed
        wrapped.function.add_to_graph(tf.compat.v1.get_default_graph())
        variant = _gen_experimental_dataset_ops.scan_dataset(
            input_dataset._variant_tensor,
            _structure.to_tensor_list(state_spec, state),
            wrapped.function.captured_inputs,
            f=wrapped.function,
            preserve_cardinality=False,
            **self._common_args,
        )
        super().__init__(input_dataset, variant)

    @property
    def element_spec(self) -> Any:
        return self._scan_element_spec


def ending_scan(dataset: tf.data.Dataset, initial_state: Any, scan_func: Callable) -> tf.data.Dataset:
    """`dataset.scan(initial_state, scan_func)`, ended early where `scan_func` fails with
    OutOfRange: a `tf.numpy_function` in it raising StopIteration. Ending the data from the
    scan's own function spares a take_while after it, whose function tf.data would otherwise
    optimize and instantiate for every iterator."""
    return _EndingScanDataset(dataset, initial_state, scan_func)


def tensor_memory(tensor: tf.Tensor) -> np.ndarray:
    """A numpy view of an eager tensor's own memory, which keeps the tensor alive.

    `Tensor.numpy()` copies (it hands out a writable array); `memoryview(tensor)`
    would share the memory too but refuses bfloat16. Read-only by contract."""
    return tensor._numpy()


def encode_structure(element_spec: Any) -> struct_pb2.StructuredValue:
    """An element spec (nested TypeSpecs) as the StructuredValue proto that SavedModel uses."""
    return _nested_structure_coder.encode_structure(element_spec)


def decode_structure(proto: struct_pb2.StructuredValue) -> Any:
    return _nested_structure_coder.decode_proto(proto)


def flat_tensor_types(element_spec: Any) -> list[tf.DType]:
    """The dtypes of the spec's flat (variant-encoded where composite) tensors, as raw dataset ops want them."""
    return _structure.get_flat_tensor_types(element_spec)


def flat_tensor_shapes(element_spec: Any) -> list[tf.TensorShape]:
    return _structure.get_flat_tensor_shapes(element_spec)


def iterator_resource(iterator: Any) -> tf.Tensor | None:
    """The resource tensor of an eager tf.data iterator (None if it has none)."""
    return getattr(iterator, "_iterator_resource", None)


def iterator_get_next(
    resource: tf.Tensor, types: Sequence[tf.DType], shapes: Sequence[tf.TensorShape]
) -> list[tf.Tensor]:
    """The next element's flat tensors straight from the IteratorGetNext op: `next()` on the
    iterator also switches the thread's executor and rebuilds the element's structure on every
    call. Raises tf.errors.OutOfRangeError at the end."""
    return _gen_dataset_ops.iterator_get_next(resource, output_types=types, output_shapes=shapes)


@contextlib.contextmanager
def deprecation_warnings_silenced() -> Iterator[None]:
    """For a deliberate use of a deprecated API (from_generator's output_types, which takes the
    faster numpy_function path)."""
    with _deprecation.silence():
        yield


def sleep(sleep_us: int):
    """A dataset transformation that sleeps `sleep_us` microseconds per element in the pipeline's
    own C++ (for latency-bound benchmarks and tests)."""
    return _data_testing.sleep(sleep_us)


@functools.lru_cache(maxsize=1)
def _op_libraries() -> dict[str, str]:
    libraries = {}
    for name in dir(tf.raw_ops):
        module = getattr(getattr(tf.raw_ops, name), "__module__", "") or ""
        leaf = module.rsplit(".", 1)[-1]
        if leaf.startswith("gen_"):
            libraries[name] = leaf[len("gen_") :]
    return libraries


def op_library(op: str) -> str | None:
    """The op library an op's Python wrapper comes from ("math_ops" for Add, from gen_math_ops),
    or None for ops without a public wrapper (internal, test and rewritten ops)."""
    return _op_libraries().get(op)


def registered_op_names() -> list[str]:
    """The names of every op registered in this process (TensorFlow's op registry)."""
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session as _c_api

    buffer = _c_api.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList.FromString(_c_api.TF_GetBuffer(buffer))
    finally:
        _c_api.TF_DeleteBuffer(buffer)
    return [op.name for op in ops.op]


def _ops_behind(graph_def: graph_pb2.GraphDef, name: str) -> graph_pb2.GraphDef:
    """The part of `graph_def` that computes node `name` (its function library whole)."""
    nodes = {node.name: node for node in graph_def.node}
    needed, pending = set(), [name]
    while pending:
        current = pending.pop()
        if current in needed or current not in nodes:
            continue
        needed.add(current)
        pending += [i.lstrip("^").split(":")[0] for i in nodes[current].input]
    part = graph_pb2.GraphDef(versions=graph_def.versions, library=graph_def.library)
    part.node.extend(node for node in graph_def.node if node.name in needed)
    return part
