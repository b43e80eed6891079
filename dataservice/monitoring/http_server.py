"""The monitoring port: an HTTP server for Prometheus (/metrics) and, on the dispatcher, the
status page (/) and its data (/status.json).

It serves from its own threads, so a scrape never waits on the gRPC thread pools, and it
only reads: nothing a request to it says changes a server.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dataservice.monitoring.health import HealthReporter

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]


def status_page_html() -> bytes:
    return resources.files("dataservice.monitoring").joinpath("status_page.html").read_bytes()


class MonitoringServer:
    """Serves GET /metrics (`registry`), GET /healthz and /readyz (`health`: 200 when alive,
    ready; 503 otherwise) and, given `status`, GET / (the status page) and GET /status.json,
    on `port` of every interface (0 picks a free port)."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        status: StatusFn | None = None,
        role: str = "",
        health: HealthReporter | None = None,
    ):
        page = status_page_html() if status is not None else None

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "dataservice"

            def do_GET(self) -> None:  # the name http.server calls
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                    elif path in ("/healthz", "/readyz") and health is not None:
                        ok = health.alive if path == "/healthz" else health.ready
                        body = b"ok\n" if ok else b"not serving\n"
                        self._send(200 if ok else 503, "text/plain; charset=utf-8", body)
                    elif path == "/status.json" and status is not None:
                        self._send(200, "application/json", json.dumps(status()).encode())
                    elif path in ("/", "/index.html") and page is not None:
                        self._send(200, "text/html; charset=utf-8", page)
                    elif path == "/":
                        self._send(200, "text/plain; charset=utf-8", f"dataservice {role}: see /metrics\n".encode())
                    else:
                        self._send(404, "text/plain; charset=utf-8", f"no page {path}\n".encode())
                except Exception as e:  # a failed page must not stop the server
                    log.exception("monitoring request %s failed", path)
                    self._send(500, "text/plain; charset=utf-8", f"{type(e).__name__}: {e}\n".encode())

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # http.server's name
                log.debug("monitoring: " + format, *args)

        self._httpd = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="monitoring-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
