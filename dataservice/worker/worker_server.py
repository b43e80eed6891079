"""WorkerServer: a worker as a gRPC server (as tf.data.experimental.service.WorkerServer).

The worker registers with the dispatcher through its first heartbeat, then
heartbeats every heartbeat_interval_ms: the dispatcher answers with the tasks
to start and to stop. The dispatcher also pushes new tasks with ProcessTask,
so a new iteration does not wait for the next heartbeat. Clients read task
streams over the worker's TCP data transfer (worker/tcp_server.py) unless it
is configured for gRPC only; gRPC serves them too, and coordinated reads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Dict, Optional, Set

import grpc
import tensorflow as tf

from dataservice import status
from dataservice.config import WorkerConfig
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import sharding, splits
from dataservice.rpc import errors, servers
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import grpc_service, tcp, wire
from dataservice.v1 import common_pb2, worker_pb2
from dataservice.worker import streaming
from dataservice.worker.dataset_cache import DatasetCache, DatasetDef
from dataservice.worker.element_iterator import ComponentIterator
from dataservice.worker.round_robin import RoundRobinServer
from dataservice.worker.split_fetcher import SplitFetcher
from dataservice.worker.task_runner import TaskRunner
from dataservice.worker.tcp_server import TcpTransferServer

log = logging.getLogger(__name__)

# Coordinated reads: how long a GetElement waits for the other consumers before
# it answers not_ready (the client asks again).
ROUND_WAIT_S = 2.0


class _WorkerService:
    """The WorkerService methods; StreamElements and GetElement answer frames (wire.py)."""

    def __init__(self, worker: "WorkerServer"):
        self._worker = worker

    @errors.handler
    def ProcessTask(self, request, context):
        if not request.task.task_id:
            raise status.invalid_argument("ProcessTask needs a task with a task_id")
        self._worker.start_task(request.task)
        return worker_pb2.ProcessTaskResponse()

    @errors.handler
    def PrepareDataset(self, request, context):
        if not request.dataset_id:
            raise status.invalid_argument("PrepareDataset needs a dataset_id")
        self._worker.prepare_dataset(request.dataset_id)
        return worker_pb2.PrepareDatasetResponse()

    def StreamElements(self, request_iterator, context):
        request = next(request_iterator, None)
        if request is None:
            return
        try:
            for header, buffers in streaming.stream_task(self._worker, request, request_iterator, context.is_active):
                yield wire.frame(header, buffers)
        except status.ServiceError as e:
            context.abort(errors.grpc_code(e.code), e.message)

    def GetElement(self, request, context):
        worker = self._worker
        runner = worker.wait_for_task(request.task_id, streaming.UNKNOWN_TASK_WAIT_S)
        if runner is None:
            if request.task_id in worker.finished_tasks:
                return wire.frame(worker_pb2.GetElementResponse(end_of_sequence=True))
            context.abort(grpc.StatusCode.UNAVAILABLE, streaming.unknown_task_message(worker.address, request.task_id))
        rounds = worker.round_robin(request.task_id)
        if rounds is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {request.task_id} is not a coordinated-reads task: read it with StreamElements",
            )
        try:
            element, end = rounds.get(request.consumer_index, request.round, ROUND_WAIT_S)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"task {request.task_id}: {e}")
        except Exception as e:  # noqa: BLE001 - the pipeline's own error, for the client
            message = streaming.pipeline_error(request.task_id, worker.address, e)
            context.abort(errors.grpc_code(status.code_of(e)), message)
        if end:
            return wire.frame(worker_pb2.GetElementResponse(end_of_sequence=True))
        if element is None:
            if runner.stopped:
                context.abort(grpc.StatusCode.CANCELLED, streaming.stopped_message(request.task_id))
            return wire.frame(worker_pb2.GetElementResponse(not_ready=True))
        (chunk,), buffers = runner.codec.encode([element], request.compression == common_pb2.COMPRESSION_AUTO)
        return wire.frame(worker_pb2.GetElementResponse(chunk=chunk), buffers)


class WorkerServer:
    """A dataservice worker.

    >>> worker = WorkerServer(WorkerConfig(dispatcher_address="localhost:5050"))
    """

    def __init__(self, config: WorkerConfig, start: bool = True):
        if not isinstance(config, WorkerConfig):
            raise TypeError(f"config must be a WorkerConfig, got {type(config).__name__}")
        self._config = config
        self._server = servers.new_server(max_workers=64)
        self._port = servers.bind(self._server, config.port)
        self.address = config.worker_address.replace("%port%", str(self._port))
        grpc_service.add_worker_service(self._server, _WorkerService(self))
        # Clients read elements over TCP where the worker offers it (else over gRPC, at self.address).
        self._tcp: Optional[TcpTransferServer] = None
        self.transfer_address = self.address
        if config.data_transfer_protocol == tcp.PROTOCOL:
            self._tcp = TcpTransferServer(functools.partial(streaming.stream_task, self), config.data_transfer_port)
            self.transfer_address = tcp.SCHEME + config.data_transfer_address.replace("%dts_port%", str(self._tcp.port))
        self._dispatcher = DispatcherClient(config.dispatcher_address, config.dispatcher_timeout_ms / 1000)
        self._lock = threading.Lock()
        self._tasks_changed = threading.Condition(self._lock)
        self._runners: Dict[int, TaskRunner] = {}
        self._round_robins: Dict[int, RoundRobinServer] = {}
        self.finished_tasks: Set[int] = set()
        self._unreported: Set[int] = set()
        self._datasets = DatasetCache(self._fetch_dataset_def)
        self._heartbeat_now = threading.Event()
        self._stopped = threading.Event()
        self._heartbeat_thread: Optional[threading.Thread] = None
        if start:
            self.start()

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Starts serving and registers with the dispatcher, retrying for up to
        dispatcher_timeout_ms; raises tf.errors.UnavailableError after that."""
        if self._heartbeat_thread is not None:
            return
        self._server.start()
        if self._tcp is not None:
            self._tcp.start()
        self._heartbeat(timeout_s=self._config.dispatcher_timeout_ms / 1000)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True)
        self._heartbeat_thread.start()
        log.info("worker %s registered with dispatcher %s", self.address, self._config.dispatcher_address)

    def join(self) -> None:
        self._stopped.wait()

    def stop(self, grace_s: float = 1.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._heartbeat_now.set()
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
            self._round_robins.clear()
        for runner in runners:
            runner.stop()
        self._datasets.stop()
        if self._tcp is not None:
            self._tcp.stop()
        self._server.stop(grace_s).wait()
        self._dispatcher.close()

    @property
    def target(self) -> str:
        return f"grpc://localhost:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def __enter__(self) -> "WorkerServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- talking to the dispatcher ----------------------------------------

    def _heartbeat_loop(self) -> None:
        interval_s = self._config.heartbeat_interval_ms / 1000
        while not self._stopped.is_set():
            self._heartbeat_now.wait(interval_s)
            self._heartbeat_now.clear()
            if self._stopped.is_set():
                return
            self._datasets.expire()
            try:
                self._heartbeat(timeout_s=interval_s)
                self._report_unreported()
            except tf.errors.OpError as e:
                log.warning("heartbeat to dispatcher %s failed: %s", self._config.dispatcher_address, e.message)

    def _heartbeat(self, timeout_s: float) -> None:
        with self._lock:
            current = sorted(self._runners)
        response = self._dispatcher.worker_heartbeat(self.address, self.transfer_address, current, timeout_s)
        for task in response.new_tasks:
            self.start_task(task)
        for task_id in response.tasks_to_delete:
            self._delete_task(task_id)

    def report_finished(self, task_id: int) -> None:
        """Tells the dispatcher that every element of the task was handed out.

        Tried at once, so that a client asking the dispatcher right after its
        end of sequence learns the task is over; retried by the heartbeat loop.
        """
        with self._lock:
            if task_id in self.finished_tasks:
                return
            self.finished_tasks.add(task_id)
            self._unreported.add(task_id)
            runner = self._runners.pop(task_id, None)
            self._round_robins.pop(task_id, None)
        if runner is not None:
            runner.stop()
        try:
            self._report_unreported(timeout_s=2.0)
        except tf.errors.OpError as e:
            log.warning("could not report finished task %d yet: %s", task_id, e.message)

    def _report_unreported(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            tasks = sorted(self._unreported)
        if not tasks:
            return
        self._dispatcher.worker_update(self.address, tasks, timeout_s)
        with self._lock:
            self._unreported.difference_update(tasks)

    def _fetch_dataset_def(self, dataset_id: str) -> DatasetDef:
        response = self._dispatcher.get_dataset_def(dataset_id)
        return response.graph_def, graph_lib.decode_element_spec(response.metadata.element_spec)

    def prepare_dataset(self, dataset_id: str) -> None:
        """Builds a newly registered dataset and its first iterator ahead of its first task."""
        if not self._stopped.is_set():
            self._datasets.prepare_soon(dataset_id)

    # ---- tasks -----------------------------------------------------------

    def start_task(self, task: common_pb2.TaskDef) -> None:
        """Starts a task's pipeline unless it is running or finished already."""
        with self._lock:
            if task.task_id in self._runners or task.task_id in self.finished_tasks or self._stopped.is_set():
                return
        codec = self._datasets.codec(task.dataset_id)
        with self._lock:
            if task.task_id in self._runners or task.task_id in self.finished_tasks:
                return
            runner = TaskRunner(task.task_id, lambda: self._task_elements(task), codec)
            self._runners[task.task_id] = runner
            if task.num_consumers:
                self._round_robins[task.task_id] = RoundRobinServer(runner, task.num_consumers, task.starting_round)
            self._tasks_changed.notify_all()
        log.info("worker %s started task %d (iteration %d)", self.address, task.task_id, task.iteration_id)

    def _task_elements(self, task: common_pb2.TaskDef) -> ComponentIterator:
        """The elements of a task's pipeline: whole (parallel_epochs), over the dispatcher's
        splits (distributed_epoch), or this worker's static shard."""
        policy = task.processing_mode.sharding_policy
        codec = self._datasets.codec(task.dataset_id)
        if policy == common_pb2.SHARDING_POLICY_DYNAMIC:
            graph_def, element_spec = self._datasets.definition(task.dataset_id)
            sources = splits.find_sources(graph_lib.parse_graph(graph_def))
            fetcher = SplitFetcher(self._dispatcher, task.iteration_id, task.task_id, sources)
            dataset, keepalive = splits.rebuild_with_splits(graph_def, element_spec, sources, fetcher.ranges)
            # The rebuilt graph's function must outlive the dataset's iterator.
            dataset._dataservice_keepalive = keepalive  # pylint: disable=protected-access
            return ComponentIterator(dataset, codec)
        if policy in sharding.STATIC_POLICIES:
            dataset = sharding.shard(
                self._datasets.whole_dataset(task.dataset_id), policy, task.num_workers, task.worker_index
            )
            return ComponentIterator(dataset, codec)
        return self._datasets.whole_iterator(task.dataset_id)

    def _delete_task(self, task_id: int) -> None:
        with self._lock:
            runner = self._runners.pop(task_id, None)
            self._round_robins.pop(task_id, None)
        if runner is not None:
            runner.stop()
            log.info("worker %s stopped task %d", self.address, task_id)

    def round_robin(self, task_id: int) -> Optional[RoundRobinServer]:
        """The round server of a coordinated-reads task (None for other tasks)."""
        with self._lock:
            return self._round_robins.get(task_id)

    def wait_for_task(self, task_id: int, timeout_s: float) -> Optional[TaskRunner]:
        """The task's runner; a task not heard of yet makes the worker heartbeat at once."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while task_id not in self._runners and task_id not in self.finished_tasks:
                self._heartbeat_now.set()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped.is_set():
                    return None
                self._tasks_changed.wait(min(remaining, 0.2))
            return self._runners.get(task_id)
