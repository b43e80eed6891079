"""A dispatcher and workers on this machine, for the demo, the examples, tests and benchmarks.

By default each server is a `data-server` process (as in production: no
shared GIL or TensorFlow resources with the client), bound to a free
loopback port that it reports on its first line of output. With
`processes=False` the servers run in this process, which starts faster and
lets a test look at them; a pipeline with `shuffle` or `cache` then shares
those resources with the client (see DESIGN-NOTES), so tests of distribution
use processes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

from dataservice.cli import OWNED_DIR_ENV, PARENT_PIPE_ENV

_PORT_LINE = re.compile(r"listening on port (\d+)(?:, monitoring on port (\d+))?")


class ServerProcess:
    """One `data-server` process. Its stderr is kept (the last lines) for error reports.
    `launcher` prefixes the command (["ip", "netns", "exec", "ns1"] runs it on a test host).
    `owned_dir`: a directory made for the server, which it removes if this process dies first."""

    def __init__(
        self,
        *args: str,
        start_timeout_s: float = 120.0,
        env: dict | None = None,
        launcher: Sequence[str] = (),
        owned_dir: str | None = None,
    ):
        env = dict(os.environ if env is None else env)
        if owned_dir is not None:
            env[OWNED_DIR_ENV] = owned_dir
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        # The server stops when this process dies, however it dies: it watches a pipe whose write
        # end only this process holds (cli.PARENT_PIPE_ENV).
        watched, self._parent_pipe = os.pipe()
        env[PARENT_PIPE_ENV] = str(watched)
        self.args = args
        try:
            self.proc = subprocess.Popen(
                [*launcher, sys.executable, "-m", "dataservice.cli", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                pass_fds=(watched,),
            )
        except BaseException:
            os.close(self._parent_pipe)
            raise
        finally:
            os.close(watched)
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines), daemon=True).start()
        self.monitoring_port: int | None = None
        self.port = self._read_port(start_timeout_s)

    @staticmethod
    def _drain(stream, sink: list[str], keep: int = 200) -> None:
        for line in stream:
            sink.append(line)
            del sink[:-keep]

    def _read_port(self, timeout_s: float) -> int:
        found: list[int] = []

        def read() -> None:
            for line in self.proc.stdout:
                match = _PORT_LINE.search(line)
                if match:
                    if match.group(2):
                        self.monitoring_port = int(match.group(2))
                    found.append(int(match.group(1)))
                    break
            self._drain(self.proc.stdout, [])

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not found:
            self.kill()
            raise RuntimeError(f"data-server {' '.join(self.args)} did not start:\n" + "".join(self.stderr_lines[-30:]))
        return found[0]

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then the exit status (killing it if it does not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close_parent_pipe()
        return code

    def kill(self) -> None:
        """SIGKILL, as a machine failure would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._close_parent_pipe()

    def _close_parent_pipe(self) -> None:
        if self._parent_pipe is not None:
            os.close(self._parent_pipe)
            self._parent_pipe = None


Server = Union["ServerProcess", Any]  # a ServerProcess, a DispatchServer or a WorkerServer


def config_flags(options: Mapping[str, Any]) -> list[str]:
    """`data-server` flags for config fields: `--name=value`, lists comma-joined, booleans as --[no-]name."""
    flags = []
    for name, value in options.items():
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            flags.append(f"--{name}={','.join(map(str, value))}")
        else:
            flags.append(f"--{name}={value}")
    return flags


class LocalCluster:
    """A dispatcher and `num_workers` workers: `data-server` processes, or servers in this process.

    `dispatcher_options` and `worker_options` are DispatcherConfig and
    WorkerConfig fields (passed to processes as flags).

    >>> with LocalCluster(num_workers=2) as cluster:
    ...     ds = ds.apply(dataservice.distribute("parallel_epochs", cluster.target))
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        processes: bool = True,
        work_dir: str | None = None,
        fault_tolerant_mode: bool = False,
        dispatcher_options: Mapping[str, Any] | None = None,
        worker_options: Mapping[str, Any] | None = None,
    ):
        self.processes = processes
        # Processes always get a work_dir (datasets are kept there, as in production); in-process
        # dispatchers only when asked for one.
        wants_dir = processes or fault_tolerant_mode or work_dir is not None
        self._tmp = tempfile.TemporaryDirectory(prefix="dataservice-") if wants_dir and not work_dir else None
        self.work_dir = work_dir or (self._tmp.name if self._tmp else None)
        self._dispatcher_options = dict(dispatcher_options or {})
        if self.work_dir:
            self._dispatcher_options["work_dir"] = self.work_dir
        if fault_tolerant_mode:
            self._dispatcher_options["fault_tolerant_mode"] = True
        self._worker_options = dict(worker_options or {})
        self.workers: list[Server] = []
        self.dispatcher: Server = self._start_dispatcher(port=0)
        try:
            self.add_workers(num_workers)
        except Exception:
            self.stop()
            raise

    def _start_dispatcher(self, port: int) -> Server:
        if self.processes:
            return ServerProcess(
                "--role=dispatcher",
                f"--port={port}",
                *config_flags(self._dispatcher_options),
                owned_dir=self._tmp.name if self._tmp is not None else None,
            )
        import dataservice

        return dataservice.DispatchServer(dataservice.DispatcherConfig(port=port, **self._dispatcher_options))

    @property
    def address(self) -> str:
        """host:port of the dispatcher."""
        return f"localhost:{self.dispatcher.port}"

    @property
    def target(self) -> str:
        """The dispatcher as distribute()'s `service` argument ("grpc+tls://" for a TLS cluster)."""
        return f"{self._dispatcher_options.get('protocol', 'grpc')}://{self.address}"

    @property
    def status_page_url(self) -> str | None:
        """The dispatcher's status page, if it serves a monitoring port (processes do by default)."""
        port = self.dispatcher.monitoring_port
        return f"http://localhost:{port}/" if port is not None else None

    def add_worker(self, **options: Any) -> Server:
        """Starts one more worker; `options` are WorkerConfig fields for it alone."""
        options = {**self._worker_options, **options}
        if self.processes:
            worker = ServerProcess(
                "--role=worker", "--port=0", f"--dispatcher_address={self.address}", *config_flags(options)
            )
        else:
            import dataservice

            worker = dataservice.WorkerServer(dataservice.WorkerConfig(dispatcher_address=self.address, **options))
        self.workers.append(worker)
        return worker

    def add_workers(self, count: int, **options: Any) -> list[Server]:
        """Starts `count` more workers at once (processes start side by side: most of a start is
        importing TensorFlow); `options` as for add_worker."""
        if count <= 1 or not self.processes:
            return [self.add_worker(**options) for _ in range(count)]
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            started = [pool.submit(self.add_worker, **options) for _ in range(count)]
        return [future.result() for future in started]

    def restart_dispatcher(self) -> None:
        """Restarts the dispatcher on the same port: a process is SIGKILLed, as a machine failure
        would kill it; an in-process dispatcher is stopped."""
        port = self.dispatcher.port
        if self.processes:
            self.dispatcher.kill()
        else:
            self.dispatcher.stop()
        self.dispatcher = self._start_dispatcher(port)

    def stop(self) -> None:
        """Stops every server, workers first (processes get SIGTERM and are killed if they do not exit)."""
        for server in [*self.workers, self.dispatcher]:
            try:
                if self.processes:
                    server.terminate()
                else:
                    server.stop()
            except subprocess.TimeoutExpired:
                pass
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def service_or_local_cluster(service: str | None, num_workers: int, processes: bool = False) -> Iterator[str]:
    """Yields `service` if given, else the target of a LocalCluster started for the block
    (in this process by default, as the tf.data service documentation's examples do)."""
    if service:
        yield service
        return
    with LocalCluster(num_workers, processes=processes) as cluster:
        yield cluster.target
