"""DispatchServer: the dispatcher as a gRPC server (as tf.data.experimental.service.DispatchServer)."""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from typing import Dict, Optional, Tuple

from dataservice.config import DispatcherConfig
from dataservice.dispatcher import journal
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.grpc_servicer import DispatcherServicer
from dataservice.dispatcher.journal import JournalWriter
from dataservice.dispatcher.state import DispatcherState
from dataservice.dispatcher.worker_push import GrpcWorkerNotifier
from dataservice.rpc import servers
from dataservice.v1 import dispatcher_pb2_grpc

log = logging.getLogger(__name__)


class DispatchServer:
    """The dispatcher of a dataservice cluster.

    >>> dispatcher = DispatchServer()            # binds a free port and starts
    >>> dispatcher.target                        # 'grpc://localhost:PORT'
    """

    def __init__(self, config: Optional[DispatcherConfig] = None, start: bool = True):
        self._config = config or DispatcherConfig()
        if not isinstance(self._config, DispatcherConfig):
            raise TypeError(f"config must be a DispatcherConfig, got {type(self._config).__name__}")
        state, self._journal = self._recover()
        self._server = servers.new_server(max_workers=32)
        self._port = servers.bind(self._server, self._config.port)
        self._notifier = GrpcWorkerNotifier()
        self._core = DispatcherCore(
            self._config,
            self._address,
            journal=self._journal,
            state=state,
            datasets=DatasetStore(self._config.work_dir),
            notifier=self._notifier,
        )
        dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server(DispatcherServicer(self._core), self._server)
        self._started = False
        self._stopped = threading.Event()
        self._stopping = threading.Event()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="dispatcher-gc", daemon=True)
        if start:
            self.start()

    def _recover(self) -> Tuple[Optional[DispatcherState], Optional[JournalWriter]]:
        """In fault_tolerant_mode: replays the journal (before the port is bound, so that
        clients meanwhile see UNAVAILABLE and retry) and opens a new segment."""
        if not self._config.fault_tolerant_mode:
            return None, None
        directory = pathlib.Path(self._config.work_dir) / "journal"
        started = time.monotonic()
        replay = journal.read(directory)
        state = DispatcherState.replay(replay.updates)
        log.info("recovered %d journal updates in %.3f s", len(replay.updates), time.monotonic() - started)
        return state, journal.JournalWriter.after(directory, replay)

    def start(self) -> None:
        """Starts serving. Calling it again does nothing."""
        if not self._started:
            self._server.start()
            self._gc_thread.start()
            self._started = True
            log.info("dispatcher serving on port %d", self._port)

    def join(self) -> None:
        """Blocks until the server stops."""
        self._stopped.wait()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stops serving; in-flight RPCs get `grace_s` seconds to finish."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._notifier.stop()
        self._server.stop(grace_s).wait()
        if self._gc_thread.is_alive():
            self._gc_thread.join(timeout=5)
        if self._journal is not None:
            self._journal.close()
        self._stopped.set()

    def _gc_loop(self) -> None:
        """Releases silent clients and workers and ends named iterations nobody reads."""
        while not self._stopping.wait(self._core.gc_interval_s()):
            try:
                self._core.collect_garbage()
            except Exception:  # noqa: BLE001 - keep collecting on the next round
                log.exception("garbage collection failed")

    def state_summary(self) -> Dict[str, int]:
        """Counts of datasets, workers (alive or not), jobs, iterations, tasks (active or not) and
        iteration clients, as the dispatcher's state holds them now."""
        return self._core.summary()

    @property
    def target(self) -> str:
        return f"grpc://localhost:{self._port}"

    @property
    def _address(self) -> str:
        return f"localhost:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def __enter__(self) -> "DispatchServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
