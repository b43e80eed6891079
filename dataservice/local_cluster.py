"""A cluster of `data-server` processes on this machine: for the demo, tests and benchmarks.

Each server is its own process (as in production: no shared GIL or
TensorFlow resources with the client), bound to a free loopback port that it
reports on its first line of output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

_PORT_LINE = re.compile(r"listening on port (\d+)")


class ServerProcess:
    """One `data-server` process. Its stderr is kept (the last lines) for error reports."""

    def __init__(self, *args: str, start_timeout_s: float = 120.0, env: Optional[dict] = None):
        env = dict(os.environ if env is None else env)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dataservice.server", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.stderr_lines: List[str] = []
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines), daemon=True).start()
        self.port = self._read_port(start_timeout_s)

    @staticmethod
    def _drain(stream, sink: List[str], keep: int = 200) -> None:
        for line in stream:
            sink.append(line)
            del sink[:-keep]

    def _read_port(self, timeout_s: float) -> int:
        found: List[int] = []

        def read() -> None:
            for line in self.proc.stdout:
                match = _PORT_LINE.search(line)
                if match:
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
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL, as a machine failure would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


class LocalCluster:
    """A dispatcher and `num_workers` workers, each a `data-server` process.

    >>> with LocalCluster(num_workers=2) as cluster:
    ...     ds = ds.apply(dataservice.distribute("parallel_epochs", cluster.target))
    """

    def __init__(self, num_workers: int = 2, work_dir: Optional[str] = None, fault_tolerant_mode: bool = False,
                 extra_dispatcher_args: tuple = (), extra_worker_args: tuple = ()):
        self._tmp = None if work_dir else tempfile.TemporaryDirectory(prefix="dataservice-")
        self.work_dir = work_dir or self._tmp.name
        self._dispatcher_args = [f"--work_dir={self.work_dir}", *extra_dispatcher_args]
        if fault_tolerant_mode:
            self._dispatcher_args.append("--fault_tolerant_mode")
        self.dispatcher = ServerProcess("--role=dispatcher", "--port=0", *self._dispatcher_args)
        self._worker_args = extra_worker_args
        self.workers: List[ServerProcess] = []
        try:
            for _ in range(num_workers):
                self.add_worker()
        except Exception:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return self.dispatcher.address

    @property
    def target(self) -> str:
        return "grpc://" + self.dispatcher.address

    def add_worker(self) -> ServerProcess:
        worker = ServerProcess("--role=worker", "--port=0", f"--dispatcher_address={self.address}",
                               *self._worker_args)
        self.workers.append(worker)
        return worker

    def restart_dispatcher(self) -> None:
        """SIGKILL the dispatcher, as a machine failure would, and start it again on the same port."""
        port = self.dispatcher.port
        self.dispatcher.kill()
        self.dispatcher = ServerProcess("--role=dispatcher", f"--port={port}", *self._dispatcher_args)

    def stop(self) -> None:
        """SIGTERM to every server, workers first; kills whatever does not exit."""
        for server in [*self.workers, self.dispatcher]:
            try:
                server.terminate()
            except subprocess.TimeoutExpired:
                pass
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
