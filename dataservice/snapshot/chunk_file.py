"""Writes one chunk file of a distributed snapshot in TensorFlow's format, which its
SnapshotChunkDataset reads: a TFRecord file (each record framed by its length, the length's
masked CRC-32C, the data and the data's masked CRC-32C) holding, per element, one record per
component, a serialized TensorProto; compressed as a whole with GZIP, or in SNAPPY blocks
(each block's compressed length, 4 bytes big-endian, then the block), or not at all.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from typing import BinaryIO

import cramjam
import google_crc32c
import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

# Uncompressed bytes per snappy block: TensorFlow's reader takes blocks of up to its buffer size.
SNAPPY_BLOCK_BYTES = 256 * 1024
_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def check_plain_tensors(element_spec) -> None:
    """ValueError unless every component is a plain tensor: ragged and sparse components are
    variant tensors in TensorFlow's chunks, which this writer does not produce."""
    import tensorflow as tf

    if not all(type(spec) is tf.TensorSpec for spec in tf.nest.flatten(element_spec)):
        raise ValueError(
            f"distributed_save writes elements of plain tensors; this dataset's are {element_spec} "
            "(convert ragged or sparse components to dense ones before saving)"
        )


def tensor_proto(array: np.ndarray, dtype_enum: int) -> bytes:
    """A component as a serialized TensorProto (what TensorFlow's Tensor::FromProto reads)."""
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape])
    proto = tensor_pb2.TensorProto(dtype=dtype_enum, tensor_shape=shape)
    if array.dtype == object:
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1))
    else:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    return proto.SerializeToString()


class ChunkWriter:
    """Writes elements (lists of numpy components) to `file`; close() makes it durable."""

    def __init__(self, file: str, compression: str, dtype_enums: Sequence[int]):
        if compression not in ("", "SNAPPY", "GZIP"):
            raise ValueError(f"chunk compression must be 'SNAPPY', 'GZIP' or '', got {compression!r}")
        self.file = file
        self.records = 0
        self.elements = 0
        self._compression = compression
        self._dtype_enums = list(dtype_enums)
        self._out: BinaryIO = open(file, "wb")
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 31) if compression == "GZIP" else None

    def write(self, components: Sequence[np.ndarray]) -> None:
        for array, dtype_enum in zip(components, self._dtype_enums):
            data = tensor_proto(array, dtype_enum)
            length = struct.pack("<Q", len(data))
            record = length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))
            self._pending.append(record)
            self._pending_bytes += len(record)
            self.records += 1
        self.elements += 1
        if self._pending_bytes >= SNAPPY_BLOCK_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if self._compression == "SNAPPY":
            for start in range(0, len(data), SNAPPY_BLOCK_BYTES):
                block = bytes(cramjam.snappy.compress_raw(data[start : start + SNAPPY_BLOCK_BYTES]))
                self._out.write(struct.pack(">I", len(block)) + block)
        elif self._gzip is not None:
            self._out.write(self._gzip.compress(data))
        else:
            self._out.write(data)

    def close(self) -> None:
        self._flush()
        if self._gzip is not None:
            self._out.write(self._gzip.flush())
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()

    def abort(self) -> None:
        """Closes and deletes a write that will not be committed."""
        self._out.close()
        try:
            os.unlink(self.file)
        except FileNotFoundError:
            pass
