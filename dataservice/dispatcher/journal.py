"""The dispatcher's journal: every Update, durable before it is acknowledged, and damage never
mistaken for a torn write.

Layout under <work_dir>/journal/:
- journal-<seq>.log: the updates of one dispatcher run (a new segment on each
  start and after each snapshot). Segments are preallocated in chunks of
  zeros (the size is in the segment's header) and records are written into
  them, so a crash leaves the file at its full size with zeros after the last
  record, and a file shorter than its chunks is damage, not a crash.
- snapshot-<seq>.log: updates that rebuild the whole state as it was when
  segment <seq> began, with their count in the header; written whole
  (temporary name, fsync, rename, directory fsync). Segments before it are
  deleted.

Records: a 16-byte frame header (magic, type, length, the payload's CRC32C
and the header's own CRC32C), then the payload. Every file starts with a
header record (format, kind, sequence number, chunk size or record count);
then come update records (serialized Update protos).

Recovery replays the newest snapshot and the segments after it (their
sequence numbers must follow each other). In the newest segment only, a final
record cut short or garbled by a crash (nothing valid after it, zeros or the
end of the file) is dropped, and the segment is repaired (the bytes zeroed)
before the dispatcher writes on. Anything else (a damaged record with records
after it, a damaged snapshot or older segment, a file shorter than it must
be, a missing segment) refuses start with JournalCorruptError, which names
the file and the offset and says how to proceed.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import pathlib
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import google_crc32c

from dataservice import durable_files
from dataservice.v1 import journal_pb2

log = logging.getLogger(__name__)

FORMAT = 2
# magic, record type, reserved (0), payload length, payload CRC32C, header CRC32C (of the 12 bytes before it)
_FRAME = struct.Struct("<BBHIII")
_MAGIC = 0xD5
_HEADER_RECORD, _UPDATE_RECORD = 1, 2
_ZERO_FRAME = bytes(_FRAME.size)
_NAME = re.compile(r"^(journal|snapshot)-(\d{10})\.log$")
# Records larger than this are corruption, not updates (updates are small; graphs live elsewhere).
_MAX_RECORD_BYTES = 64 * 1024 * 1024
# Segments grow by this much at a time, zero-filled (about a thousand records).
DEFAULT_CHUNK_BYTES = 64 * 1024

_HOW_TO_PROCEED = (
    "refusing to start rather than lose state silently. To proceed, restore the work_dir's journal from a "
    "backup; or, accepting the loss of what it holds, move this file (and any newer journal files) out of "
    "{directory} and start again"
)


class JournalCorruptError(RuntimeError):
    """The journal is damaged where no crash could have damaged it: recovering past it would lose state."""

    def __init__(self, path: pathlib.Path, offset: int, problem: str):
        self.path = path
        self.offset = offset
        super().__init__(
            f"journal file {path} is damaged at offset {offset}: {problem}; "
            + _HOW_TO_PROCEED.format(directory=path.parent)
        )


@dataclasses.dataclass
class TornTail:
    """The end of the newest segment that a crash left unfinished: zeroed before writing on."""

    path: pathlib.Path
    offset: int


@dataclasses.dataclass
class Replay:
    """What recovery found: the updates to apply in order, the next free sequence number, and the
    torn tail of the newest segment, if any."""

    updates: list[journal_pb2.Update]
    next_seq: int
    torn: TornTail | None = None
    # The sequence number replay starts at (the snapshot's, or the first segment's); None: no journal yet.
    base: int | None = None


def directory_of(work_dir: str) -> pathlib.Path:
    """Where the journal of a dispatcher with this work_dir lives."""
    return pathlib.Path(work_dir) / "journal"


# ---- records -------------------------------------------------------------------


def _frame(record_type: int, payload: bytes) -> bytes:
    head = struct.pack("<BBHII", _MAGIC, record_type, 0, len(payload), google_crc32c.value(payload))
    return head + struct.pack("<I", google_crc32c.value(head)) + payload


def encode_update(update: journal_pb2.Update) -> bytes:
    return _frame(_UPDATE_RECORD, update.SerializeToString())


def _header_record(**fields) -> bytes:
    return _frame(_HEADER_RECORD, json.dumps({"format": FORMAT, **fields}, sort_keys=True).encode())


def _valid_header_at(data: bytes, offset: int) -> tuple[int, int, int] | None:
    """(type, length, payload crc) of a frame header at `offset` whose own checksum holds, else None."""
    if offset + _FRAME.size > len(data):
        return None
    magic, record_type, reserved, length, payload_crc, header_crc = _FRAME.unpack_from(data, offset)
    if magic != _MAGIC or reserved != 0 or google_crc32c.value(data[offset : offset + 12]) != header_crc:
        return None
    return record_type, length, payload_crc


def _next_valid_header(data: bytes, start: int) -> int | None:
    """The offset of the first frame header at or after `start` whose checksum holds."""
    offset = data.find(bytes([_MAGIC]), start)
    while offset != -1:
        if _valid_header_at(data, offset) is not None:
            return offset
        offset = data.find(bytes([_MAGIC]), offset + 1)
    return None


@dataclasses.dataclass
class _FileRead:
    header: dict
    updates: list[journal_pb2.Update]
    # Where the whole records end; where a torn final record starts (newest segment only).
    end: int
    torn_at: int | None = None


def _read_file(path: pathlib.Path, kind: str, seq: int, newest: bool) -> _FileRead:
    """The records of one file. In the newest segment a torn final record is reported, not raised."""
    data = path.read_bytes()
    header: dict | None = None
    updates: list[journal_pb2.Update] = []
    offset = 0

    def damaged(problem: str) -> JournalCorruptError:
        return JournalCorruptError(path, offset, problem)

    def check_size() -> None:
        """A segment is whole chunks: a shorter one was cut, which no crash does."""
        chunk = header.get("chunk_bytes") if header else None
        if not isinstance(chunk, int) or chunk <= 0 or len(data) % chunk:
            raise JournalCorruptError(
                path, len(data), f"a size of {len(data)} bytes, not a multiple of its {chunk}-byte chunks (cut short)"
            )

    def torn_or_damaged(problem: str, record_end: int | None) -> _FileRead:
        """A bad record at `offset`: torn by a crash if it is an update record with nothing valid
        after it in the newest segment (headers and snapshots are written whole)."""
        later = _next_valid_header(data, max(record_end or 0, offset + 1))
        if later is not None:
            raise damaged(f"{problem}, with a valid record after it at offset {later}")
        if not (newest and kind == "journal" and header is not None):
            raise damaged(problem)
        check_size()
        return _FileRead(header, updates, offset, torn_at=offset)

    while offset < len(data):
        if data[offset : offset + _FRAME.size] == _ZERO_FRAME or (
            offset + _FRAME.size > len(data) and not any(data[offset:])
        ):
            # The zeros after the last record of a preallocated segment.
            if kind == "snapshot":
                raise damaged("zeros where a record should be")
            later = _next_valid_header(data, offset)
            if later is not None:
                raise damaged(f"a hole of zeros before a valid record at offset {later}")
            break
        parsed = _valid_header_at(data, offset)
        if parsed is None:
            if offset + _FRAME.size > len(data):
                return torn_or_damaged("the file ends inside a record header", None)
            return torn_or_damaged("a record header whose checksum does not match", None)
        record_type, length, payload_crc = parsed
        end = offset + _FRAME.size + length
        if length > _MAX_RECORD_BYTES:
            raise damaged(f"a record of {length} bytes")
        if end > len(data):
            return torn_or_damaged(f"a record of {length} bytes that runs past the end of the file", end)
        payload = data[offset + _FRAME.size : end]
        if google_crc32c.value(payload) != payload_crc:
            return torn_or_damaged("a record whose checksum does not match", end)
        if header is None:
            if record_type != _HEADER_RECORD:
                raise damaged(f"no header record (the file is not a format-{FORMAT} journal file)")
            try:
                header = json.loads(payload)
            except ValueError as e:
                raise damaged(f"an unreadable header record ({e})") from None
            expected = {"format": FORMAT, "kind": kind, "seq": seq}
            found = {key: header.get(key) for key in expected}
            if found != expected:
                raise damaged(f"a header record for {found}, not {expected}")
        elif record_type == _UPDATE_RECORD:
            try:
                updates.append(journal_pb2.Update.FromString(payload))
            except Exception as e:  # noqa: BLE001 - a valid checksum over an unparsable update
                raise damaged(f"an unparsable update ({e})") from None
        else:
            raise damaged(f"a record of unknown type {record_type}")
        offset = end
    if header is None:
        raise damaged("no header record")
    if kind == "snapshot":
        if header.get("records") != len(updates):
            raise damaged(f"{len(updates)} updates where its header announces {header.get('records')}")
    else:
        check_size()
    return _FileRead(header, updates, offset)


def _files(directory: pathlib.Path) -> list[tuple[int, str, pathlib.Path]]:
    found = []
    for path in directory.iterdir() if directory.exists() else ():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(2)), match.group(1), path))
    return sorted(found)


def read(directory: pathlib.Path, before: int | None = None) -> Replay:
    """What to replay: the newest snapshot's updates, then those of the segments after it.
    Raises JournalCorruptError on damage (see the module docstring).

    `before`: only the files numbered below it, all of them finished (a background snapshot
    replays them while the writer appends to segment `before`): none may be torn."""
    files = [f for f in _files(directory) if before is None or f[0] < before]
    snapshots = [(seq, path) for seq, kind, path in files if kind == "snapshot"]
    base = snapshots[-1][0] if snapshots else None
    segments = [(seq, path) for seq, kind, path in files if kind == "journal" and (base is None or seq >= base)]
    updates: list[journal_pb2.Update] = []
    if snapshots:
        updates.extend(_read_file(snapshots[-1][1], "snapshot", snapshots[-1][0], newest=False).updates)
    from_snapshot = base is not None
    if base is None and segments:
        base = segments[0][0]
    expected_seq = base
    torn: TornTail | None = None
    for i, (seq, path) in enumerate(segments):
        if seq != expected_seq:
            missing = directory / f"journal-{expected_seq:010d}.log"
            raise JournalCorruptError(missing, 0, f"the segment is missing (the next one is {path.name})")
        newest = before is None and i == len(segments) - 1
        result = _read_file(path, "journal", seq, newest)
        # A segment names where replay started when it was made: that snapshot or first segment, or
        # (a snapshot written since) an earlier one. Anything later means a file is missing.
        builds_on = result.header.get("base")
        # (base is set: from the snapshot, or from the first segment.)
        if not isinstance(builds_on, int) or base is None or (builds_on > base if from_snapshot else builds_on != base):
            raise JournalCorruptError(
                path,
                0,
                f"it builds on sequence number {builds_on}, but replay would start at {base}: "
                "the snapshot or segment it follows is missing",
            )
        updates.extend(result.updates)
        if result.torn_at is not None:
            torn = TornTail(path, result.torn_at)
            log.warning(
                "journal %s: dropping a record torn by a crash at offset %d (the last of the newest segment)",
                path,
                result.torn_at,
            )
        expected_seq += 1
    # After the newest segment; after a snapshot whose segment a crash kept from being made, its own.
    next_seq = segments[-1][0] + 1 if segments else (base if base is not None else 0)
    return Replay(updates, next_seq, torn, base)


@dataclasses.dataclass
class FileReport:
    """One journal file as an operator sees it (`data-server journal verify`): read on its own,
    whether or not replay would read it."""

    path: pathlib.Path
    kind: str  # "journal" or "snapshot"
    seq: int
    size: int
    updates: int = 0
    # Where a torn final record starts (the newest segment only: dropped and zeroed at start).
    torn_at: int | None = None
    # What makes it damaged (JournalCorruptError's message), or None.
    problem: str | None = None


def inspect(directory: pathlib.Path) -> list[FileReport]:
    """Every journal file under `directory`, in order, each read on its own; changes nothing."""
    files = _files(directory)
    segments = [seq for seq, kind, _ in files if kind == "journal"]
    reports = []
    for seq, kind, path in files:
        report = FileReport(path, kind, seq, path.stat().st_size)
        try:
            result = _read_file(path, kind, seq, newest=kind == "journal" and seq == segments[-1])
            report.updates, report.torn_at = len(result.updates), result.torn_at
        except JournalCorruptError as e:
            report.problem = str(e)
        reports.append(report)
    return reports


# ---- writing -----------------------------------------------------------------------


def _grow(fd: int, size: int, new_size: int) -> None:
    """Extends the file with zeros to `new_size`, durably; OSError (disk full, file too large) leaves
    it as it was or at a larger whole size."""
    try:
        os.posix_fallocate(fd, size, new_size - size)
    except (AttributeError, OSError) as e:  # no fallocate here (macOS, some filesystems): write the zeros
        if isinstance(e, OSError) and e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            try:  # a partial allocation may have grown the file: back to whole chunks
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
        written = os.pwrite(fd, bytes(new_size - size), size)
        if written != new_size - size:
            os.ftruncate(fd, size)
            raise OSError(errno.ENOSPC, "could not extend the journal segment") from None
    os.fsync(fd)


def repair(torn: TornTail) -> None:
    """Zeroes a torn tail, so that the segment, no longer the newest once a new one starts,
    reads whole."""
    with open(torn.path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(torn.offset)
        f.write(bytes(size - torn.offset))
        f.flush()
        os.fsync(f.fileno())
    log.warning("journal %s: zeroed the torn record from offset %d", torn.path, torn.offset)


class JournalObserver(Protocol):
    """Told how long each durable append and each snapshot took (the dispatcher's metrics)."""

    def appended(self, seconds: float) -> None: ...

    def snapshotted(self, seconds: float) -> None: ...


class JournalWriter:
    """Appends updates to the current segment, each durable (fdatasync) before append() returns.

    A failed append (disk full, I/O error) raises OSError and leaves the
    segment as it was: the next append writes at the same offset."""

    def __init__(
        self,
        directory: pathlib.Path,
        seq: int,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sync: bool = True,
        base: int | None = None,
    ):
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._chunk = chunk_bytes
        self._sync = sync
        self._seq = seq
        # Where replay starts: the newest snapshot's sequence number, or the first segment's.
        self._base = seq if base is None else base
        self._snapshotter: threading.Thread | None = None
        self._fd = -1
        self._open_segment(seq)
        # Updates appended by this writer (for benchmarks and metrics).
        self.appended = 0
        self.observer: JournalObserver | None = None

    @classmethod
    def after(cls, directory: pathlib.Path, replay: Replay, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> JournalWriter:
        """The writer of a dispatcher that recovered `replay`: repairs a torn tail first."""
        if replay.torn is not None:
            repair(replay.torn)
        return cls(directory, replay.next_seq, chunk_bytes, base=replay.base)

    def _open_segment(self, seq: int) -> None:
        """Creates the segment whole (header, zero-filled to a chunk) under a temporary name and
        renames it, so a segment file never exists shorter than its chunks."""
        path = self._dir / f"journal-{seq:010d}.log"
        header = _header_record(kind="journal", seq=seq, chunk_bytes=self._chunk, base=self._base)
        size = max(1, -(-len(header) // self._chunk)) * self._chunk
        durable_files.write_durably(path, [header, bytes(size - len(header))])
        self._fd = os.open(path, os.O_RDWR)
        self._offset = len(header)
        self._size = size

    def append(self, update: journal_pb2.Update) -> None:
        started = time.perf_counter()
        record = encode_update(update)
        end = self._offset + len(record)
        if end > self._size:
            grown = -(-end // self._chunk) * self._chunk
            _grow(self._fd, self._size, grown)
            self._size = grown
        try:
            written = os.pwrite(self._fd, record, self._offset)
            if written != len(record):
                raise OSError(f"short write to the journal ({written} of {len(record)} bytes)")
            if self._sync:
                os.fdatasync(self._fd)
        except OSError:
            try:  # leave zeros, not a partial record, where the next append will write
                os.pwrite(self._fd, bytes(len(record)), self._offset)
            except OSError:
                pass
            raise
        self._offset = end
        self.appended += 1
        if self.observer is not None:
            self.observer.appended(time.perf_counter() - started)

    def snapshot_in_background(
        self, rebuild: Callable[[list[journal_pb2.Update]], Iterable[journal_pb2.Update]]
    ) -> bool:
        """Starts a snapshot without holding up appends: a new segment starts now, and a thread
        replays the files before it, turns their updates into the fewer updates that rebuild the
        same state (`rebuild`), writes them as the snapshot and deletes the files it replaces.
        False, and nothing done, while the previous snapshot is still being written. Raises
        OSError if the new segment cannot be made (nothing changed then)."""
        if self._snapshotter is not None and self._snapshotter.is_alive():
            return False
        seq = self._seq + 1
        old_fd = self._fd
        self._open_segment(seq)
        self._seq = seq
        os.close(old_fd)
        self._snapshotter = threading.Thread(
            target=self._write_snapshot, args=(seq, rebuild), name="journal-snapshot", daemon=True
        )
        self._snapshotter.start()
        return True

    def _write_snapshot(self, seq: int, rebuild: Callable[[list[journal_pb2.Update]], Iterable[journal_pb2.Update]]):
        started = time.perf_counter()
        try:
            records = [encode_update(u) for u in rebuild(read(self._dir, before=seq).updates)]
            header = _header_record(kind="snapshot", seq=seq, records=len(records))
            durable_files.write_durably(self._dir / f"snapshot-{seq:010d}.log", [header, *records])
            # Segments made from now on build on the snapshot (those before still name the old base).
            self._base = seq
            for old_seq, _, path in _files(self._dir):
                if old_seq < seq:
                    path.unlink()
            durable_files.fsync_directory(self._dir)
            log.info("journal snapshot %d written (%d updates)", seq, len(records))
            if self.observer is not None:
                self.observer.snapshotted(time.perf_counter() - started)
        except Exception:  # the journal is whole without it; the next one is tried later
            log.exception("writing journal snapshot %d failed; the segments stay", seq)

    def wait_for_snapshot(self, timeout_s: float) -> bool:
        """Waits for a background snapshot to finish; False if it is still running after `timeout_s`."""
        if self._snapshotter is not None:
            self._snapshotter.join(timeout_s)
            return not self._snapshotter.is_alive()
        return True

    def snapshot(self, updates: Iterable[journal_pb2.Update]) -> None:
        """Replaces the journal so far by `updates` (which rebuild the current state) and
        starts a new segment; recovery then replays the snapshot and what follows it."""
        seq = self._seq + 1
        records = [encode_update(u) for u in updates]
        header = _header_record(kind="snapshot", seq=seq, records=len(records))
        # The snapshot first: a crash before its segment exists leaves the snapshot alone, and
        # recovery then starts segment `seq` itself.
        durable_files.write_durably(self._dir / f"snapshot-{seq:010d}.log", [header, *records])
        old_fd = self._fd
        self._base = seq
        self._open_segment(seq)
        self._seq = seq
        os.close(old_fd)
        for old_seq, _, path in _files(self._dir):
            if old_seq < seq:
                path.unlink()
        durable_files.fsync_directory(self._dir)

    def close(self) -> None:
        self.wait_for_snapshot(timeout_s=60)
        if self._fd >= 0:
            if not self._sync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
