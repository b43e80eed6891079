"""Chunks on the wire: frames of a protobuf header and raw buffers.

A data message (a StreamElements or GetElement response) over gRPC is a frame:

    u32 little-endian header size | header (the response proto) | buffers

The header lists the chunks (chunk.py) and, for each component, its dtype,
shape and buffer sizes; the buffers follow in chunk, then component order,
each at an offset that is a multiple of 8 from the frame's start. The worker
builds a frame with one copy (joining the header and the arrays' memory) and
the client reads each column as a numpy view of the received bytes, or, where
that view is not aligned as TensorFlow needs to adopt it, as an aligned copy
made on the receiving thread: no tensor byte goes through protobuf.

Over the worker's stream transfers (tcp.py: TCP, or a Unix socket on the same
host) the same header and buffers travel as a stream message whose body the
worker sends from the arrays' own memory (the elements of a column back to
back, whichever chunks they were produced in) and the client receives
straight into aligned memory: no copy at either end besides the kernel's.

Composite tensors (sparse, ragged) travel as their component tensors, in
tf.nest.flatten(expand_composites=True) order, and are rebuilt inside tf.data
on the client (or by reader.py's element layout, without TensorFlow).

Nothing here imports TensorFlow: WireCodec knows each component's column kind
and dtype number; element_codec.py makes one from a TensorFlow element spec
and adds what workers need to turn tensors into chunks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np
from google.protobuf.message import Message

from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer import compression
from dataservice.v1 import common_pb2

Components = list[np.ndarray]
# A worker sends a message with nothing in it on a stream it has sent nothing on for this long,
# so that the client can tell a quiet stream (a slow pipeline, no credits) from a silent peer
# (a partitioned or frozen host), which sends not even that: the client's stream_timeout_ms.
STREAM_KEEPALIVE_S = 1.0
# Bytes on their way into a message: bytes, a memoryview, or a 1-D uint8 array viewing a column.
Buffer = bytes | memoryview | np.ndarray
Header = TypeVar("Header", bound=Message)


class Contiguous(list):
    """Buffers laid out back to back, with no padding between them: the parts of one buffer
    (a column's values from several chunks), sent from their own memory."""


BufferEntry = Buffer | Contiguous

_HEADER_SIZE = struct.Struct("<I")
_ALIGNMENT = 8
TF_ALIGNMENT = chunk_lib.TF_ALIGNMENT
_PADDING = bytes(TF_ALIGNMENT)
# A stream data message's sizes: its header's and its body's.
STREAM_PREFIX = struct.Struct("<IQ")


def nbytes(buffer: BufferEntry) -> int:
    if isinstance(buffer, Contiguous):
        return sum(nbytes(part) for part in buffer)
    if isinstance(buffer, np.ndarray):
        return buffer.nbytes
    return memoryview(buffer).nbytes


def frame(header: Message, buffers: Sequence[BufferEntry] = ()) -> bytes:
    """The header and the buffers as one gRPC message (the only copy of the buffers' bytes)."""
    head = header.SerializeToString()
    parts: list[Buffer] = [_HEADER_SIZE.pack(len(head)), head]
    body, _ = _body(buffers, _ALIGNMENT, _HEADER_SIZE.size + len(head))
    return b"".join(parts + body)


def unframe(data: bytes, header_type: type[Header]) -> tuple[Header, FrameBuffers]:
    """The frame's header and its buffers."""
    if len(data) < _HEADER_SIZE.size:
        raise ValueError(f"a data message of {len(data)} bytes is too short to be a frame")
    (size,) = _HEADER_SIZE.unpack_from(data)
    end = _HEADER_SIZE.size + size
    if end > len(data):
        raise ValueError(f"a frame's header claims {size} bytes but the message has {len(data)}")
    return header_type.FromString(memoryview(data)[_HEADER_SIZE.size : end]), FrameBuffers(data, end, _ALIGNMENT)


def stream_message(header: Message, buffers: Sequence[BufferEntry] = ()) -> list[Buffer]:
    """The header and the buffers as the parts of one stream data message (tcp.py), sent as
    they are:

        u32 header size | u64 body size | header | body

    The body holds the buffers at offsets from its start that are multiples of
    TF_ALIGNMENT: received into TF_ALIGNMENT-aligned memory, every numeric
    column is where TensorFlow adopts it without a copy."""
    head = header.SerializeToString()
    body, body_size = _body(buffers, TF_ALIGNMENT, 0)
    return [STREAM_PREFIX.pack(len(head), body_size), head, *body]


def stream_body(buffers: Sequence[BufferEntry]) -> tuple[list[Buffer], int]:
    """The body of stream_message(header, buffers): its parts and its size."""
    return _body(buffers, TF_ALIGNMENT, 0)


def _body(buffers: Sequence[BufferEntry], alignment: int, offset: int) -> tuple[list[Buffer], int]:
    """The buffers, each padded to start at a multiple of `alignment` counting from `offset`
    bytes before the first (the parts of a Contiguous buffer without padding between them),
    and their size with the padding."""
    parts: list[Buffer] = []
    start = offset
    for buffer in buffers:
        padding = -offset % alignment
        if padding:
            parts.append(_PADDING[:padding])
        if isinstance(buffer, Contiguous):
            parts.extend(buffer)
        else:
            parts.append(buffer)
        offset += padding + nbytes(buffer)
    return parts, offset - start


class Buffers(Protocol):
    """Where a chunk's decoding takes its buffers from, in order: a received frame
    (FrameBuffers) or an in-process transfer's list (transfer/local.py's BufferList)."""

    def take(self, size: int) -> memoryview: ...


class FrameBuffers:
    """The tensor buffers of one data message, taken in order: each starts at the
    next multiple of the message's alignment."""

    def __init__(self, data: bytes | np.ndarray, offset: int, alignment: int):
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


class WireCodec:
    """Encodes and decodes the chunks of one element layout: per component (flattened,
    composites expanded), its column's kind and its dtype as TensorFlow numbers it."""

    def __init__(self, kinds: Sequence[chunk_lib.ColumnKind], dtype_enums: Sequence[int]):
        if len(kinds) != len(dtype_enums):
            raise ValueError(f"{len(kinds)} column kinds but {len(dtype_enums)} dtypes")
        self.kinds = list(kinds)
        self.dtype_enums = list(dtype_enums)
        # Every component has one shape for all elements: stacked columns.
        self.fixed_shapes = all(kind.fixed_shape is not None for kind in self.kinds)

    @property
    def element_bytes(self) -> int:
        """Bytes of one element when every component has a fixed shape and size (else 0)."""
        if not self.fixed_shapes or any(kind.is_string for kind in self.kinds):
            return 0
        return sum(kind.values_per_element * kind.dtype.itemsize for kind in self.kinds)

    # ---- encoding (workers) ----------------------------------------------

    def encode(
        self, chunks: Sequence[chunk_lib.Chunk], compressor: compression.StreamCompressor | None = None
    ) -> tuple[common_pb2.ElementChunk, list[BufferEntry]]:
        """Consecutive chunks as one chunk of the wire and the buffers that follow it in a
        message: each column's values from every chunk back to back, as they are (compressed
        where `compressor`, the stream's, says so)."""
        proto = common_pb2.ElementChunk(num_elements=sum(c.num_elements for c in chunks))
        buffers: list[BufferEntry] = []
        for i, (kind, dtype_enum) in enumerate(zip(self.kinds, self.dtype_enums)):
            columns = [c.columns[i] for c in chunks if c.num_elements]
            tensor = proto.components.add(dtype=dtype_enum)
            if kind.is_string:
                lengths = _joined([c.lengths for c in columns], np.int64)
                tensor.lengths_size = lengths.nbytes
                buffers.append(lengths.view(np.uint8))
            if kind.fixed_shape is None:
                shapes = _joined([c.shapes.reshape(-1) for c in columns], np.int64)
                tensor.shapes_size = shapes.nbytes
                buffers.append(shapes.view(np.uint8))
            if kind.fixed_shape is not None and not kind.is_string:
                tensor.shape.extend([proto.num_elements, *kind.fixed_shape])
            else:
                tensor.shape.append(sum(len(c.values) for c in columns) if not kind.is_string else len(lengths))
            parts = Contiguous(_bytes_view(c.values) for c in columns if c.values.nbytes)
            size = nbytes(parts)
            values: BufferEntry = parts
            if compressor is not None and size:
                codec, payload = compressor.compress(i, parts)
                if codec != common_pb2.COMPRESSION_NONE:
                    tensor.compression = codec
                    tensor.uncompressed_size = size
                    values, size = payload, nbytes(payload)
            tensor.size = size
            buffers.append(values)
        return proto, buffers

    # ---- decoding (clients) ----------------------------------------------

    def decode(self, proto: common_pb2.ElementChunk, buffers: Buffers) -> chunk_lib.Chunk:
        """The chunk's columns, taken from `buffers`: views of the received message unless
        compressed, or unaligned (then aligned copies). Raises ValueError for a chunk that does
        not fit the element spec."""
        if len(proto.components) != len(self.kinds):
            raise ValueError(
                f"a chunk has {len(proto.components)} components but the element spec has {len(self.kinds)}"
            )
        n = proto.num_elements
        columns = []
        for tensor, kind in zip(proto.components, self.kinds):
            lengths = shapes = None
            if kind.is_string:
                lengths = np.frombuffer(buffers.take(tensor.lengths_size), np.int64)
                _check(not len(lengths) or int(lengths.min()) >= 0)
            if kind.fixed_shape is None:
                shapes = np.frombuffer(buffers.take(tensor.shapes_size), np.int64)
                _check(not len(shapes) or int(shapes.min()) >= 0)
                if kind.rank is not None:
                    _check(len(shapes) == n * kind.rank)
                    shapes = shapes.reshape(n, kind.rank)
            data = compression.decompress(tensor.compression, buffers.take(tensor.size), tensor.uncompressed_size)
            if tensor.dtype != self.dtype_enums[len(columns)]:
                raise ValueError(f"a chunk's component {len(columns)} has dtype {tensor.dtype}, not the spec's")
            if kind.is_string:
                values = np.frombuffer(data, np.uint8)
                _check(values.nbytes == int(lengths.sum()))
            else:
                values = np.frombuffer(data, kind.dtype)
                if kind.fixed_shape is not None:
                    _check(len(values) == n * kind.values_per_element)
                    values = values.reshape(n, *kind.fixed_shape)
                values = chunk_lib.aligned(values)
            column = chunk_lib.Column(values, lengths, shapes)
            if kind.fixed_shape is None or kind.is_string:
                counts = chunk_lib.element_counts(kind, column, n)
                _check(int(counts.sum()) == (len(lengths) if kind.is_string else len(values)))
            columns.append(column)
        return chunk_lib.Chunk(self.kinds, n, columns)


def _check(ok: bool) -> None:
    if not ok:
        raise ValueError("a chunk's buffers do not match the sizes its header gives")


def _joined(arrays: Sequence[np.ndarray], dtype) -> np.ndarray:
    if len(arrays) == 1:
        return np.ascontiguousarray(arrays[0], dtype)
    if not arrays:
        return np.zeros(0, dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a 1-D uint8 array (a view when it is contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def tf_aligned(array: np.ndarray) -> np.ndarray:
    return chunk_lib.aligned(array)


def tf_aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return chunk_lib.aligned_empty(shape, dtype)
