"""gRPC health checking (grpc.health.v1) and server reflection for the dispatcher and workers.

Two names are answered: "" (and the server's own service name) is SERVING only once the
server can do its work (a dispatcher has replayed its journal, a worker has registered with
its dispatcher): a readiness probe. LIVENESS_SERVICE is SERVING from the start until the
server stops: a liveness probe that does not restart a dispatcher while it replays a long
journal. Reflection lets grpcurl and similar tools list and call the services.

Kubernetes' gRPC probes speak neither TLS nor tokens, so the same two states are also
served over HTTP on the monitoring port (/healthz, /readyz; monitoring/http_server.py),
which TLS clusters probe instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

LIVENESS_SERVICE = "liveness"
# Watch needs no token (probes send none) and each stream lives until its caller ends it, so
# their number is bounded: beyond it a Watch is RESOURCE_EXHAUSTED (Check, which probes use,
# is not limited). gRPC's maximum_concurrent_rpcs counts them too (rpc/servers.py), and stays
# well above this, so watchers cannot use up the calls of clients with the token.
MAX_WATCHERS = 64


class _BoundedHealthServicer(health.HealthServicer):
    """grpc_health's servicer with at most MAX_WATCHERS Watch streams at once, which also forgets
    a service name when its last watcher leaves (the stock one keeps every name ever watched: a
    caller without the token could grow it name by name)."""

    def __init__(self) -> None:
        super().__init__()
        self._watchers = 0
        # As the stock servicer marks its Watch: served without holding a server thread.
        type(self).Watch.experimental_non_blocking = True
        type(self).Watch.experimental_thread_pool = None

    def Watch(self, request, context, send_response_callback=None):  # gRPC's name
        with self._lock:
            if self._watchers >= MAX_WATCHERS:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this server serves {MAX_WATCHERS} health Watch streams already (use Check, or retry later)",
                )
            self._watchers += 1
        try:
            result = super().Watch(request, context, send_response_callback)
        except BaseException:
            with self._lock:
                self._watchers -= 1
            raise
        context.add_callback(lambda: self._watcher_left(request.service))
        return result

    def _watcher_left(self, service: str) -> None:
        with self._lock:
            self._watchers -= 1
            if not self._send_response_callbacks.get(service):
                self._send_response_callbacks.pop(service, None)


class HealthReporter:
    """The health states of one gRPC server."""

    def __init__(self, server: grpc.Server, service_names: Sequence[str]):
        self._servicer = _BoundedHealthServicer()
        self._ready_names = ["", *service_names]
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        self._servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._ready = False
        self._alive = True
        self.set_ready(False)

    @property
    def ready(self) -> bool:
        return self._ready and self._alive

    @property
    def alive(self) -> bool:
        return self._alive

    def set_ready(self, ready: bool) -> None:
        self._ready = ready
        state = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self._ready_names:
            self._servicer.set(name, state)

    def shutdown(self) -> None:
        """Every name NOT_SERVING from now on (watchers are told), before the server stops."""
        self._alive = False
        self._servicer.enter_graceful_shutdown()
