"""distributed_save on the dispatcher: which worker writes which chunk of which snapshot.

The snapshots and their committed chunks are journaled state (DispatcherState); which worker
is writing a chunk is not: after a restart, workers report the chunks they are writing and
keep them, and any other uncommitted chunk is handed out again. Two writes of one chunk
(a worker thought lost, a restart) are harmless: the dispatcher commits the first to report
and deletes the others (core.commit_snapshot_chunk).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from dataservice import modes, status
from dataservice.dispatcher.context import CoreContext
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.state import Snapshot
from dataservice.monitoring.logs import ids
from dataservice.snapshot import layout
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2

log = logging.getLogger(__name__)

ChunkKey = tuple[str, int]  # (snapshot path, chunk index)


@dataclasses.dataclass
class ChunkAssignments:
    """Chunks being written, by worker. `max_snapshots_per_worker`: how many snapshots one worker
    writes chunks of at once (one chunk each); 0: no limit."""

    max_snapshots_per_worker: int = 0
    _writer: dict[ChunkKey, str] = dataclasses.field(default_factory=dict)
    _by_worker: dict[str, set[ChunkKey]] = dataclasses.field(default_factory=dict)
    # Per snapshot, an index below which every chunk is committed or being written: hand-outs
    # (every heartbeat) scan from it, not from 0; a released chunk lowers it.
    _scan_from: dict[str, int] = dataclasses.field(default_factory=dict)

    def of_worker(self, worker: str) -> set[ChunkKey]:
        return set(self._by_worker.get(worker, ()))

    def writer(self, key: ChunkKey) -> str | None:
        return self._writer.get(key)

    def assign(self, key: ChunkKey, worker: str) -> None:
        self.release(key)
        self._writer[key] = worker
        self._by_worker.setdefault(worker, set()).add(key)

    def release(self, key: ChunkKey) -> None:
        worker = self._writer.pop(key, None)
        if worker is not None:
            self._by_worker[worker].discard(key)
            self._lower_scan(key)

    def forget_worker(self, worker: str) -> None:
        """A lost worker's chunks are handed out again."""
        for key in self._by_worker.pop(worker, set()):
            self._writer.pop(key, None)
            self._lower_scan(key)

    def _lower_scan(self, key: ChunkKey) -> None:
        path, index = key
        if index < self._scan_from.get(path, 0):
            self._scan_from[path] = index

    def adopt(self, worker: str, reported: Iterable[ChunkKey], snapshots: dict[str, Snapshot]) -> list[ChunkKey]:
        """Takes in the chunks a worker reports writing (after a restart, the dispatcher does not
        know them); returns those it should drop: committed, of a finished or unknown
        snapshot, or being written by another worker."""
        drop = []
        for key in reported:
            snapshot = snapshots.get(key[0])
            owner = self._writer.get(key)
            if snapshot is None or snapshot.finished or key[1] in snapshot.committed or owner not in (None, worker):
                drop.append(key)
            elif owner is None:
                self.assign(key, worker)
        return drop

    def hand_out(self, worker: str, snapshots: Iterable[Snapshot]) -> list[ChunkKey]:
        """New chunks for `worker`: one of each unfinished snapshot it writes no chunk of, the
        oldest snapshots first, up to max_snapshots_per_worker snapshots."""
        held = {path for path, _ in self._by_worker.get(worker, ())}
        new = []
        for snapshot in snapshots:
            limit = self.max_snapshots_per_worker
            if limit and len(held) >= limit:
                break
            if snapshot.finished or snapshot.path in held:
                continue
            index = self._next_unwritten(snapshot)
            if index is not None:
                self.assign((snapshot.path, index), worker)
                held.add(snapshot.path)
                new.append((snapshot.path, index))
        return new

    def _next_unwritten(self, snapshot: Snapshot) -> int | None:
        index = self._scan_from.get(snapshot.path, 0)
        while index < snapshot.num_chunks and (index in snapshot.committed or (snapshot.path, index) in self._writer):
            index += 1
        self._scan_from[snapshot.path] = index
        return index if index < snapshot.num_chunks else None


def chunk_def(snapshot: Snapshot, index: int) -> common_pb2.SnapshotChunkDef:
    return common_pb2.SnapshotChunkDef(
        path=snapshot.path,
        dataset_id=snapshot.dataset_id,
        chunk_index=index,
        compression=snapshot.compression,
        ranges=[
            common_pb2.SnapshotRange(split_group=group, begin=begin, end=end)
            for group, begin, end in layout.chunk_ranges(snapshot.group_sizes, snapshot.num_chunks, index)
        ],
    )


class SnapshotCoordinator:
    """The dispatcher's distributed_save requests, on the core's context (context.py); methods
    marked "lock held" are called by the core under its lock."""

    def __init__(
        self,
        ctx: CoreContext,
        datasets: DatasetStore,
        max_snapshots_per_worker: int,
        snapshot_roots: Sequence[str] | None = None,
    ):
        self._state = ctx.state
        self._commit = ctx.commit
        self._lock = ctx.lock
        self._datasets = datasets
        # The registered dataset of an id (NOT_FOUND for an unknown one).
        self._registered = ctx.dataset
        self._fault_tolerant = ctx.config.fault_tolerant_mode
        self._where = ctx.where
        # Where distributed_save may write (DispatcherConfig.snapshot_roots); None: anywhere.
        self._snapshot_roots = [os.path.realpath(root) for root in snapshot_roots] if snapshot_roots else None
        self.assignments = ChunkAssignments(max_snapshots_per_worker)

    def _check_under_roots(self, path: str) -> None:
        """PERMISSION_DENIED unless `path` lies under a snapshot root once `..` and the symlinks of
        its existing parts are resolved (a link under a root to elsewhere does not count)."""
        if self._snapshot_roots is None:
            return
        resolved = os.path.realpath(path)
        if not any(os.path.commonpath([resolved, root]) == root and resolved != root for root in self._snapshot_roots):
            raise status.permission_denied(
                f"{self._where} writes distributed_save snapshots only under its snapshot_roots "
                f"{self._snapshot_roots}, and {path!r} is not under them"
            )

    def start(self, request: dispatcher_pb2.SnapshotRequest) -> dispatcher_pb2.SnapshotResponse:
        path = request.path
        if not path or not os.path.isabs(path):
            raise status.invalid_argument(f"the snapshot path must be an absolute path, got {path!r}")
        self._check_under_roots(path)
        if not self._fault_tolerant:
            raise status.invalid_argument(
                "tf.data distributed snapshot requires running tf.data service in the fault tolerant mode: "
                f"{self._where} journals each save's progress, so it needs fault_tolerant_mode=True and a work_dir"
            )
        graph_lib, splits, snapshot_pb2 = _tensorflow_parts()
        metadata = snapshot_pb2.DistributedSnapshotMetadata()
        try:
            metadata.ParseFromString(request.metadata)
        except DecodeError as e:
            raise status.invalid_argument(f"unreadable snapshot metadata: {e}") from None
        if metadata.compression not in ("SNAPPY", "GZIP", ""):
            raise status.invalid_argument(
                f"snapshot compression must be 'SNAPPY', 'GZIP' or '' (none), got {metadata.compression!r}"
            )
        with self._lock:
            dataset = self._registered(request.dataset_id)
            if self._state.snapshot(path) is not None:
                raise status.already_exists(f"tf.data snapshot at {path} has already started or completed")
        if dataset.metadata.cardinality == -1:
            raise status.invalid_argument(
                f"Saving an infinite dataset is not allowed: distributed_save needs a finite dataset; dataset "
                f"{request.dataset_id!r} is infinite (repeat())"
            )
        graph_bytes = self._datasets.get(dataset.dataset_id)
        if graph_bytes is None:
            raise status.failed_precondition(
                f"the graph of dataset {dataset.dataset_id!r} is missing from the work_dir"
            )
        try:
            sizes = splits.group_sizes(splits.find_sources(graph_lib.parse_graph(graph_bytes)))
        except (splits.UnsplittableDatasetError, graph_lib.InvalidDatasetError) as e:
            raise status.invalid_argument(f"distributed_save splits the dataset among the workers: {e}") from None
        if any(size >= modes.INFINITE_SPLITS for size in sizes):
            raise status.invalid_argument(
                "Saving an infinite dataset is not allowed: distributed_save needs a finite dataset; a source of "
                f"dataset {request.dataset_id!r} repeats "
                "for ever (repeat()), which distributed_save cannot split into chunks"
            )
        if layout.exists(path):
            raise status.already_exists(
                f"tf.data snapshot at {path} cannot start: the path exists already (choose a new one)"
            )
        metadata.element_spec = dataset.metadata.element_spec
        with self._lock:
            if self._state.snapshot(path) is not None:
                raise status.already_exists(f"tf.data snapshot at {path} has already started or completed")
            chunks = layout.num_chunks(sizes, streams=len(self._state.alive_workers()))
            self._commit(
                start_snapshot=journal_pb2.StartSnapshotUpdate(
                    path=path,
                    dataset_id=dataset.dataset_id,
                    compression=metadata.compression,
                    group_sizes=sizes,
                    num_chunks=chunks,
                )
            )
            snapshot = self._state.known_snapshot(path)
            try:
                layout.write_skeleton(path, metadata, metadata.element_spec, graph_bytes)
            except OSError as e:
                message = f"cannot write the snapshot's files at {path}: {e.strerror or e}"
                self._fail(snapshot, status.Code.FAILED_PRECONDITION, message)
                raise status.failed_precondition(message) from None
            log.info("snapshot started: %d chunks", chunks, extra=ids(dataset_id=dataset.dataset_id))
            self._finish_if_complete(snapshot)
        return dispatcher_pb2.SnapshotResponse()

    def commit(self, request: dispatcher_pb2.CommitSnapshotChunkRequest) -> dispatcher_pb2.CommitSnapshotChunkResponse:
        worker = request.worker_address
        with self._lock:
            if self._state.worker(worker) is None:
                raise status.not_found(f"worker {worker!r} is not registered with {self._where}")
            snapshot = self._state.snapshot(request.path)
            if snapshot is None:
                raise status.not_found(f"no snapshot at {request.path!r} is known to {self._where}")
            index = request.chunk_index
            if not 0 <= index < snapshot.num_chunks:
                raise status.invalid_argument(
                    f"snapshot {snapshot.path} has chunks [0, {snapshot.num_chunks}), not chunk {index}"
                )
            name = request.uncommitted_file
            if name:
                try:
                    layout.uncommitted_file(snapshot.path, index, name)
                except ValueError as e:
                    raise status.invalid_argument(str(e)) from None
            if request.num_records < 0:
                raise status.invalid_argument(f"num_records must not be negative, got {request.num_records}")
            key = (snapshot.path, index)
            if self.assignments.writer(key) == worker:
                self.assignments.release(key)
            if snapshot.finished or index in snapshot.committed or request.error_code:
                if request.error_code and not snapshot.finished:
                    self._fail(snapshot, request.error_code, request.error_message)
                if name:
                    _quietly(layout.discard, snapshot.path, index, name)
                return dispatcher_pb2.CommitSnapshotChunkResponse(committed=False)
            if not name or not os.path.exists(layout.uncommitted_file(snapshot.path, index, name)):
                raise status.failed_precondition(
                    f"the written chunk {index} of snapshot {snapshot.path} ({name!r}) is not in its stream folder"
                )
            self._commit(
                commit_snapshot_chunk=journal_pb2.CommitSnapshotChunkUpdate(
                    path=snapshot.path, chunk_index=index, num_records=request.num_records, uncommitted_file=name
                )
            )
            _quietly(layout.commit_chunk, snapshot.path, index, request.num_records, name)
            self._finish_if_complete(snapshot)
            next_chunks = [
                chunk_def(snapshot, i)
                for path, i in self.assignments.hand_out(worker, [snapshot])
                if path == snapshot.path
            ]
            return dispatcher_pb2.CommitSnapshotChunkResponse(committed=True, next_chunks=next_chunks)

    def heartbeat(
        self, worker: str, reported: Iterable[dispatcher_pb2.SnapshotChunkRef]
    ) -> tuple[list[common_pb2.SnapshotChunkDef], list[dispatcher_pb2.SnapshotChunkRef]]:
        """(chunks to start, chunks to drop) for a worker's heartbeat. Lock held."""
        reported_keys = {(ref.path, ref.chunk_index) for ref in reported}
        snapshots = {s.path: s for s in self._state.snapshots()}
        drop = self.assignments.adopt(worker, sorted(reported_keys), snapshots)
        self.assignments.hand_out(worker, self._state.snapshots())
        start = sorted(self.assignments.of_worker(worker) - reported_keys)
        return (
            [chunk_def(snapshots[path], index) for path, index in start],
            [dispatcher_pb2.SnapshotChunkRef(path=path, chunk_index=index) for path, index in drop],
        )

    def status(self) -> list[dict]:
        """The snapshots for the status document. Lock held."""
        return [
            {
                "path": s.path,
                "dataset_id": s.dataset_id,
                "chunks": s.num_chunks,
                "committed_chunks": len(s.committed),
                "elements": s.elements,
                "state": ("failed" if s.error_code else "done") if s.finished else "running",
                "error": s.error_message,
            }
            for s in self._state.snapshots()
        ]

    def repair_files(self) -> None:
        """Brings each snapshot's files up to its journaled state (a dispatcher that died between
        journaling and writing): the skeleton, committed chunks renamed, DONE or ERROR."""
        with self._lock:
            snapshots = self._state.snapshots()
        for snapshot in snapshots:
            try:
                if not snapshot.finished:
                    snapshot_pb2 = _tensorflow_parts()[2]
                    dataset = self._state.known_dataset(snapshot.dataset_id)
                    graph_bytes = self._datasets.get(snapshot.dataset_id) or b""
                    metadata = snapshot_pb2.DistributedSnapshotMetadata(
                        element_spec=dataset.metadata.element_spec, compression=snapshot.compression
                    )
                    layout.write_skeleton(snapshot.path, metadata, metadata.element_spec, graph_bytes)
                for index, (records, name) in snapshot.committed.items():
                    if not os.path.exists(layout.committed_file(snapshot.path, index, records)):
                        layout.commit_chunk(snapshot.path, index, records, name)
                if snapshot.finished and snapshot.error_code:
                    layout.write_error(snapshot.path, snapshot.error_code, snapshot.error_message)
                elif snapshot.finished and not layout.done(snapshot.path):
                    layout.write_done(snapshot.path)
            except OSError as e:
                log.error("snapshot %s: its files could not be brought up to date: %s", snapshot.path, e)

    def _finish_if_complete(self, snapshot: Snapshot) -> None:
        if not snapshot.finished and len(snapshot.committed) == snapshot.num_chunks:
            self._commit(finish_snapshot=journal_pb2.FinishSnapshotUpdate(path=snapshot.path))
            _quietly(layout.write_done, snapshot.path)
            log.info("snapshot %s done: %d elements", snapshot.path, snapshot.elements)

    def _fail(self, snapshot: Snapshot, code: int, message: str) -> None:
        self._commit(
            finish_snapshot=journal_pb2.FinishSnapshotUpdate(path=snapshot.path, error_code=code, error_message=message)
        )
        for index in range(snapshot.num_chunks):
            self.assignments.release((snapshot.path, index))
        _quietly(layout.write_error, snapshot.path, code, message)
        log.warning("snapshot %s failed: %s", snapshot.path, message)


def _tensorflow_parts() -> tuple[Any, Any, Any]:
    """(pipeline/graph.py, pipeline/splits.py, TensorFlow's snapshot_pb2): imported when a save
    starts or is repaired, not with this module, so that the dispatcher serves before it has
    imported TensorFlow (dispatch_server.py)."""
    from tensorflow.core.protobuf import snapshot_pb2

    from dataservice.pipeline import graph as graph_lib
    from dataservice.pipeline import splits

    return graph_lib, splits, snapshot_pb2


def _quietly(write: Callable[..., None], *args) -> None:
    """A file change the journal already records: a failure is logged and repaired at the next
    start (repair_files), not reported to the worker, whose write is committed."""
    try:
        write(*args)
    except OSError as e:
        log.error("snapshot file operation %s%s failed: %s", write.__name__, args, e)
