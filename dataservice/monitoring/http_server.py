"""The monitoring port: an HTTP server for Prometheus (/metrics) and, on the dispatcher, the
status page (/) and its data (/status.json).

It serves from its own threads, so a scrape never waits on the gRPC thread pools, and it
only reads: nothing a request to it says changes a server. What it shows (job names, client
ids, the work_dir) is for operators: with a token (monitoring_token_file) every page but
/healthz and /readyz needs it, as `Authorization: Bearer TOKEN` (Prometheus'
`authorization.credentials_file`) or as the password of HTTP Basic authentication (which a
browser asks for, so the status page works too); with TLS (monitoring_tls) it serves HTTPS
only. The probes stay open, as kubelet sends no credentials, and say "ok" or "not serving"
and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import http.server
import json
import logging
import ssl
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dataservice.monitoring.health import HealthReporter
from dataservice.rpc import auth

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]


# Kubernetes' probes: open whatever the token, and they say nothing but ok / not serving.
_OPEN_PATHS = ("/healthz", "/readyz")
# How long a connection may take to finish its TLS handshake and send its request.
_REQUEST_TIMEOUT_S = 10.0


def _authorized(header: str | None, token: str | None) -> bool:
    """Whether the Authorization header carries `token` (always, without a token): as a Bearer
    token, or as the password of Basic authentication (any user name)."""
    if token is None:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    provided = ""
    if scheme.lower() == "bearer":
        provided = value.strip()
    elif scheme.lower() == "basic":
        try:
            provided = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    return auth.matches(provided, token)


class _Server(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer, over TLS with an ssl_context: the handshake happens on the request's
    own thread (not in accept, where one silent client would stall every other), within
    _REQUEST_TIMEOUT_S."""

    daemon_threads = True

    def __init__(self, address, handler, ssl_context: ssl.SSLContext | None):
        self._ssl_context = ssl_context
        super().__init__(address, handler)

    def finish_request(self, request, client_address) -> None:
        request.settimeout(_REQUEST_TIMEOUT_S)
        if self._ssl_context is None:
            super().finish_request(request, client_address)
            return
        try:
            secured = self._ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.debug("monitoring: TLS handshake with %s failed: %s", client_address, e)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


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
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        page = status_page_html() if status is not None else None

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "dataservice"

            def do_GET(self) -> None:  # the name http.server calls
                path = self.path.split("?", 1)[0]
                if path not in _OPEN_PATHS and not _authorized(self.headers.get("Authorization"), token):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="dataservice monitoring", charset="UTF-8"')
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    body = b"this page needs the monitoring token (Authorization: Bearer TOKEN)\n"
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
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

        self._httpd = _Server(("0.0.0.0", port), Handler, ssl_context)
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="monitoring-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
