"""Starting and stopping a gRPC server the same way for the dispatcher and the workers."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from dataservice.rpc import auth, peers, tls
from dataservice.rpc.channels import MAX_MESSAGE_BYTES
from dataservice.rpc.request_validation import RequestValidationInterceptor

log = logging.getLogger(__name__)

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.so_reuseport", 0),
]
# What a worker accepts in one message: its requests are small (a task, credits, a round).
WORKER_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
# The dispatcher's largest request is a dataset graph; the rest of the message is small.
REQUEST_OVERHEAD_BYTES = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ServerSecurity:
    """What a server's config says of TLS and the auth token, in the forms its parts need."""

    tls: tls.ServerTls | None = None
    auth_token: str | None = None
    worker_token: str | None = None
    # The monitoring port's (monitoring_token_file, monitoring_tls).
    monitoring_token: str | None = None
    monitoring_tls: bool = False

    @classmethod
    def of(cls, config: Any) -> ServerSecurity:
        """From a DispatcherConfig or WorkerConfig (their protocol, tls_* and auth_token_file)."""
        server_tls = None
        if config.protocol == tls.TLS:
            server_tls = tls.ServerTls(config.tls_cert_file, config.tls_key_file, config.tls_ca_file)
        token = auth.read_token_file(config.auth_token_file) if config.auth_token_file else None
        worker_token = auth.read_token_file(config.worker_token_file) if config.worker_token_file else None
        monitoring_token = auth.read_token_file(config.monitoring_token_file) if config.monitoring_token_file else None
        return cls(server_tls, token, worker_token, monitoring_token, config.monitoring_tls)

    @property
    def server_token(self) -> str | None:
        """The token this server presents when it calls another server of the cluster."""
        return self.worker_token if self.worker_token is not None else self.auth_token

    def interceptors(self, server: Callable[[], str]) -> list[grpc.ServerInterceptor]:
        """The authentication interceptor, if a token is required; `server` names the server."""
        if self.auth_token is None and self.worker_token is None:
            return []
        return [auth.ServerAuthInterceptor(self.auth_token, server, worker_token=self.worker_token)]

    def credentials(self) -> grpc.ServerCredentials | None:
        """For bind(): None serves plaintext."""
        return self.tls.server_credentials() if self.tls is not None else None

    def ssl_context(self) -> ssl.SSLContext | None:
        """For the TCP data transfer: None serves plaintext."""
        return self.tls.server_context() if self.tls is not None else None

    def monitoring(self) -> dict[str, Any]:
        """MonitoringServer's token and ssl_context."""
        context = self.tls.monitoring_context() if self.monitoring_tls and self.tls is not None else None
        return {"token": self.monitoring_token, "ssl_context": context}

    def as_client(self) -> tls.TlsFiles | None:
        """What the server presents and trusts when it calls another server (None: plaintext)."""
        return self.tls.as_client() if self.tls is not None else None


def bind(server: grpc.Server, port: int, credentials: grpc.ServerCredentials | None = None) -> int:
    """Binds all interfaces (IPv6 and IPv4 where the host has both), over TLS with `credentials`,
    and returns the bound port."""
    for host in ("[::]", "0.0.0.0"):
        try:
            if credentials is not None:
                bound = server.add_secure_port(f"{host}:{port}", credentials)
            else:
                bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            bound = 0
        if bound:
            return bound
    raise RuntimeError(f"could not bind port {port}: it is in use or not permitted")


# Calls a server runs or queues at once (its threads run max_workers of them).
MAX_CONCURRENT_RPCS = 1024
# The part of a server's threads one peer's streaming calls may hold (rpc/peers.py).
PEER_THREAD_SHARE = 0.5


def new_server(
    max_workers: int, max_receive_bytes: int, interceptors: Sequence[grpc.ServerInterceptor] = ()
) -> grpc.Server:
    """A server whose requests may be at most `max_receive_bytes` (larger ones are
    RESOURCE_EXHAUSTED before they reach a handler, gRPC's message naming both sizes), and
    whose streaming calls from one peer take at most PEER_THREAD_SHARE of its threads."""
    return grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[*SERVER_OPTIONS, ("grpc.max_receive_message_length", max_receive_bytes)],
        # Calls beyond it are RESOURCE_EXHAUSTED at once rather than queued without bound.
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        # Innermost: decoding happens after metrics and authentication have seen the call.
        interceptors=[
            *interceptors,
            peers.PeerShareInterceptor(max(1, int(max_workers * PEER_THREAD_SHARE))),
            RequestValidationInterceptor(),
        ],
    )
