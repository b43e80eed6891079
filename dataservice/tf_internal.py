"""Every use of TensorFlow's private APIs, behind one module.

The service needs a few things that TensorFlow has no public API for: the
serialized graph of a dataset, the variant tensor behind it, the memory of an
eager tensor without a copy, the element-spec coder, the flat types and
shapes of a structure, the iterator's resource and the op that reads it,
warnings to silence, and a test transformation. A TensorFlow upgrade that
moves one of them touches this file alone; tests/unit/test_tf_internal.py
fails on the upgrade when one is gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2
from tensorflow.python.data.experimental.ops import testing as _data_testing
from tensorflow.python.data.util import structure as _structure
from tensorflow.python.ops import gen_dataset_ops as _gen_dataset_ops
from tensorflow.python.saved_model import nested_structure_coder as _nested_structure_coder
from tensorflow.python.util import deprecation as _deprecation


def serialize_dataset_graph(dataset: tf.data.Dataset) -> bytes:
    """The pipeline's GraphDef bytes, device assignments stripped so any host can run it; ops with
    external state (a shuffle's seed generator, say) are kept with a warning, as TensorFlow's
    service does."""
    return dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN,
        strip_device_assignment=True,
    ).numpy()


def variant_tensor(dataset: tf.data.Dataset) -> tf.Tensor:
    """The DT_VARIANT tensor that stands for the dataset in graphs and raw ops."""
    return dataset._variant_tensor


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
