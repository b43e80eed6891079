"""Per-tensor compression: for compression="AUTO", LZ4 where a sample shows it pays off; for
"SNAPPY", snappy on every tensor.

LZ4 compresses and decompresses at several GB/s, so it costs little even when
it saves little; random or already-compressed data does not shrink at all,
so a small sample is tried first and such tensors go out raw. "SNAPPY" is
TensorFlow's setting that forces snappy whatever the data: kept for parity,
so that a pipeline moved over keeps what it asked for.
"""

from __future__ import annotations

from typing import Tuple, Union

import cramjam
import lz4.block
import numpy as np

from dataservice.v1 import common_pb2

# Anything with the buffer protocol and a length in bytes: bytes, memoryview, 1-D uint8 arrays.
BytesLike = Union[bytes, memoryview, np.ndarray]

# Tensors smaller than this go raw: the header and the call cost more than they save.
MIN_COMPRESS_BYTES = 4096
SAMPLE_BYTES = 64 * 1024
# Compress when the sample shrinks to at most this fraction of its size.
MAX_RATIO = 0.8


def compress(data: BytesLike, mode: int = common_pb2.COMPRESSION_AUTO) -> Tuple[int, BytesLike]:
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
