"""The directory of a distributed_save, as TensorFlow's distributed snapshots lay it out, so
that plain TensorFlow loads it (tf.data.Dataset.load, which also reads while it is written
with wait=True):

    PATH/snapshot.metadata     DistributedSnapshotMetadata, text format (element spec, compression)
    PATH/dataset_spec.pb       the element spec, encoded
    PATH/dataset_def.proto     the pipeline's graph (a DatasetDef)
    PATH/chunks/chunk_<stream>_<index>_<elements>   committed chunks, read in any order
    PATH/streams/stream_<k>/uncommitted_chunks/...  chunks being written
    PATH/DONE | PATH/ERROR     every chunk committed | the save failed (a StatusProto, text format)

A chunk here is the pipeline run over one slice of its sources' splits (chunk k of K holds
indices [k * size / K, (k + 1) * size / K) of each split group); it is written by one worker
into its stream folder and renamed into chunks/ by the dispatcher, which commits the first
write of each chunk only, so a chunk redone after a worker died is never there twice.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

from google.protobuf import text_format

METADATA_FILE = "snapshot.metadata"
DATASET_SPEC_FILE = "dataset_spec.pb"
DATASET_DEF_FILE = "dataset_def.proto"
DONE_FILE = "DONE"
ERROR_FILE = "ERROR"
CHUNKS_DIR = "chunks"
STREAMS_DIR = "streams"
UNCOMMITTED_DIR = "uncommitted_chunks"

# A redone chunk (its worker lost) repeats at most this many splits' work.
MAX_SPLITS_PER_CHUNK = 100_000

# TensorFlow's names of the chunk files' compression, by distributed_save's argument.
COMPRESSIONS = {"AUTO": "SNAPPY", "SNAPPY": "SNAPPY", "GZIP": "GZIP", None: ""}

_UNCOMMITTED_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def num_chunks(group_sizes: Sequence[int], streams: int) -> int:
    """How many chunks a snapshot is cut into: one per stream (`streams`, the workers there when
    the save starts, at least one), as TensorFlow's service writes one stream per worker. A
    chunk's pipeline runs once over the chunk's splits, so what it carries from element to
    element (batch, enumerate, shuffle, scan) spans a stream's share of the dataset, as in
    TensorFlow's streams, not a small slice of it. More chunks only where a source has more than
    MAX_SPLITS_PER_CHUNK splits; fewer where the sources have fewer splits than streams."""
    largest = max(group_sizes, default=0)
    return min(largest, max(streams, 1, math.ceil(largest / MAX_SPLITS_PER_CHUNK)))


def chunk_ranges(group_sizes: Sequence[int], chunks: int, index: int) -> list[tuple[int, int, int]]:
    """(split group, begin, end) of chunk `index` of `chunks`, one per group."""
    return [(group, index * size // chunks, (index + 1) * size // chunks) for group, size in enumerate(group_sizes)]


def chunks_dir(path: str) -> str:
    return os.path.join(path, CHUNKS_DIR)


def uncommitted_dir(path: str, chunk_index: int) -> str:
    return os.path.join(path, STREAMS_DIR, f"stream_{chunk_index}", UNCOMMITTED_DIR)


def uncommitted_file(path: str, chunk_index: int, name: str) -> str:
    """A worker's write of the chunk; ValueError unless `name` is a plain file name (it comes
    over the network, and the dispatcher renames and deletes it)."""
    if not isinstance(name, str) or not _UNCOMMITTED_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"an uncommitted chunk file must be a plain file name, got {name!r}")
    return os.path.join(uncommitted_dir(path, chunk_index), name)


def committed_file(path: str, chunk_index: int, num_records: int) -> str:
    # TensorFlow's name: chunk_<stream index>_<chunk index in the stream>_<elements>; here each
    # chunk is a stream of its own.
    return os.path.join(chunks_dir(path), f"chunk_{chunk_index}_0_{num_records}")


def write_skeleton(path: str, metadata, element_spec: bytes, graph_def: bytes) -> None:
    """The files a loader needs before the first chunk; idempotent (a restarted dispatcher
    writes them again). `metadata`: TensorFlow's DistributedSnapshotMetadata."""
    os.makedirs(chunks_dir(path), exist_ok=True)
    os.makedirs(os.path.join(path, STREAMS_DIR), exist_ok=True)
    _write_atomically(os.path.join(path, DATASET_SPEC_FILE), element_spec)
    _write_atomically(os.path.join(path, DATASET_DEF_FILE), _dataset_def(graph_def))
    # Last: its presence tells Dataset.load that this is a distributed snapshot.
    _write_atomically(os.path.join(path, METADATA_FILE), text_format.MessageToString(metadata).encode())


def _dataset_def(graph_def: bytes) -> bytes:
    """A serialized tensorflow.data.DatasetDef holding the graph (its field 1)."""
    return b"\x0a" + _varint(len(graph_def)) + graph_def


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def commit_chunk(path: str, chunk_index: int, num_records: int, uncommitted: str) -> None:
    """Renames the worker's file into chunks/; idempotent (done already: nothing to do)."""
    final = committed_file(path, chunk_index, num_records)
    source = uncommitted_file(path, chunk_index, uncommitted)
    if os.path.exists(final):
        return
    os.rename(source, final)
    _sync_dir(chunks_dir(path))


def discard(path: str, chunk_index: int, uncommitted: str) -> None:
    """Deletes a write of a chunk that was committed already (or whose snapshot failed)."""
    try:
        os.unlink(uncommitted_file(path, chunk_index, uncommitted))
    except FileNotFoundError:
        pass


def write_done(path: str) -> None:
    _write_atomically(os.path.join(path, DONE_FILE), b"")


def write_error(path: str, code: int, message: str) -> None:
    """The ERROR file: Dataset.load raises this status."""
    from tensorflow.core.protobuf import status_pb2

    status = status_pb2.StatusProto(code=code, message=message)
    _write_atomically(os.path.join(path, ERROR_FILE), text_format.MessageToString(status).encode())


def exists(path: str) -> bool:
    return os.path.lexists(path)


def done(path: str) -> bool:
    return os.path.exists(os.path.join(path, DONE_FILE))


def error(path: str) -> str | None:
    try:
        with open(os.path.join(path, ERROR_FILE), encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_atomically(file: str, data: bytes) -> None:
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)
    _sync_dir(os.path.dirname(file))


def _sync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
