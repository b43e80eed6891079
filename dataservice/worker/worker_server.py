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
import random
import socket
import threading
import time
from typing import Any

from dataservice import status
from dataservice.config import WorkerConfig, resolved
from dataservice.monitoring import metrics
from dataservice.monitoring.health import HealthReporter
from dataservice.monitoring.http_server import MonitoringServer
from dataservice.monitoring.logs import ids
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import policy, sharding
from dataservice.rpc import servers, tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.tf_errors import raising_tf_errors
from dataservice.transfer import grpc_service, local, shared_memory, tcp
from dataservice.transfer.element_codec import ElementCodec
from dataservice.v1 import common_pb2, dispatcher_pb2, worker_pb2
from dataservice.worker import sandbox, streaming, worker_state
from dataservice.worker.chunk_iterator import MAX_CHUNK_ELEMENTS, ChunkIterator
from dataservice.worker.cross_trainer_cache import CACHE_CHUNK_ELEMENTS, CachingTaskRunner
from dataservice.worker.dataset_cache import DatasetCache, DatasetDef
from dataservice.worker.grpc_servicer import WorkerServicer
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.round_robin import RoundRobinServer
from dataservice.worker.snapshot_writer import SnapshotWriters
from dataservice.worker.split_fetcher import SplitFetcher
from dataservice.worker.task_book import TaskBook
from dataservice.worker.task_runner import ProductionTotals, TaskRunner
from dataservice.worker.tcp_server import TcpTransferServer, listen_tcp

log = logging.getLogger(__name__)

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name


class WorkerServer:
    """A dataservice worker.

    >>> worker = WorkerServer(WorkerConfig(dispatcher_address="localhost:5050"))
    """

    def __init__(self, config: WorkerConfig, start: bool = True):
        if not isinstance(config, WorkerConfig):
            raise TypeError(f"config must be a WorkerConfig, got {type(config).__name__}")
        self._config = config
        if config.data_roots:
            # In place already when data-server started this process; here it fails (SandboxError)
            # in a process that already runs threads, rather than run pipelines unsandboxed.
            sandbox.restrict_reads(list(config.data_roots))
        elif config.auth_token_file or config.protocol == tls.TLS:
            log.warning(
                "this worker has credentials (a token or a TLS key) but no data_roots: its pipelines may read any "
                "file the process can, its credentials included; set data_roots to the directories of its data"
            )
        self._registry = None
        interceptors = []
        if config.monitoring_port is not None:
            self._registry = metrics.new_registry(metrics.WorkerCollector(self._metrics_data))
            interceptors.append(metrics.RpcMetricsInterceptor(self._registry))
        self._security = security = servers.ServerSecurity.of(config)
        interceptors.extend(security.interceptors(lambda: f"worker {self.address}"))
        self._server = servers.new_server(
            max_workers=64, max_receive_bytes=servers.WORKER_MAX_RECEIVE_BYTES, interceptors=interceptors
        )
        self._port = servers.bind(self._server, config.port, security.credentials())
        self.address = resolved(config.worker_address).replace("%port%", str(self._port))
        self._heartbeat_now = threading.Event()
        # This process's id for the dispatcher: a worker restarted at the same address is a new one.
        self._uid = random.getrandbits(63) | 1
        self._budget = MemoryBudget(resolved(config.memory_budget_bytes))
        self._tasks = TaskBook(on_unknown_task=self._heartbeat_now.set, budget=self._budget)
        self._production = ProductionTotals()
        self._streams = streams = streaming.StreamContext(
            self.address, self._tasks, self.report_finished, budget=self._budget
        )
        self._servicer = WorkerServicer(streams, start_task=self.start_task, prepare_dataset=self.prepare_dataset)
        grpc_service.add_worker_service(self._server, self._servicer)
        # Ready (SERVING) once registered with the dispatcher.
        self._health = HealthReporter(self._server, [SERVICE_NAME])
        self._monitoring: MonitoringServer | None = None
        # Clients read elements over TCP where the worker offers it (else over gRPC, at self.address).
        self._tcp: TcpTransferServer | None = None
        self.transfer_address = self.address
        self._unix: TcpTransferServer | None = None
        self._rings = shared_memory.RingBudget()
        if config.data_transfer_protocol == tcp.PROTOCOL:
            self._tcp = TcpTransferServer(
                functools.partial(streaming.stream_task, streams, protocol=tcp.PROTOCOL),
                listen_tcp(config.data_transfer_port),
                auth_token=security.auth_token,
                server=f"worker {self.address}",
                ssl_context=security.ssl_context(),
            )
            addresses = [tcp.SCHEME + resolved(config.data_transfer_address).replace("%dts_port%", str(self._tcp.port))]
            if hasattr(socket, "AF_UNIX"):
                # Clients on this host: a Unix socket, with rings of shared memory (transfer/tcp.py).
                name = tcp.unix_socket_name(self._uid)
                self._unix = TcpTransferServer(
                    functools.partial(streaming.stream_task, streams, protocol=tcp.UNIX_PROTOCOL),
                    tcp.listen_unix(name),
                    auth_token=security.auth_token,
                    server=f"worker {self.address}",
                    ssl_context=security.ssl_context(),
                    rings=self._rings,
                )
                addresses.append(tcp.UNIX_SCHEME + name)
            self.transfer_address = ",".join(addresses)
        self._dispatcher = DispatcherClient(
            config.dispatcher_address,
            resolved(config.dispatcher_timeout_ms) / 1000,
            auth_token=security.server_token,
            tls=security.as_client(),
        )
        self._datasets = DatasetCache(self._fetch_dataset_def)
        self._snapshot_writers = SnapshotWriters(self.address, self._uid, self._dispatcher, self._datasets)
        self._stopped = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        if start:
            self.start()

    # ---- lifecycle -------------------------------------------------------

    @raising_tf_errors
    def start(self) -> None:
        """Starts serving and registers with the dispatcher, retrying for up to
        dispatcher_timeout_ms; raises tf.errors.UnavailableError after that (tf_errors.py)."""
        if self._heartbeat_thread is not None:
            return
        self._server.start()
        for transfer in (self._tcp, self._unix):
            if transfer is not None:
                transfer.start()
        if self._registry is not None:
            self._monitoring = MonitoringServer(
                resolved(self._config.monitoring_port),
                self._registry,
                role="worker",
                health=self._health,
                **self._security.monitoring(),
            )
            log.info("worker /metrics on port %d", self._monitoring.port, extra=ids(worker=self.address))
        # Clients in this process read through memory (transfer/local.py).
        local.register(self.address, functools.partial(streaming.stream_task, self._streams, protocol=local.PROTOCOL))
        try:
            self._heartbeat(timeout_s=resolved(self._config.dispatcher_timeout_ms) / 1000)
        except BaseException:
            # Refused or unheard: nothing of this worker stays behind (ports, the local registry).
            self.stop(grace_s=0)
            raise
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True)
        self._heartbeat_thread.start()
        self._health.set_ready(True)
        log.info("registered with dispatcher %s", self._config.dispatcher_address, extra=ids(worker=self.address))

    def join(self) -> None:
        self._stopped.wait()

    def stop(self, grace_s: float = 1.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._carry_out(self._tasks.handle(worker_state.Stopping()))
        local.unregister(self.address)
        self._health.shutdown()
        self._heartbeat_now.set()
        self._snapshot_writers.stop()
        self._datasets.stop()
        for transfer in (self._tcp, self._unix):
            if transfer is not None:
                transfer.stop()
        if self._monitoring is not None:
            self._monitoring.stop()
        self._server.stop(grace_s).wait()
        self._servicer.idle_streams.stop()
        self._dispatcher.close()

    @property
    def target(self) -> str:
        return f"{self._config.protocol}://localhost:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def monitoring_port(self) -> int | None:
        """The bound port of /metrics; None without monitoring_port."""
        return self._monitoring.port if self._monitoring is not None else None

    def __enter__(self) -> WorkerServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- talking to the dispatcher ----------------------------------------

    def _heartbeat_loop(self) -> None:
        interval_s = resolved(self._config.heartbeat_interval_ms) / 1000
        while not self._stopped.is_set():
            self._heartbeat_now.wait(interval_s)
            self._heartbeat_now.clear()
            if self._stopped.is_set():
                return
            try:
                self._heartbeat_round(interval_s)
            except (ValueError, status.ServiceError):
                # stop() closes the dispatcher's channel under a call in flight (ValueError:
                # closed channel; CANCELLED): nothing is left to tell a dispatcher.
                if not self._stopped.is_set():
                    raise

    def _heartbeat_round(self, interval_s: float) -> None:
        """Expires what is no longer needed, reports finished tasks, then heartbeats."""
        self._datasets.expire()
        self._streams.deliveries.expire()
        in_use = frozenset(self._streams.deliveries.tasks())
        self._carry_out(self._tasks.handle(worker_state.Tick(time.monotonic(), in_use)))
        try:
            # Finished tasks first: a heartbeat before would be offered them again.
            self._report_unreported(timeout_s=interval_s)
        except status.ServiceError:
            pass  # a dispatcher that does not know this worker yet: after the heartbeat
        try:
            self._heartbeat(timeout_s=interval_s)
            self._report_unreported()
        except status.ServiceError as e:
            log.warning("heartbeat to dispatcher %s failed: %s", self._config.dispatcher_address, e.message)

    def _heartbeat(self, timeout_s: float) -> None:
        response = self._dispatcher.worker_heartbeat(
            self.address,
            self.transfer_address,
            self._tasks.running(),
            timeout_s,
            worker_uid=self._uid,
            task_loads=[
                dispatcher_pb2.TaskLoad(
                    task_id=runner.task_id,
                    elements_produced=runner.elements_produced,
                    bytes_produced=runner.bytes_produced,
                    processing_seconds=runner.processing_seconds,
                )
                for runner in self._tasks.runners()
            ],
            snapshot_chunks=self._snapshot_writers.current(),
            worker_tags=resolved(self._config.worker_tags),
        )
        self._carry_out(self._tasks.handle(worker_state.HeartbeatAnswered(response)))

    def _carry_out(self, instructions: list[worker_state.Instruction]) -> None:
        """Does what the worker's state machine decided (worker_state.py)."""
        for instruction in instructions:
            match instruction:
                case worker_state.StartTask(task):
                    self._start_task(task)
                case worker_state.DeleteTask(task_id, runner):
                    self._streams.deliveries.forget_task(task_id)
                    if runner is not None:
                        runner.stop()
                        log.info("task stopped by the dispatcher", extra=ids(task_id=task_id, worker=self.address))
                case worker_state.StopRunner(_, runner):
                    if runner is not None:
                        runner.stop()
                case worker_state.HeartbeatNow():
                    self._heartbeat_now.set()
                case worker_state.WriteSaveChunk(chunk):
                    self._snapshot_writers.start(chunk)
                case worker_state.DropSaveChunk(ref):
                    self._snapshot_writers.drop(ref.path, ref.chunk_index)

    def report_finished(self, task_id: int) -> None:
        """Notes that every element of the task was handed out: its runner stops, and the
        heartbeat thread tells the dispatcher at once (so that a client asking the dispatcher
        right after its end of sequence learns the task is over), retrying at its interval.
        Never waits: a stream calls it before its last messages go out."""
        self._carry_out(self._tasks.handle(worker_state.TaskFinished(task_id, at=time.monotonic())))

    def _report_unreported(self, timeout_s: float = 5.0) -> None:
        tasks = self._tasks.unreported()
        if not tasks:
            return
        self._dispatcher.worker_update(self.address, tasks, timeout_s)
        self._tasks.handle(worker_state.TasksReported(tuple(tasks)))

    def _fetch_dataset_def(self, dataset_id: str) -> DatasetDef:
        """The dataset's graph and element spec from the dispatcher; a graph the dataset policy
        refuses raises status.ServiceError (PERMISSION_DENIED) before anything is built."""
        response = self._dispatcher.get_dataset_def(dataset_id)
        if not self._config.allow_unsafe_ops:
            try:
                policy.check(graph_lib.parse_graph(response.graph_def))
            except (policy.UnsafeDatasetError, graph_lib.InvalidDatasetError) as e:
                log.warning("dataset refused: %s", e, extra=ids(dataset_id=dataset_id, worker=self.address))
                code = status.Code.PERMISSION_DENIED
                if isinstance(e, graph_lib.InvalidDatasetError):
                    code = status.Code.INVALID_ARGUMENT
                raise status.error(code, f"worker {self.address} will not run dataset {dataset_id}: {e}") from None
        return response.graph_def, graph_lib.decode_element_spec(response.metadata.element_spec)

    def prepare_dataset(self, dataset_id: str) -> None:
        """Builds a newly registered dataset and its first iterator ahead of its first task."""
        if not self._stopped.is_set():
            self._datasets.prepare_soon(dataset_id)

    # ---- tasks -----------------------------------------------------------

    def start_task(self, task: common_pb2.TaskDef) -> None:
        """A task the dispatcher pushed (ProcessTask): started unless it runs or finished already."""
        self._carry_out(self._tasks.handle(worker_state.TaskOffered(task)))

    def _start_task(self, task: common_pb2.TaskDef) -> None:
        """Builds the task's pipeline and runner (the book refuses a task it knows already)."""
        try:
            codec: ElementCodec | None = self._datasets.codec(task.dataset_id)
            make_chunks = functools.partial(self._task_elements, task)
        except status.ServiceError as e:
            # The worker will not run the dataset: the task starts and fails with the reason,
            # which its clients raise.
            codec, make_chunks = None, functools.partial(_raise, e)

        def start() -> tuple[TaskRunner, RoundRobinServer | None]:
            if task.use_cross_trainer_cache:
                runner: TaskRunner = CachingTaskRunner(
                    task.task_id,
                    make_chunks,
                    codec,
                    dataset_id=task.dataset_id,
                    totals=self._production,
                    cache_bytes=resolved(self._config.cross_trainer_cache_size_bytes),
                    produce_now=False,
                )
            else:
                runner = TaskRunner(
                    task.task_id,
                    make_chunks,
                    codec,
                    dataset_id=task.dataset_id,
                    totals=self._production,
                    produce_now=False,
                )
            rounds = RoundRobinServer(runner, task.num_consumers, task.starting_round) if task.num_consumers else None
            return runner, rounds

        dynamic = task.processing_mode.sharding_policy == common_pb2.SHARDING_POLICY_DYNAMIC
        if self._tasks.add(task.task_id, start, secret=task.read_key, produce_now=not dynamic) is None:
            return
        log.info(
            "task started",
            extra=ids(
                job_id=task.job_id,
                iteration_id=task.iteration_id,
                task_id=task.task_id,
                dataset_id=task.dataset_id,
                worker=self.address,
            ),
        )

    def _task_elements(self, task: common_pb2.TaskDef) -> ChunkIterator:
        """The elements of a task's pipeline: whole (parallel_epochs), over the dispatcher's
        splits (distributed_epoch), or this worker's static shard."""
        policy = task.processing_mode.sharding_policy
        # The cross-trainer cache produces only just ahead of its trainers: small chunks.
        max_chunk = CACHE_CHUNK_ELEMENTS if task.use_cross_trainer_cache else MAX_CHUNK_ELEMENTS
        self._datasets.rate(task.dataset_id).suggest(task.seconds_per_element)
        keepalive = None
        if policy == common_pb2.SHARDING_POLICY_DYNAMIC:
            sources = self._datasets.split_sources(task.dataset_id)
            fetcher = SplitFetcher(
                self._dispatcher, task.iteration_id, task.task_id, sources, self._datasets.split_rate(task.dataset_id)
            )
            if not task.skip_elements:
                return self._datasets.split_iterator(task.dataset_id, task.repetition, fetcher.ranges, max_chunk)
            dataset, keepalive = self._datasets.split_dataset(task.dataset_id, task.repetition, fetcher.ranges)
        elif policy in sharding.STATIC_POLICIES:
            dataset = sharding.shard(
                self._datasets.task_dataset(task.dataset_id, task.repetition),
                policy,
                task.num_workers,
                task.worker_index,
            )
        elif not task.skip_elements:
            return self._datasets.whole_iterator(task.dataset_id, task.repetition, max_chunk)
        else:
            dataset = self._datasets.task_dataset(task.dataset_id, task.repetition)
        if task.skip_elements:
            # A restored iterator's task: its consumer had taken these before the checkpoint.
            dataset = dataset.skip(task.skip_elements)
        # The split pipeline (its generator's functions) must outlive the dataset's iterator.
        dataset._dataservice_keepalive = keepalive
        waited_s = keepalive.waited_s if keepalive is not None else None
        return self._datasets.chunk_iterator(task.dataset_id, dataset, max_chunk, waited_s)

    def running_tasks(self) -> list[int]:
        """Ids of the tasks whose pipelines run on this worker now."""
        return self._tasks.running()

    def _metrics_data(self) -> dict[str, Any]:
        runners = self._tasks.runners()
        buffered = [runner.buffered() for runner in runners]
        sent, open_streams = self._streams.transfer.snapshot()
        return {
            "running_tasks": len(runners),
            "buffered_elements": sum(b[0] for b in buffered),
            "buffered_bytes": sum(b[1] for b in buffered),
            "buffer_capacity_bytes": sum(runner.capacity_bytes for runner in runners),
            "memory_budget_bytes": self._budget.total_bytes,
            "unacknowledged_bytes": self._streams.deliveries.unacknowledged_bytes(),
            "produced": self._production.by_dataset(),
            "sent": sent,
            "open_streams": open_streams,
            "shared_memory": self._rings.totals(),
        }


def _raise(error: BaseException) -> ChunkIterator:
    raise error
