"""Reads one iteration of a job: the elements of all its tasks, from all workers.

The session's heartbeats say which tasks the iteration has (new workers bring
new tasks) and whether it is finished; one stream per task reads that task's
elements into a queue that the consumer drains. Flow control is by credits:
the client grants each worker the number of elements it may send, and grants
more only as the consumer takes elements, so the elements buffered plus in
flight never exceed the client's budget (max_outstanding_requests) however
slowly it reads. The iteration is over for this client when the dispatcher
says every task finished and every stream this client opened has ended.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence

from dataservice import status
from dataservice.client.credits import CreditLedger
from dataservice.client.element_streams import ElementStream, open_stream
from dataservice.client.reader_state import (
    AbandonStream,
    HeartbeatNow,
    Instruction,
    OpenStream,
    ReaderState,
    ReportConsumedEnds,
    WakeConsumer,
)
from dataservice.client.reading_meter import ReadingMeter
from dataservice.client.session import IterationSession, JobSpec
from dataservice.config import DEFAULT_STREAM_TIMEOUT_MS
from dataservice.rpc import errors, retrying
from dataservice.rpc.dispatcher_client import TaskPosition
from dataservice.rpc.tls import TlsFiles
from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer import shared_memory
from dataservice.transfer.wire import WireCodec
from dataservice.v1 import common_pb2, dispatcher_pb2, worker_pb2

log = logging.getLogger(__name__)

# How often the consumer checks for the end or an error while the queue is empty; events
# that can end the iteration (a stream's end, the dispatcher's word, an error) wake it at once.
_POLL_S = 0.05
# Put in the queue to wake the consumer: not a chunk.
_WAKE = None


class IterationReader:
    """An iterator over the decoded chunks (transfer/chunk.py) of one iteration."""

    def __init__(
        self,
        dispatcher_address: str,
        job: JobSpec,
        repetition: int,
        codec: WireCodec,
        max_outstanding: int,
        timeout_s: float,
        compression: common_pb2.Compression,
        protocol: str | None = None,
        tls: TlsFiles | None = None,
        resume_from: Sequence[TaskPosition] | None = None,
        stream_timeout_s: float = DEFAULT_STREAM_TIMEOUT_MS / 1000,
    ):
        self.codec = codec
        self.protocol = protocol
        self.tls = tls
        self.timeout_s = timeout_s
        self.stream_timeout_s = stream_timeout_s
        self.compression = compression
        self.credits = CreditLedger(max_outstanding)
        # The ring of shared memory a stream from a worker on this host asks for.
        self.ring_bytes = shared_memory.ring_bytes_for(max_outstanding, codec.element_bytes)
        self.trainer_id = job.trainer_id
        # (stream, elements, chunk), or _WAKE.
        self._queue: queue.Queue[tuple | None] = queue.Queue()
        self._streams: dict[int, _TaskStream] = {}
        # The tasks, their ends and the decisions about them (reader_state.py); under _lock.
        self._state = ReaderState()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        # Per task, its latest receipt (read_keys.py) and the elements it covers: a checkpoint
        # saves it beside the position, which the dispatcher checks against it on resume.
        self._receipts: dict[int, tuple[int, str]] = {}
        self.meter = ReadingMeter()
        self.session = IterationSession(
            dispatcher_address,
            job,
            repetition,
            timeout_s,
            on_heartbeat=self._on_heartbeat,
            on_error=self.fail,
            consumed_tasks=self.consumed_tasks,
            reading=self.meter.totals,
            tls=tls,
            resume_from=resume_from,
        )
        self.client_id = self.session.client_id
        self.session.start()
        threading.Thread(target=self._watch_streams, name="stream-watchdog", daemon=True).start()

    # ---- the consumer side -----------------------------------------------

    def __iter__(self) -> Iterator[chunk_lib.Chunk]:
        return self.chunks()

    def chunks(self, merge_elements: int = 0, merge_bytes: int = 0) -> Iterator[chunk_lib.Chunk]:
        """The decoded chunks in arrival order. The chunks already waiting are joined into one of
        up to `merge_elements` elements and `merge_bytes` bytes: a slow pipeline on many workers
        sends many small chunks, and each chunk costs the consumer a call into Python from tf.data."""
        return (chunk for chunk, _ in self.chunks_with_origin(merge_elements, merge_bytes))

    def chunks_with_origin(
        self, merge_elements: int = 0, merge_bytes: int = 0
    ) -> Iterator[tuple[chunk_lib.Chunk, list[tuple[int, int]]]]:
        """chunks(), each with where its elements came from: (task id, element count) in order."""
        meter = self.meter
        while True:
            meter.wait_started()
            try:
                first = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                first = _WAKE
            if first is _WAKE:
                if self._error is not None:
                    raise self._error
                if self._finished():
                    return
                continue
            taken = [first]
            count, size = first[1], first[2].nbytes
            while count < merge_elements and size < merge_bytes:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _WAKE:
                    taken.append(item)
                    count += item[1]
                    size += item[2].nbytes
            self.credits.consumed((stream.task_id, count) for stream, count, _ in taken)
            chunk = chunk_lib.concatenate([c for _, _, c in taken])
            meter.handed(chunk.num_elements, chunk.nbytes)
            yield chunk, [(stream.task_id, n) for stream, n, _ in taken]
            # tf.data asks for the next chunk once it has handed out this one's elements: only now
            # has the consumer gone past them.
            with self._lock:
                received = {stream.task_id: self.credits.received_total(stream.task_id) for stream, _, _ in taken}
                instructions = self._state.on_passed(((stream.task_id, n) for stream, n, _ in taken), received)
            self._carry_out(instructions)

    def _finished(self) -> bool:
        with self._lock:
            finished = self._state.finished(self.session.reads_some_tasks)
        if not (finished and self.credits.all_done()):
            return False
        with self._queue.mutex:
            return all(item is _WAKE for item in self._queue.queue)

    def close(self) -> None:
        """Stops the streams and releases this client at the dispatcher (best effort)."""
        if self.stopped.is_set():
            return
        self.session.close()  # from here on no stream is added or retried
        with self._lock:
            streams = list(self._streams.values())
        self.credits.wake()
        for stream in streams:
            stream.cancel()
        for stream in streams:
            stream.join(timeout=2)

    def _watch_streams(self) -> None:
        """Breaks every stream from which nothing, not even a keepalive, came for stream_timeout_s:
        its worker's host is partitioned from this one or frozen, and without this its read would
        wait for TCP to give up (many minutes). The stream then connects again, as after any break."""
        period = min(1.0, self.stream_timeout_s / 4)
        while not self.stopped.wait(period):
            with self._lock:
                streams = list(self._streams.values())
            for stream in streams:
                stream.break_if_silent(self.stream_timeout_s)

    # ---- heartbeats ------------------------------------------------------

    def _on_heartbeat(self, response: dispatcher_pb2.ClientHeartbeatResponse) -> None:
        with self._lock:
            instructions = self._state.on_heartbeat(response, stopped=self.stopped.is_set())
            # Opened under the lock: close() cancels every stream it finds there.
            for instruction in instructions:
                if isinstance(instruction, OpenStream):
                    self.credits.open(instruction.task.task_id)
                    self._streams[instruction.task.task_id] = _TaskStream(self, instruction.task)
        self._carry_out(instructions)

    def _carry_out(self, instructions: list[Instruction]) -> None:
        """Carries out the state's instructions (those other than OpenStream, done under the lock)."""
        for instruction in instructions:
            if isinstance(instruction, AbandonStream):
                # Its worker is gone: a stream to it would wait for a timeout, or for a new process at
                # the same address that never had the task.
                with self._lock:
                    stream = self._streams[instruction.task_id]
                stream.abandon()
            elif isinstance(instruction, WakeConsumer):
                self._queue.put(_WAKE)
            elif isinstance(instruction, HeartbeatNow | ReportConsumedEnds):
                # Consumed ends travel in the next heartbeat (consumed_tasks()).
                self.session.wake()

    # ---- called by the streams -------------------------------------------

    def put(self, stream: _TaskStream, chunk: chunk_lib.Chunk) -> None:
        self._queue.put((stream, chunk.num_elements, chunk))

    def stream_ended(self, stream: _TaskStream, end_of_sequence: bool = False) -> None:
        """The stream will receive nothing more: the credits it was granted and did not use return.
        `end_of_sequence`: it ended with its task's end (not with a lost worker or an error)."""
        self.credits.end(stream.task_id)
        with self._lock:
            received = self.credits.received_total(stream.task_id)
            instructions = self._state.on_stream_ended(stream.task_id, end_of_sequence, received)
        self._carry_out(instructions)

    def hold_receipt(self, task_id: int, elements: int, receipt: str) -> None:
        with self._lock:
            self._receipts[task_id] = (elements, receipt)

    def position(self, task_id: int, elements: int) -> TaskPosition:
        """Task `task_id` taken `elements` far, with the latest receipt for it, to save."""
        with self._lock:
            covered, receipt = self._receipts.get(task_id, (0, ""))
        return TaskPosition(task_id, elements, covered, receipt)

    def consumed_tasks(self) -> list:
        with self._lock:
            return sorted(self._state.consumed_ends)

    def task_finished(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._state.finished_tasks

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._queue.put(_WAKE)

    @property
    def stopped(self) -> threading.Event:
        return self.session.stopped

    def stream_count(self) -> int:
        """Task streams opened so far."""
        with self._lock:
            return len(self._streams)

    def queued_elements(self) -> int:
        """Elements received and not yet taken by the consumer."""
        with self._queue.mutex:
            return sum(item[1] for item in self._queue.queue if item is not _WAKE)


class _Gap(Exception):
    """A message that does not follow what arrived before it."""

    def __init__(self, first: int, received: int):
        super().__init__(f"sent a message starting at element {first} after {received} arrived")


class _TaskStream:
    """Reads one task's elements from its worker, reconnecting on transient errors."""

    def __init__(self, reader: IterationReader, task: common_pb2.TaskInfo):
        self._reader = reader
        self._task = task
        self.task_id = task.task_id
        self._stream: ElementStream | None = None
        # When the current connection last brought a message (monotonic), and whether it was broken
        # for its silence; under _cancel_lock.
        self._heard = 0.0
        self._silent_for = 0.0
        self._cancel_lock = threading.Lock()
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stream-task-{task.task_id}", daemon=True)
        self._thread.start()

    def _requests(self, ended: threading.Event) -> Iterator[worker_pb2.StreamElementsRequest]:
        """The requests of one connection, until `ended`: a connection that is over grants
        nothing more, so that what the next one re-grants is all that was not used."""
        reader, credits = self._reader, self._reader.credits

        def over() -> bool:
            return reader.stopped.is_set() or ended.is_set()

        # Credits granted on an earlier connection and not used are granted again; the worker
        # sends again what it sent after what arrived (worker/delivery.py).
        unused = credits.unused(self.task_id)
        yield worker_pb2.StreamElementsRequest(
            task_id=self.task_id,
            iteration_client_id=reader.client_id,
            read_key=reader.session.read_key,
            compression=reader.compression,
            trainer_id=reader.trainer_id,
            credits=unused + credits.grant(self.task_id, 0, over),
            received=credits.received_total(self.task_id),
        )
        while not over() and not credits.is_done(self.task_id):
            # A grant of an ended connection would be lost with it while the ledger counts it as
            # granted, and the next connection's `unused` would not grant it again: credits.grant
            # checks `over` under the ledger's lock, under which `ended` is set (end_connection).
            count = credits.grant(self.task_id, 0.5, over)
            if count or credits.acknowledgement(self.task_id):
                # Each request acknowledges what has arrived: the worker forgets it.
                yield worker_pb2.StreamElementsRequest(credits=count, received=credits.received_total(self.task_id))

    def _run(self) -> None:
        reader = self._reader
        backoff = retrying.Backoff(reader.timeout_s)
        while not reader.stopped.is_set():
            ended = threading.Event()
            stream: ElementStream | None = None
            try:
                stream = open_stream(self._task, reader.protocol, self._requests(ended), reader.tls, reader.ring_bytes)
                with self._cancel_lock:
                    self._stream = stream
                    self._heard, self._silent_for = time.monotonic(), 0.0
                    if reader.stopped.is_set() or self._abandoned.is_set():
                        stream.cancel()
                delivered = False
                for response, buffers in stream:
                    self._heard = time.monotonic()
                    if response.chunks and not delivered:
                        # This connection works: a later break gets the whole timeout again.
                        delivered = True
                        backoff = retrying.Backoff(reader.timeout_s)
                    if response.chunks and response.first_element != reader.credits.received_total(self.task_id):
                        raise _Gap(response.first_element, reader.credits.received_total(self.task_id))
                    if response.receipt:  # before the elements reach the consumer (and a checkpoint)
                        covered = response.first_element + sum(proto.num_elements for proto in response.chunks)
                        reader.hold_receipt(self.task_id, covered, response.receipt)
                    for proto in response.chunks:
                        chunk = reader.codec.decode(proto, buffers)
                        reader.credits.received(self.task_id, chunk.num_elements)
                        reader.put(self, chunk)
                    if response.end_of_sequence:
                        reader.stream_ended(self, end_of_sequence=True)
                        return
                    if response.acknowledge:
                        reader.credits.ask_acknowledgement(self.task_id)
                error: BaseException = status.UnavailableError(
                    f"the stream of task {self._task.task_id} from worker "
                    f"{self._task.worker_address} ended without an end of sequence",
                )
                retry = True
            except status.ServiceError as e:
                if reader.stopped.is_set():
                    return
                where = f"reading task {self._task.task_id} from worker {self._task.worker_address}"
                error = errors.client_error(e, where)
                retry = e.code in status.RETRYABLE
                if self._silent_for:
                    error = status.UnavailableError(
                        f"{where}: nothing arrived for {self._silent_for:.1f} s (stream_timeout_ms): its host may be "
                        "partitioned from this one, or the worker frozen"
                    )
                    retry = True
                    log.warning("%s; connecting again", error)
            except _Gap as e:
                error = status.DataLossError(f"task {self._task.task_id}: worker {self._task.worker_address} {e}")
                retry = False
            except ValueError as e:  # a message that does not decode (wire.py checks every size)
                error = status.DataLossError(
                    f"task {self._task.task_id}: worker {self._task.worker_address} sent a malformed data message: {e}",
                )
                retry = False
            finally:
                reader.credits.end_connection(ended)
                with self._cancel_lock:
                    self._stream = None
                if stream is not None:
                    stream.close()
            if self._abandoned.is_set() or (retry and reader.task_finished(self._task.task_id)):
                # The dispatcher gave up on this worker: read on from the others.
                log.warning(
                    "task %d: worker %s is gone; reading on from the other workers",
                    self._task.task_id,
                    self._task.worker_address,
                )
                reader.stream_ended(self)
                return
            if not retry or not backoff.sleep():
                reader.fail(error)
                reader.stream_ended(self)
                return

    def cancel(self) -> None:
        with self._cancel_lock:
            if self._stream is not None:
                self._stream.cancel()

    def break_if_silent(self, timeout_s: float) -> None:
        """Breaks the current connection if nothing came on it for `timeout_s`."""
        with self._cancel_lock:
            silent_for = time.monotonic() - self._heard
            if self._stream is not None and not self._silent_for and silent_for > timeout_s:
                self._silent_for = silent_for
                self._stream.cancel()

    def abandon(self) -> None:
        """Ends the stream of a task whose worker was lost (what it delivered stays delivered)."""
        if not self._abandoned.is_set() and not self._reader.credits.is_done(self.task_id):
            self._abandoned.set()
            self.cancel()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
