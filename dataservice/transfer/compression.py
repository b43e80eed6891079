"""Compression of a stream's buffers: for compression="AUTO", LZ4 where a sample shows it pays
off; for "SNAPPY", snappy on every buffer.

LZ4 compresses and decompresses at several GB/s, so it costs little even when
it saves little; random or already-compressed data does not shrink at all. A
stream decides once per component, from a sample of the first buffer large
enough to tell, whether that component is worth compressing
(StreamCompressor): the elements of one component of one pipeline are alike,
and sampling every buffer would cost as much as compressing it. "SNAPPY" is
TensorFlow's setting that forces snappy whatever the data: kept for parity,
so that a pipeline moved over keeps what it asked for. Streams between
processes of one host never compress (they are not short of bandwidth).
"""

from __future__ import annotations

from collections.abc import Sequence

import cramjam
import lz4.block
import numpy as np

from dataservice.v1 import common_pb2

# Anything with the buffer protocol and a length in bytes: bytes, memoryview, 1-D uint8 arrays.
BytesLike = bytes | memoryview | np.ndarray

# Tensors smaller than this go raw: the header and the call cost more than they save.
MIN_COMPRESS_BYTES = 4096
SAMPLE_BYTES = 64 * 1024
# Compress when the sample shrinks to at most this fraction of its size.
MAX_RATIO = 0.8


def compress(data: BytesLike, mode: int = common_pb2.COMPRESSION_AUTO) -> tuple[int, BytesLike]:
    """(codec, payload) for a stream's compression `mode`: AUTO, LZ4 when the data compresses
    well, else the data as it is; SNAPPY, snappy; NONE, the data as it is."""
    if mode == common_pb2.COMPRESSION_SNAPPY:
        return common_pb2.COMPRESSION_SNAPPY, memoryview(cramjam.snappy.compress_raw(data))
    if mode != common_pb2.COMPRESSION_AUTO or len(data) < MIN_COMPRESS_BYTES:
        return common_pb2.COMPRESSION_NONE, data
    if len(data) > 2 * SAMPLE_BYTES:
        sample = lz4.block.compress(data[:SAMPLE_BYTES], store_size=False)
        if len(sample) > MAX_RATIO * SAMPLE_BYTES:
            return common_pb2.COMPRESSION_NONE, data
    compressed = lz4.block.compress(data, store_size=False)
    if len(compressed) > MAX_RATIO * len(data):
        return common_pb2.COMPRESSION_NONE, data
    return common_pb2.COMPRESSION_LZ4, compressed


def decompress(codec: int, payload: BytesLike, uncompressed_size: int) -> BytesLike:
    if codec in (common_pb2.COMPRESSION_AUTO, common_pb2.COMPRESSION_NONE):  # unset reads as AUTO: raw
        return payload
    if codec == common_pb2.COMPRESSION_LZ4:
        return lz4.block.decompress(payload, uncompressed_size=uncompressed_size)
    if codec == common_pb2.COMPRESSION_SNAPPY:
        out = memoryview(cramjam.snappy.decompress_raw(payload))
        if len(out) != uncompressed_size:
            raise ValueError(f"a snappy tensor decompressed to {len(out)} bytes, not {uncompressed_size}")
        return out
    raise ValueError(f"a tensor arrived with unknown compression codec {codec}")


class StreamCompressor:
    """One stream's compression (`mode`, a Compression value): per component, whether to
    compress, decided from a sample of its first buffer of MIN_COMPRESS_BYTES or more."""

    def __init__(self, mode: int):
        self.mode = mode
        self._decided: dict[int, bool] = {}

    def compress(self, component: int, parts: Sequence[BytesLike]) -> tuple[int, BytesLike]:
        """(codec, payload) for one buffer of `component` (given as parts back to back)."""
        if self.mode == common_pb2.COMPRESSION_NONE:
            return common_pb2.COMPRESSION_NONE, parts
        size = sum(memoryview(p).nbytes for p in parts)
        if self.mode == common_pb2.COMPRESSION_AUTO:
            if size < MIN_COMPRESS_BYTES:
                return common_pb2.COMPRESSION_NONE, parts
            decided = self._decided.get(component)
            if decided is None:
                decided = self._decided[component] = _worth_it(parts)
            if not decided:
                return common_pb2.COMPRESSION_NONE, parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if self.mode == common_pb2.COMPRESSION_SNAPPY:
            return compress(data, common_pb2.COMPRESSION_SNAPPY)
        compressed = lz4.block.compress(data, store_size=False)
        if len(compressed) > MAX_RATIO * size:
            return common_pb2.COMPRESSION_NONE, parts
        return common_pb2.COMPRESSION_LZ4, compressed


def _worth_it(parts: Sequence[BytesLike]) -> bool:
    """Whether LZ4 shrinks a sample of the parts' first SAMPLE_BYTES to MAX_RATIO or less."""
    sample = bytearray()
    for part in parts:
        view = memoryview(part).cast("B")
        sample += view[: SAMPLE_BYTES - len(sample)]
        if len(sample) >= SAMPLE_BYTES:
            break
    compressed = lz4.block.compress(bytes(sample), store_size=False)
    return len(compressed) <= MAX_RATIO * len(sample)
