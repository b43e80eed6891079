"""Coordinated reads: consumers of a job read in rounds, all from the same worker.

Round r is served by one task, the same for every consumer: the tasks whose
starting round is at most r, in task-id order, take turns (r modulo their
number). A task added when a worker joins starts at a round no consumer may
have read yet (the dispatcher grants rounds ahead and starts new tasks after
the last grant), so all consumers add it at the same round. The rounds of a
task whose worker was lost are skipped by everyone, so a lost worker costs its
rounds, not a deadlock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator

import grpc

from dataservice import status
from dataservice.client.reading_meter import ReadingMeter
from dataservice.client.session import IterationSession, JobSpec
from dataservice.config import DEFAULT_STREAM_TIMEOUT_MS
from dataservice.rpc import errors, retrying
from dataservice.rpc.channels import shared_channels
from dataservice.rpc.tls import TlsFiles
from dataservice.transfer import grpc_service, wire
from dataservice.transfer.chunk import Chunk
from dataservice.transfer.wire import WireCodec
from dataservice.v1 import common_pb2, dispatcher_pb2, worker_pb2

# About how long a wait for a round goes before rounds() yields None (a worker's own wait for
# the other consumers is ROUND_WAIT_S, worker/streaming.py).
TICK_S = 2.0


class CoordinatedReader:
    """An iterator over the elements (one-element chunks) of consumer `consumer_index`."""

    def __init__(
        self,
        dispatcher_address: str,
        job: JobSpec,
        repetition: int,
        codec: WireCodec,
        consumer_index: int,
        timeout_s: float,
        compression: common_pb2.Compression,
        tls: TlsFiles | None = None,
        stream_timeout_s: float = DEFAULT_STREAM_TIMEOUT_MS / 1000,
    ):
        self.codec = codec
        # A worker answers within a round's wait (not_ready when the other consumers are late):
        # a call without an answer for this long is to a partitioned or frozen host.
        self._call_timeout_s = stream_timeout_s
        self._tls = tls
        self._consumer_index = consumer_index
        self._timeout_s = timeout_s
        self._compression = compression
        self._round = 0
        self._round_limit = 0
        self._tasks: dict[int, common_pb2.TaskInfo] = {}
        self._iteration_finished = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        # Per worker address, the shared channel this reader acquired and its stub.
        self._stubs: dict[str, tuple[grpc.Channel, grpc_service.WorkerDataStub]] = {}
        self.meter = ReadingMeter()
        self.session = IterationSession(
            dispatcher_address,
            job,
            repetition,
            timeout_s,
            on_heartbeat=self._on_heartbeat,
            on_error=self._fail,
            current_round=lambda: self._round,
            reading=self.meter.totals,
            tls=tls,
        )
        self.client_id = self.session.client_id
        self.session.start()

    def _on_heartbeat(self, response: dispatcher_pb2.ClientHeartbeatResponse) -> None:
        with self._changed:
            for task in response.tasks:
                self._tasks[task.task_id] = task
            self._round_limit = max(self._round_limit, response.round_limit)
            self._iteration_finished = response.iteration_finished
            self._changed.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._changed:
            self._error = error
            self._changed.notify_all()

    def __iter__(self) -> Iterator[Chunk]:
        for chunk in self.rounds():
            if chunk is not None:
                yield chunk

    def rounds(self) -> Iterator[Chunk | None]:
        """The consumer's elements (one-element chunks), with a None whenever a wait of about
        TICK_S (for the other consumers, a grant, or a worker's answer) came back empty.

        tf.data cannot cancel a call into Python, and destroys an iterator only once the call
        it has in flight returns: an iterator that reads ahead, as tf.data's own prefetch does,
        would otherwise wait forever for a round the consumers that stopped reading never ask
        for. A caller inside tf.data returns to it at each None (client/api.py)."""
        while not self.session.stopped.is_set():
            self.meter.wait_started()
            task = yield from self._task_of_round(self._round)
            if task is None:
                return
            read = yield from self._read(task, self._round)
            self._round += 1
            if read is None:
                continue  # the task's worker was lost: everyone skips its rounds
            response, buffers = read
            if response.end_of_sequence:
                return
            chunk = self.codec.decode(response.chunk, buffers)
            self.meter.handed(chunk.num_elements, chunk.nbytes)
            yield chunk

    def _task_of_round(self, round_index: int) -> Generator[None, None, common_pb2.TaskInfo | None]:
        """The task serving the round (lost ones included: their rounds are skipped, which
        also carries the consumers to the first round of a worker that replaces them);
        waits for the dispatcher's grant and for a first task, yielding every TICK_S of it.
        None: the iteration is over."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            tick = time.monotonic() + TICK_S
            with self._changed:
                while True:
                    if self._error is not None:
                        raise self._error
                    serving = sorted(
                        (t for t in self._tasks.values() if t.starting_round <= round_index), key=lambda t: t.task_id
                    )
                    if self._iteration_finished and all(t.finished for t in serving):
                        return None
                    if serving and round_index < self._round_limit:
                        return serving[round_index % len(serving)]
                    if round_index >= self._round_limit and time.monotonic() > deadline:
                        raise status.DeadlineExceededError(
                            f"consumer {self._consumer_index}: the dispatcher granted no round beyond "
                            f"{self._round_limit - 1} for {self._timeout_s:.0f} s"
                        )
                    self.session.wake()
                    self._changed.wait(0.2)
                    if self.session.stopped.is_set():
                        return None
                    if time.monotonic() >= tick:
                        break
            yield None

    def _read(
        self, task: common_pb2.TaskInfo, round_index: int
    ) -> Generator[None, None, tuple[worker_pb2.GetElementResponse, wire.FrameBuffers] | None]:
        """The consumer's element of the round (the frame's header and buffers); None when the
        task's worker is lost. Yields after each try that brought nothing (a worker answers
        not_ready within its round wait, about TICK_S)."""
        request = worker_pb2.GetElementRequest(
            task_id=task.task_id,
            iteration_client_id=self.client_id,
            read_key=self.session.read_key,
            consumer_index=self._consumer_index,
            round=round_index,
            compression=self._compression,
        )
        stub = self._stub(task.worker_address)
        backoff = retrying.Backoff(self._timeout_s)
        while not self.session.stopped.is_set():
            if self._task_lost(task.task_id):
                return None
            try:
                data = stub.GetElement(request, timeout=self._call_timeout_s)
            except grpc.RpcError as e:
                if e.code() not in errors.RETRYABLE_CODES and e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise errors.client_error(
                        e, f"reading round {round_index} of task {task.task_id} from worker {task.worker_address}"
                    ) from None
                if not backoff.sleep():
                    if self._task_lost(task.task_id):
                        return None
                    raise errors.client_error(
                        e, f"reading round {round_index} of task {task.task_id} from worker {task.worker_address}"
                    ) from None
                self.session.wake()
                yield None
                continue
            response, buffers = wire.unframe(data, worker_pb2.GetElementResponse)
            if response.not_ready:
                yield None  # the other consumers have not reached this round yet
                continue
            return response, buffers
        return None

    def _task_lost(self, task_id: int) -> bool:
        with self._changed:
            task = self._tasks.get(task_id)
            return task is not None and task.finished

    def _stub(self, address: str) -> grpc_service.WorkerDataStub:
        if address not in self._stubs:
            channel = shared_channels.acquire(address, self._tls)
            self._stubs[address] = (channel, grpc_service.WorkerDataStub(channel))
        return self._stubs[address][1]

    def close(self) -> None:
        self.session.close()
        for channel, _ in self._stubs.values():
            shared_channels.release(channel)
