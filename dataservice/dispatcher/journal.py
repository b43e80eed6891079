"""The dispatcher's journal: every Update, durable before it is acknowledged.

Layout under <work_dir>/journal/:
- journal-<seq>.log: the updates of one dispatcher run (a new segment on each
  start and after each snapshot);
- snapshot-<seq>.log: updates that rebuild the whole state as it was when
  segment <seq> began; written to a temporary name, fsynced, then renamed, so
  it exists only complete. Segments before it are deleted.

Both hold records: 4-byte little-endian payload length, 4-byte CRC32C of the
payload, then the payload (a serialized Update). Recovery replays the newest
snapshot and the segments after it. A record cut short at the end of a
segment (a crash mid-write) is dropped with a log line; a damaged record
with data after it refuses recovery with an error naming the file and offset.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import struct
from typing import Iterable, Iterator, List, Tuple

import google_crc32c

from dataservice import durable_files
from dataservice.v1 import journal_pb2

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_NAME = re.compile(r"^(journal|snapshot)-(\d{10})\.log$")
# Records larger than this are corruption, not updates (updates are small; graphs live elsewhere).
_MAX_RECORD_BYTES = 64 * 1024 * 1024


class JournalCorruptError(RuntimeError):
    """A record in the middle of the journal is damaged: recovering past it would lose state silently."""


def _files(directory: pathlib.Path) -> List[Tuple[int, str, pathlib.Path]]:
    found = []
    for path in directory.iterdir() if directory.exists() else ():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(2)), match.group(1), path))
    return sorted(found)


def _records(path: pathlib.Path) -> Iterator[journal_pb2.Update]:
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            log.warning(
                "journal %s: dropping a torn record at offset %d (%d bytes of header)", path, offset, len(data) - offset
            )
            return
        length, crc = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if length > _MAX_RECORD_BYTES:
            raise JournalCorruptError(f"journal {path} is corrupt at offset {offset}: a record of {length} bytes")
        if end > len(data):
            log.warning(
                "journal %s: dropping a torn record at offset %d (%d of %d bytes written)",
                path,
                offset,
                len(data) - offset - _HEADER.size,
                length,
            )
            return
        payload = data[offset + _HEADER.size : end]
        if google_crc32c.value(payload) != crc:
            if end == len(data):
                log.warning("journal %s: dropping a torn last record at offset %d (checksum mismatch)", path, offset)
                return
            raise JournalCorruptError(
                f"journal {path} is corrupt at offset {offset}: checksum mismatch in a record followed by "
                f"{len(data) - end} more bytes; refusing to start rather than lose state "
                "(move the file away to start from an earlier state)"
            )
        try:
            yield journal_pb2.Update.FromString(payload)
        except Exception as e:  # noqa: BLE001 - a valid checksum over an unparsable update
            raise JournalCorruptError(f"journal {path} is corrupt at offset {offset}: {e}") from None
        offset = end


def read(directory: pathlib.Path) -> Tuple[List[journal_pb2.Update], int]:
    """The updates to replay (newest snapshot first, then later segments) and the next free sequence number."""
    files = _files(directory)
    snapshots = [seq for seq, kind, _ in files if kind == "snapshot"]
    base = snapshots[-1] if snapshots else -1
    updates: List[journal_pb2.Update] = []
    for seq, kind, path in files:
        if kind == "snapshot" and seq == base:
            updates.extend(_records(path))
    for seq, kind, path in files:
        if kind == "journal" and seq >= base:
            updates.extend(_records(path))
    next_seq = files[-1][0] + 1 if files else 0
    return updates, next_seq


def _encode(update: journal_pb2.Update) -> bytes:
    payload = update.SerializeToString()
    return _HEADER.pack(len(payload), google_crc32c.value(payload)) + payload


class JournalWriter:
    """Appends updates to the current segment, fsyncing each before returning."""

    def __init__(self, directory: pathlib.Path, seq: int):
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._seq = seq
        self._file = self._open_segment(seq)
        # Updates appended by this writer (for benchmarks and metrics).
        self.appended = 0

    def _open_segment(self, seq: int):
        f = open(self._dir / f"journal-{seq:010d}.log", "ab")
        durable_files.fsync_directory(self._dir)
        return f

    def append(self, update: journal_pb2.Update) -> None:
        self._file.write(_encode(update))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.appended += 1

    def snapshot(self, updates: Iterable[journal_pb2.Update]) -> None:
        """Replaces the journal so far by `updates` (which rebuild the current state) and
        starts a new segment; recovery then replays the snapshot and what follows it."""
        seq = self._seq + 1
        durable_files.write_durably(self._dir / f"snapshot-{seq:010d}.log", (_encode(u) for u in updates))
        self._file.close()
        self._seq = seq
        self._file = self._open_segment(seq)
        for old_seq, _, path in _files(self._dir):
            if old_seq < seq:
                path.unlink()
        durable_files.fsync_directory(self._dir)

    def close(self) -> None:
        self._file.close()
