"""Reads one iteration of a job: the elements of all its tasks, from all workers.

A heartbeat thread asks the dispatcher which tasks the iteration has (new
workers bring new tasks) and whether it is finished; one stream thread per
task reads that task's elements into a bounded queue that the consumer
drains. The iteration is over for this client when the dispatcher says every
task finished and every stream this client opened has reached its end.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Dict, Iterator, List, Optional

import grpc
import tensorflow as tf

from dataservice import rpc
from dataservice.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, worker_pb2, worker_pb2_grpc
from dataservice.wire import ElementCodec

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
# How often the consumer checks for the end or an error while the queue is empty.
_POLL_S = 0.05
_NO_WORKERS_WARNING_S = 10.0


class JobSpec:
    """What a client asks the dispatcher for: which job, and how it is read."""

    def __init__(self, dataset_id: str, sharding_policy: int, job_name: Optional[str],
                 num_consumers: Optional[int], target_workers: int):
        self.dataset_id = dataset_id
        self.sharding_policy = sharding_policy
        self.job_name = job_name or ""
        self.num_consumers = num_consumers or 0
        self.target_workers = target_workers


class IterationReader:
    """An iterator over decoded chunks (tuples of component arrays) of one iteration."""

    def __init__(self, dispatcher_address: str, job: JobSpec, repetition: int, codec: ElementCodec,
                 buffer_chunks: int, timeout_s: float):
        self._address = dispatcher_address
        self.codec = codec
        self.timeout_s = timeout_s
        self._channel = rpc.make_channel(dispatcher_address)
        self._stub = dispatcher_pb2_grpc.DispatcherServiceStub(self._channel)
        self._queue: "queue.Queue[tuple]" = queue.Queue(maxsize=max(1, buffer_chunks))
        self._streams: Dict[int, _TaskStream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._iteration_finished = False
        # Tasks the dispatcher reports finished: their data ran out, or their worker was lost.
        self._finished_tasks: set = set()
        self._error: Optional[BaseException] = None
        job_response = self._call(self._stub.GetOrCreateJob, dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=job.dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=job.sharding_policy),
            job_name=job.job_name, num_consumers=job.num_consumers, target_workers=job.target_workers,
        ), "creating a job")
        iteration = self._call(self._stub.GetOrCreateIteration, dispatcher_pb2.GetOrCreateIterationRequest(
            job_id=job_response.job_id, repetition=repetition), "creating an iteration")
        self.client_id = iteration.iteration_client_id
        self._waiting_since = time.monotonic()
        self._heartbeat()
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="client-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def _call(self, method, request, what: str):
        return rpc.call(method, request, server=f"dispatcher at {self._address}", what=what, timeout_s=self.timeout_s)

    # ---- the consumer side -----------------------------------------------

    def __iter__(self) -> Iterator[tuple]:
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._error is not None:
                    raise self._error
                if self._finished():
                    return
                continue
            yield item

    def _finished(self) -> bool:
        with self._lock:
            streams = list(self._streams.values())
            finished = self._iteration_finished
        return finished and all(s.done for s in streams) and self._queue.empty()

    def close(self) -> None:
        """Stops the streams and releases this client at the dispatcher (best effort)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.cancel()
        try:
            self._stub.ReleaseIterationClient(
                dispatcher_pb2.ReleaseIterationClientRequest(iteration_client_id=self.client_id), timeout=2)
        except grpc.RpcError as e:
            log.debug("releasing iteration client %d failed: %s", self.client_id, e.code().name)
        for stream in streams:
            stream.join(timeout=2)
        self._heartbeat_thread.join(timeout=2)
        self._channel.close()

    # ---- dispatcher side -------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(HEARTBEAT_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._heartbeat()
            except tf.errors.OpError as e:
                self.fail(e)
                return

    def _heartbeat(self) -> None:
        response = self._call(self._stub.ClientHeartbeat, dispatcher_pb2.ClientHeartbeatRequest(
            iteration_client_id=self.client_id), "client heartbeat")
        with self._lock:
            for task in response.tasks:
                if task.finished:
                    self._finished_tasks.add(task.task_id)
                elif task.task_id not in self._streams and not self._stop.is_set():
                    self._streams[task.task_id] = _TaskStream(self, task)
            self._iteration_finished = response.iteration_finished
            no_tasks = not response.tasks
        if no_tasks and time.monotonic() - self._waiting_since > _NO_WORKERS_WARNING_S:
            log.warning("no worker has a task for this iteration yet: are workers registered with the "
                        "dispatcher at %s?", self._address)
            self._waiting_since = time.monotonic()

    # ---- called by the streams -------------------------------------------

    def put(self, item: tuple) -> bool:
        """Queues a chunk, waiting while the queue is full; False once the reader is closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def stream_done(self) -> None:
        self._wake.set()

    def task_finished(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._finished_tasks

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake.set()

    @property
    def stopped(self) -> threading.Event:
        return self._stop


class _TaskStream:
    """Reads one task's elements from its worker, reconnecting on transient errors."""

    def __init__(self, reader: IterationReader, task: common_pb2.TaskInfo):
        self._reader = reader
        self._task = task
        self._call: Optional[grpc.Future] = None
        self._cancel_lock = threading.Lock()
        self.done = False
        self._channel = rpc.make_channel(task.transfer_address)
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name=f"stream-task-{task.task_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        reader = self._reader
        backoff = rpc.Backoff(reader.timeout_s)
        request = worker_pb2.StreamElementsRequest(task_id=self._task.task_id, iteration_client_id=reader.client_id)
        while not reader.stopped.is_set():
            with self._cancel_lock:
                if reader.stopped.is_set():
                    break
                self._call = self._stub.StreamElements(request)
            try:
                for response in self._call:
                    for chunk in response.chunks:
                        if not reader.put(reader.codec.decode_chunk(chunk)):
                            return
                    if response.end_of_sequence:
                        self.done = True
                        reader.stream_done()
                        return
                error: BaseException = tf.errors.UnavailableError(
                    None, None, f"the stream of task {self._task.task_id} from worker "
                                f"{self._task.worker_address} ended without an end of sequence")
                retry = True
            except grpc.RpcError as e:
                if reader.stopped.is_set():
                    return
                error = rpc.to_tf_error(e, f"reading task {self._task.task_id} from worker {self._task.worker_address}")
                retry = e.code() in rpc.RETRYABLE_CODES
            if retry and reader.task_finished(self._task.task_id):
                # The dispatcher gave up on this worker: read on from the others.
                log.warning("task %d: worker %s is gone; reading on from the other workers",
                            self._task.task_id, self._task.worker_address)
                self.done = True
                reader.stream_done()
                return
            if not retry or not backoff.sleep():
                reader.fail(error)
                return

    def cancel(self) -> None:
        with self._cancel_lock:
            if self._call is not None:
                self._call.cancel()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        self._channel.close()
