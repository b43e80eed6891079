"""DispatchServer: the dispatcher as a gRPC server (as tf.data.experimental.service.DispatchServer)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dataservice.config import DispatcherConfig
from dataservice.dispatcher import journal, status_report
from dataservice.dispatcher.context import dispatcher_at
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.grpc_servicer import DispatcherServicer
from dataservice.dispatcher.journal import JournalWriter
from dataservice.dispatcher.state import DispatcherState
from dataservice.dispatcher.worker_push import GrpcWorkerNotifier
from dataservice.monitoring import metrics
from dataservice.monitoring.health import HealthReporter
from dataservice.monitoring.http_server import MonitoringServer
from dataservice.rpc import servers
from dataservice.v1 import dispatcher_pb2, dispatcher_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = dispatcher_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name


class DispatchServer:
    """The dispatcher of a dataservice cluster.

    >>> dispatcher = DispatchServer()            # binds a free port and starts
    >>> dispatcher.target                        # 'grpc://localhost:PORT'

    Started, it serves gRPC health at once (NOT_SERVING) and the dispatcher's own service
    once it has recovered its journal (fault_tolerant_mode); calls before then are
    UNAVAILABLE, which clients and workers retry.
    """

    def __init__(self, config: DispatcherConfig | None = None, start: bool = True):
        self._config = config or DispatcherConfig()
        if not isinstance(self._config, DispatcherConfig):
            raise TypeError(f"config must be a DispatcherConfig, got {type(self._config).__name__}")
        self._registry = None
        interceptors = []
        if self._config.monitoring_port is not None:
            self._registry = metrics.new_registry(metrics.DispatcherCollector(self._status_or_empty))
            interceptors.append(metrics.RpcMetricsInterceptor(self._registry))
        self._security = security = servers.ServerSecurity.of(self._config)
        if security.auth_token is not None and self._config.fault_tolerant_mode and not self._config.snapshot_roots:
            log.warning(
                "this dispatcher requires a token but has no snapshot_roots: any client with the token may have "
                "distributed_save write under any path the servers can write; set snapshot_roots"
            )
        interceptors.extend(security.interceptors(lambda: dispatcher_at(self._address)))
        self._server = servers.new_server(
            max_workers=32,
            max_receive_bytes=min(
                servers.MAX_MESSAGE_BYTES, self._config.max_graph_bytes + servers.REQUEST_OVERHEAD_BYTES
            ),
            interceptors=interceptors,
        )
        self._port = servers.bind(self._server, self._config.port, security.credentials())
        self._servicer = DispatcherServicer(address=dispatcher_at(self._address))
        dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server(self._servicer, self._server)
        self._health = HealthReporter(self._server, [SERVICE_NAME])
        self._notifier = GrpcWorkerNotifier(auth_token=security.server_token, tls=security.as_client())
        self._core: DispatcherCore | None = None
        self._journal: JournalWriter | None = None
        self._monitoring: MonitoringServer | None = None
        self._started = False
        self._stopped = threading.Event()
        self._stopping = threading.Event()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="dispatcher-gc", daemon=True)
        if start:
            self.start()

    def _recover(self) -> tuple[DispatcherState | None, JournalWriter | None]:
        """In fault_tolerant_mode: replays the journal and opens a new segment (meanwhile the
        dispatcher's RPCs answer UNAVAILABLE and its health says NOT_SERVING)."""
        work_dir = self._config.work_dir
        if not self._config.fault_tolerant_mode or work_dir is None:  # (DispatcherConfig: one needs the other)
            return None, None
        directory = journal.directory_of(work_dir)
        started = time.monotonic()
        replay = journal.read(directory)
        state = DispatcherState.replay(replay.updates)
        log.info("recovered %d journal updates in %.3f s", len(replay.updates), time.monotonic() - started)
        return state, journal.JournalWriter.after(directory, replay)

    def start(self) -> None:
        """Starts serving: health at once, the dispatcher's service once its state is recovered.
        Calling it again does nothing."""
        if self._started:
            return
        self._started = True
        self._server.start()
        port = self._config.monitoring_port
        if self._registry is not None and port is not None:
            # Up before the replay, so that /healthz answers (and a liveness probe passes) meanwhile.
            self._monitoring = MonitoringServer(
                port,
                self._registry,
                status=self._status_or_empty,
                role="dispatcher",
                health=self._health,
                **self._security.monitoring(),
            )
            log.info("dispatcher monitoring (status page, /metrics) on port %d", self._monitoring.port)
        state, self._journal = self._recover()
        if self._journal is not None and self._registry is not None:
            self._journal.observer = metrics.JournalMetrics(self._registry)
        self._core = DispatcherCore(
            self._config,
            self._address,
            journal=self._journal,
            state=state,
            datasets=DatasetStore(self._config.work_dir, self._config.graph_memory_bytes),
            notifier=self._notifier,
        )
        self._servicer.attach(self._core)
        self._gc_thread.start()
        # Serving does not wait for TensorFlow (seconds to import): the first registration might.
        threading.Thread(target=self._load_tensorflow, name="dispatcher-load-tensorflow", daemon=True).start()
        self._health.set_ready(True)
        log.info("dispatcher serving on port %d", self._port)

    def join(self) -> None:
        """Blocks until the server stops."""
        self._stopped.wait()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stops serving; in-flight RPCs get `grace_s` seconds to finish."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._health.shutdown()
        self._notifier.stop()
        if self._monitoring is not None:
            self._monitoring.stop()
        self._server.stop(grace_s).wait()
        if self._gc_thread.is_alive():
            self._gc_thread.join(timeout=5)
        if self._journal is not None:
            self._journal.close()
        self._stopped.set()

    def _load_tensorflow(self) -> None:
        core = self._core
        if core is None:
            return
        try:
            core.load_tensorflow()
        except Exception:  # the first request that needs TensorFlow reports it too
            log.exception("importing TensorFlow failed")

    def _gc_loop(self) -> None:
        """Releases silent clients and workers and ends named iterations nobody reads."""
        core = self._core
        if core is None:  # (started after the core is made)
            return
        while not self._stopping.wait(core.gc_interval_s()):
            try:
                core.collect_garbage()
            except Exception:  # keep collecting on the next round
                log.exception("garbage collection failed")

    def _status_or_empty(self) -> dict[str, Any]:
        """The status document; while the journal is replayed, one that says so."""
        core = self._core
        if core is None:
            return {
                "format": status_report.STATUS_FORMAT,
                "recovering": True,
                "dispatcher": {
                    "address": self._address,
                    "fault_tolerant_mode": self._config.fault_tolerant_mode,
                    "work_dir": self._config.work_dir,
                    "uptime_s": 0.0,
                    "journal_appends": 0,
                },
                "summary": {},
                "workers": [],
                "datasets": [],
                "jobs": [],
                "clients": [],
                "throughput": {"bucket_s": 0, "points": []},
            }
        return core.status()

    def state_summary(self) -> dict[str, int]:
        """Counts of datasets, workers (alive or not), jobs, iterations, tasks (active or not) and
        iteration clients, as the dispatcher's state holds them now."""
        if self._core is None:
            raise RuntimeError("the dispatcher has not started: call start()")
        return self._core.summary()

    def status(self) -> dict[str, Any]:
        """The status document that /status.json serves (README, section Operations)."""
        return self._status_or_empty()

    @property
    def monitoring_port(self) -> int | None:
        """The bound port of /metrics and the status page; None without monitoring_port."""
        return self._monitoring.port if self._monitoring is not None else None

    @property
    def target(self) -> str:
        return f"{self._config.protocol}://localhost:{self._port}"

    @property
    def _address(self) -> str:
        return f"localhost:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def __enter__(self) -> DispatchServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
