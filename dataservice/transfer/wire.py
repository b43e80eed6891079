"""Elements on the wire: frames of a protobuf header and raw tensor buffers.

A data message (a StreamElements or GetElement response) over gRPC is a frame:

    u32 little-endian header size | header (the response proto) | buffers

The header lists the chunks and, for each tensor, its dtype, shape and buffer
size; the buffers follow in chunk, then component order, each at an offset
that is a multiple of 8 from the frame's start. The worker builds a frame
with one copy (joining the header and the arrays' memory) and the client
reads each tensor as a numpy view of the received bytes, or, where that view
is not aligned as TensorFlow needs to adopt it, as an aligned copy made on the
receiving thread: no tensor byte goes through protobuf, and no TensorProto is
built per element.

Over the worker's TCP data transfer (tcp_transfer.py) the same header and
buffers travel as a stream message whose body the worker sends from the
arrays' own memory and the client receives straight into aligned memory: no
copy at either end besides the kernel's.

Composite tensors (sparse, ragged) travel as their component tensors, in
tf.nest.flatten(expand_composites=True) order, and are rebuilt inside tf.data
on the client. When every component has a fully defined shape, consecutive
elements are stacked into one chunk so that the client hands tf.data a few
large arrays instead of many small ones.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, List, Sequence, Tuple, Type, TypeVar, Union

import numpy as np
import tensorflow as tf
from google.protobuf.message import Message

from dataservice import tf_internal
from dataservice.transfer import compression
from dataservice.v1 import common_pb2

Components = List[np.ndarray]
# A tensor's bytes on their way into a frame: bytes, or a 1-D uint8 array viewing the tensor.
Buffer = Union[bytes, np.ndarray]
Header = TypeVar("Header", bound=Message)

_HEADER_SIZE = struct.Struct("<I")
_ALIGNMENT = 8
# TensorFlow adopts a numpy array's memory as a tensor's when it is aligned to this
# (EIGEN_MAX_ALIGN_BYTES); otherwise it copies the array as tf.data takes it.
TF_ALIGNMENT = 64
_PADDING = bytes(TF_ALIGNMENT)
# A TCP data message's sizes: its header's and its body's.
STREAM_PREFIX = struct.Struct("<IQ")


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype_enum: int) -> np.dtype:
    return np.dtype(tf.dtypes.as_dtype(dtype_enum).as_numpy_dtype)


def frame(header: Message, buffers: Sequence[Buffer] = ()) -> bytes:
    """The header and the buffers as one gRPC message (the only copy of the buffers' bytes)."""
    head = header.SerializeToString()
    parts: List[Buffer] = [_HEADER_SIZE.pack(len(head)), head]
    body, _ = _body(buffers, _ALIGNMENT, _HEADER_SIZE.size + len(head))
    return b"".join(parts + body)


def unframe(data: bytes, header_type: Type[Header]) -> Tuple[Header, "FrameBuffers"]:
    """The frame's header and its buffers."""
    if len(data) < _HEADER_SIZE.size:
        raise ValueError(f"a data message of {len(data)} bytes is too short to be a frame")
    (size,) = _HEADER_SIZE.unpack_from(data)
    end = _HEADER_SIZE.size + size
    if end > len(data):
        raise ValueError(f"a frame's header claims {size} bytes but the message has {len(data)}")
    return header_type.FromString(memoryview(data)[_HEADER_SIZE.size : end]), FrameBuffers(data, end, _ALIGNMENT)


def stream_message(header: Message, buffers: Sequence[Buffer] = ()) -> List[Buffer]:
    """The header and the buffers as the parts of one TCP data message (tcp_transfer.py), sent as
    they are:

        u32 header size | u64 body size | header | body

    The body holds the buffers at offsets from its start that are multiples of
    TF_ALIGNMENT: received into TF_ALIGNMENT-aligned memory, every numeric
    tensor is where TensorFlow adopts it without a copy."""
    head = header.SerializeToString()
    body, body_size = _body(buffers, TF_ALIGNMENT, 0)
    return [STREAM_PREFIX.pack(len(head), body_size), head, *body]


def _body(buffers: Sequence[Buffer], alignment: int, offset: int) -> Tuple[List[Buffer], int]:
    """The buffers, each padded to start at a multiple of `alignment` counting from `offset`
    bytes before the first, and their size with the padding."""
    parts: List[Buffer] = []
    start = offset
    for buffer in buffers:
        padding = -offset % alignment
        if padding:
            parts.append(_PADDING[:padding])
        parts.append(buffer)
        offset += padding + len(buffer)
    return parts, offset - start


class FrameBuffers:
    """The tensor buffers of one data message, taken in order: each starts at the
    next multiple of the message's alignment."""

    def __init__(self, data: Union[bytes, np.ndarray], offset: int, alignment: int):
        self._data = memoryview(data)
        self._offset = offset
        self._alignment = alignment

    def take(self, size: int) -> memoryview:
        start = self._offset + (-self._offset % self._alignment)
        if start + size > len(self._data):
            raise ValueError(
                f"a data message of {len(self._data)} bytes ends inside a buffer ({size} bytes at {start})"
            )
        self._offset = start + size
        return self._data[start : start + size]

    @property
    def unread(self) -> int:
        """Bytes of the message after the last buffer taken."""
        return len(self._data) - self._offset


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

    @property
    def element_bytes(self) -> int:
        """Bytes of one element when every component has a fixed shape and size (else 0)."""
        if not self.stackable or any(self.is_string):
            return 0
        return sum(spec.shape.num_elements() * spec.dtype.size for spec in self.component_specs)

    def to_components(self, element: Any) -> Components:
        """An element from a tf.data iterator as numpy arrays, one per component."""
        if self._single_tensor:
            return self.tensors_to_components([element])
        return self.tensors_to_components(tf.nest.flatten(element, expand_composites=True))

    def tensors_to_components(self, tensors: Sequence[tf.Tensor]) -> Components:
        """The element's component tensors (flattened, composites expanded) as numpy arrays.

        Numeric arrays are views of the tensors' own memory, which they keep alive:
        `numpy()` copies every array (so that callers may write to it), and a worker
        only reads and sends them."""
        return [
            np.asarray(t.numpy(), dtype=object) if is_string else tf_internal.tensor_memory(t)
            for t, is_string in zip(tensors, self.is_string)
        ]

    @staticmethod
    def nbytes(components: Components) -> int:
        total = 0
        for array in components:
            if array.dtype == object:
                total += sum(len(x) for x in array.reshape(-1))
            else:
                total += array.nbytes
        return total

    # ---- encoding (workers) ----------------------------------------------

    def encode(
        self, elements: Sequence[Components], compression_mode: int = common_pb2.COMPRESSION_NONE
    ) -> Tuple[List[common_pb2.ElementChunk], List[Buffer]]:
        """Elements as chunks (one stacked chunk when stackable, else one chunk per
        element) and the buffers that follow them in a frame, each compressed as the
        stream's `compression_mode` says (transfer/compression.py)."""
        if not elements:
            return [], []
        if self.stackable:
            if len(elements) == 1:
                stacked = [a[np.newaxis] for a in elements[0]]
            else:
                stacked = [np.stack([e[i] for e in elements]) for i in range(len(self.component_specs))]
            groups = [(len(elements), stacked)]
        else:
            groups = [(1, e) for e in elements]
        chunks, buffers = [], []
        for num_elements, components in groups:
            chunk = common_pb2.ElementChunk(num_elements=num_elements)
            for array, dtype_enum, is_string in zip(components, self.dtype_enums, self.is_string):
                tensor = chunk.components.add(dtype=dtype_enum, shape=array.shape)
                if is_string:
                    flat = array.reshape(-1)
                    buffer: Buffer = b"".join(flat)
                    tensor.string_lengths.extend(len(x) for x in flat)
                else:
                    buffer = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                if compression_mode != common_pb2.COMPRESSION_NONE:
                    codec, payload = compression.compress(buffer, compression_mode)
                    if codec != common_pb2.COMPRESSION_NONE:
                        tensor.compression = codec
                        tensor.uncompressed_size = len(buffer)
                        buffer = payload
                tensor.size = len(buffer)
                buffers.append(buffer)
            chunks.append(chunk)
        return chunks, buffers

    # ---- decoding (clients) ----------------------------------------------

    def decode(self, chunk: common_pb2.ElementChunk, buffers: FrameBuffers) -> tuple:
        """The chunk's components as numpy arrays, taken from `buffers` (views of the
        received message unless compressed or strings; stacked chunks keep their
        leading dimension)."""
        if len(chunk.components) != len(self.component_specs):
            raise ValueError(
                f"a chunk has {len(chunk.components)} components but the element spec has {len(self.component_specs)}"
            )
        out = []
        for tensor, is_string in zip(chunk.components, self.is_string):
            shape = tuple(tensor.shape)
            buffer = buffers.take(tensor.size)
            buffer = compression.decompress(tensor.compression, buffer, tensor.uncompressed_size)
            if is_string:
                array = np.empty(len(tensor.string_lengths), dtype=object)
                start = 0
                for i, length in enumerate(tensor.string_lengths):
                    array[i] = bytes(buffer[start : start + length])
                    start += length
                out.append(array.reshape(shape))
            else:
                out.append(tf_aligned(np.frombuffer(buffer, dtype=numpy_dtype(tensor.dtype)).reshape(shape)))
        return tuple(out)


def tf_aligned(array: np.ndarray) -> np.ndarray:
    """`array`, copied to TF_ALIGNMENT-aligned memory unless it is there already.

    TensorFlow would copy an unaligned array anyway, on the tf.data thread that
    hands elements to the training loop; copying here, on the thread that
    receives the frame, takes that copy off the consumer's path (and frees the
    frame sooner)."""
    if array.ctypes.data % TF_ALIGNMENT == 0 or array.nbytes == 0:
        return array
    aligned = tf_aligned_empty(array.shape, array.dtype)
    np.copyto(aligned, array)
    return aligned


def tf_aligned_empty(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array at a TF_ALIGNMENT-aligned address."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + TF_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % TF_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)
