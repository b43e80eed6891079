"""distributed_save on a worker: writes the snapshot chunks the dispatcher hands it.

Each chunk is the pipeline rebuilt over the chunk's ranges of its sources' splits, written in
TensorFlow's chunk format (snapshot/chunk_file.py) to a file of the chunk's stream folder
named for this worker process and attempt; the dispatcher then commits it (or, if another
write of the chunk was committed first, deletes it). A pipeline error fails the snapshot
with the error, which Dataset.load raises; a dispatcher that cannot be reached leaves the
chunk unwritten, to be handed out again.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator

import tensorflow as tf

from dataservice import status
from dataservice.monitoring.logs import ids
from dataservice.pipeline import splits
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.snapshot import layout
from dataservice.snapshot.chunk_file import ChunkWriter, check_plain_tensors
from dataservice.transfer.chunk import element_at
from dataservice.v1 import common_pb2, dispatcher_pb2
from dataservice.worker.dataset_cache import DatasetCache

log = logging.getLogger(__name__)

ChunkKey = tuple[str, int]


class ChunkStopped(Exception):
    """The dispatcher no longer needs the chunk (committed elsewhere, or its snapshot ended)."""


class SnapshotWriters:
    """The chunks this worker writes, one thread each."""

    def __init__(self, worker_address: str, worker_uid: int, dispatcher: DispatcherClient, datasets: DatasetCache):
        self._address = worker_address
        self._uid = worker_uid
        self._dispatcher = dispatcher
        self._datasets = datasets
        self._lock = threading.Lock()
        self._running: dict[ChunkKey, threading.Event] = {}
        self._attempts = itertools.count()

    def current(self) -> list[ChunkKey]:
        """Chunks being written (for the heartbeat)."""
        with self._lock:
            return sorted(self._running)

    def start(self, chunk: common_pb2.SnapshotChunkDef) -> None:
        key = (chunk.path, chunk.chunk_index)
        with self._lock:
            if key in self._running:
                return
            stop = self._running[key] = threading.Event()
        threading.Thread(
            target=self._run, args=(chunk, stop), name=f"snapshot-chunk-{chunk.chunk_index}", daemon=True
        ).start()

    def drop(self, path: str, chunk_index: int) -> None:
        with self._lock:
            stop = self._running.get((path, chunk_index))
        if stop is not None:
            stop.set()

    def stop(self) -> None:
        with self._lock:
            for stop in self._running.values():
                stop.set()

    def _run(self, chunk: common_pb2.SnapshotChunkDef, stop: threading.Event) -> None:
        key = (chunk.path, chunk.chunk_index)
        context = ids(dataset_id=chunk.dataset_id, worker=self._address)
        next_chunks: list[common_pb2.SnapshotChunkDef] = []
        try:
            name = f"chunk.{self._uid:x}.{next(self._attempts)}"
            try:
                elements = self._write(chunk, name, stop.is_set)
            except ChunkStopped:
                return
            except Exception as e:  # noqa: BLE001 - the pipeline's (or the disk's) error fails the snapshot
                self._report_error(chunk, e)
                return
            response = self._dispatcher.commit_snapshot_chunk(
                dispatcher_pb2.CommitSnapshotChunkRequest(
                    worker_address=self._address,
                    path=chunk.path,
                    chunk_index=chunk.chunk_index,
                    uncommitted_file=name,
                    num_records=elements,
                )
            )
            next_chunks = list(response.next_chunks)
            log.info("snapshot chunk %d written: %d elements", chunk.chunk_index, elements, extra=context)
        except (tf.errors.OpError, status.ServiceError) as e:
            # The dispatcher could not be reached, or refused the chunk: it is handed out again.
            log.warning("snapshot chunk %d not committed: %s", chunk.chunk_index, e.message, extra=context)
        finally:
            with self._lock:
                self._running.pop(key, None)
        for next_chunk in next_chunks:
            self.start(next_chunk)

    def _write(self, chunk: common_pb2.SnapshotChunkDef, name: str, stopped: Callable[[], bool]) -> int:
        element_spec = self._datasets.definition(chunk.dataset_id)[1]
        codec = self._datasets.codec(chunk.dataset_id)
        try:
            check_plain_tensors(element_spec)
        except ValueError as e:
            raise status.invalid_argument(str(e)) from None
        ranges = {r.split_group: (r.begin, r.end) for r in chunk.ranges}

        def supply(source: splits.Source) -> Iterator[tuple[int, int]]:
            yield ranges.get(source.group, (0, 0))

        chunks = self._datasets.split_iterator(chunk.dataset_id, 0, supply)
        os.makedirs(layout.uncommitted_dir(chunk.path, chunk.chunk_index), exist_ok=True)
        writer = ChunkWriter(
            layout.uncommitted_file(chunk.path, chunk.chunk_index, name), chunk.compression, codec.dtype_enums
        )
        try:
            for produced in chunks:
                if stopped():
                    raise ChunkStopped()
                for i in range(produced.num_elements):
                    writer.write(element_at(produced, i))
            writer.close()
        except BaseException:
            writer.abort()
            raise
        return writer.elements

    def _report_error(self, chunk: common_pb2.SnapshotChunkDef, error: BaseException) -> None:
        message = getattr(error, "message", None) or str(error)
        log.warning("snapshot chunk %d failed: %s", chunk.chunk_index, message)
        try:
            self._dispatcher.commit_snapshot_chunk(
                dispatcher_pb2.CommitSnapshotChunkRequest(
                    worker_address=self._address,
                    path=chunk.path,
                    chunk_index=chunk.chunk_index,
                    error_code=int(status.code_of(error)) or int(status.Code.INTERNAL),
                    error_message=f"writing chunk {chunk.chunk_index} on worker {self._address} failed: "
                    f"{type(error).__name__}: {message}",
                )
            )
        except status.ServiceError as e:
            log.warning("could not report the failure of snapshot chunk %d: %s", chunk.chunk_index, e.message)
