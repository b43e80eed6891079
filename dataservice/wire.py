"""Elements on the wire: tensors as raw buffers plus dtype and shape.

No TensorProto is built per element. Composite tensors (sparse, ragged) travel
as their component tensors, in tf.nest.flatten(expand_composites=True) order,
and are rebuilt inside tf.data on the client. When every component has a fully
defined shape, consecutive elements are stacked into one chunk so that the
client hands tf.data a few large arrays instead of many small ones.
"""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

import numpy as np
import tensorflow as tf

from dataservice import compression
from dataservice.v1 import common_pb2

Components = List[np.ndarray]


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype_enum: int) -> np.dtype:
    return np.dtype(tf.dtypes.as_dtype(dtype_enum).as_numpy_dtype)


class ElementCodec:
    """Encodes and decodes the elements of one element spec."""

    def __init__(self, element_spec: Any):
        self.element_spec = element_spec
        self.component_specs: List[tf.TensorSpec] = tf.nest.flatten(element_spec, expand_composites=True)
        self.dtype_enums = [spec.dtype.as_datatype_enum for spec in self.component_specs]
        self.is_string = [spec.dtype == tf.string for spec in self.component_specs]
        # Stacking needs equal shapes across elements.
        self.stackable = all(spec.shape.is_fully_defined() for spec in self.component_specs)
        self._single_tensor = isinstance(element_spec, tf.TensorSpec)

    def to_components(self, element: Any) -> Components:
        """An element from a tf.data iterator as numpy arrays, one per component."""
        if self._single_tensor:
            return [np.asarray(element.numpy(), dtype=object if self.is_string[0] else None)]
        return self.tensors_to_components(tf.nest.flatten(element, expand_composites=True))

    def tensors_to_components(self, tensors: Sequence[tf.Tensor]) -> Components:
        """The element's component tensors (flattened, composites expanded) as numpy arrays."""
        return [np.asarray(t.numpy(), dtype=object if s else None) for t, s in zip(tensors, self.is_string)]

    @staticmethod
    def nbytes(components: Components) -> int:
        total = 0
        for array in components:
            if array.dtype == object:
                total += sum(len(x) for x in array.reshape(-1))
            else:
                total += array.nbytes
        return total

    def encode_chunks(self, elements: Sequence[Components], compress: bool = False) -> List[common_pb2.ElementChunk]:
        """Elements as chunks: one stacked chunk when stackable, else one chunk per element.
        `compress`: each tensor buffer is compressed where that pays off."""
        if not elements:
            return []
        if self.stackable and len(elements) > 1:
            stacked = [np.stack([e[i] for e in elements]) for i in range(len(self.component_specs))]
            return [self._chunk(len(elements), stacked, compress)]
        if self.stackable:
            return [self._chunk(1, [a[np.newaxis] for a in elements[0]], compress)]
        return [self._chunk(1, e, compress) for e in elements]

    def _chunk(self, num_elements: int, components: Components, compress: bool) -> common_pb2.ElementChunk:
        chunk = common_pb2.ElementChunk(num_elements=num_elements)
        for array, dtype_enum, is_string in zip(components, self.dtype_enums, self.is_string):
            tensor = chunk.components.add(dtype=dtype_enum, shape=array.shape)
            if is_string:
                flat = array.reshape(-1)
                data = b"".join(flat)
                tensor.string_lengths.extend(len(x) for x in flat)
            else:
                data = np.ascontiguousarray(array).tobytes()
            if compress:
                codec, payload = compression.compress(data)
                if codec != common_pb2.COMPRESSION_NONE:
                    tensor.compression = codec
                    tensor.uncompressed_size = len(data)
                    data = payload
            tensor.data = data
        return chunk

    def decode_chunk(self, chunk: common_pb2.ElementChunk) -> tuple:
        """The chunk's components as numpy arrays; stacked chunks keep their leading dimension."""
        out = []
        for tensor, is_string in zip(chunk.components, self.is_string):
            shape = tuple(tensor.shape)
            data = compression.decompress(tensor.compression, tensor.data, tensor.uncompressed_size)
            if is_string:
                array = np.empty(len(tensor.string_lengths), dtype=object)
                offset = 0
                for i, length in enumerate(tensor.string_lengths):
                    array[i] = data[offset : offset + length]
                    offset += length
                out.append(array.reshape(shape))
            else:
                out.append(np.frombuffer(data, dtype=numpy_dtype(tensor.dtype)).reshape(shape))
        if len(out) != len(self.component_specs):
            raise ValueError(
                f"a chunk has {len(out)} components but the element spec has {len(self.component_specs)}"
            )
        return tuple(out)
