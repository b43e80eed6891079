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


class HealthReporter:
    """The health states of one gRPC server."""

    def __init__(self, server: grpc.Server, service_names: Sequence[str]):
        self._servicer = health.HealthServicer()
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
