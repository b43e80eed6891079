"""Tokens that every dispatcher and worker RPC, and every TCP data stream, must carry.

Servers read the client token from `auth_token_file` (a config field; the file
holds the token, surrounding whitespace ignored). Clients read it from the
environment: DATASERVICE_AUTH_TOKEN, or the file DATASERVICE_AUTH_TOKEN_FILE
names. With `worker_token_file` as well, the servers' own calls of each other
(a worker's heartbeats, split and dataset requests, snapshot commits; the
dispatcher's task pushes: SERVER_METHODS) take that second token and no
other, and a client's token cannot make them: a client cannot register a
worker, declare a real one's tasks lost or read its graphs. Without it the
servers use the one token for everything, as a cluster sharing one secret
must. gRPC calls carry it as
`authorization: Bearer TOKEN` metadata; a TCP data stream in its first request.
A missing or wrong token is UNAUTHENTICATED (clients raise
UnauthenticatedError naming the server). Tokens are compared in
constant time and never logged. gRPC health checks need no token, so that
Kubernetes probes work.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

import grpc

from dataservice.rpc import secret_files

TOKEN_ENV = "DATASERVICE_AUTH_TOKEN"
TOKEN_FILE_ENV = "DATASERVICE_AUTH_TOKEN_FILE"
METADATA_KEY = "authorization"
_SCHEME = "Bearer "
# Methods anyone may call: Kubernetes' gRPC probes send no metadata.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def read_token_file(path: str) -> str:
    """The token in `path`; ValueError naming the problem if it cannot be read or is empty."""
    try:
        token = secret_files.read(path).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the auth token file {path}: {e}") from None
    if not token:
        raise ValueError(f"the auth token file {path} is empty")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"the auth token in {path} must be one word of printable characters")
    return token


def client_token() -> str | None:
    """This process's token as a client: DATASERVICE_AUTH_TOKEN, else the file that
    DATASERVICE_AUTH_TOKEN_FILE names, else None."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    path = os.environ.get(TOKEN_FILE_ENV)
    return read_token_file(path) if path else None


def matches(provided: str | None, expected: str) -> bool:
    """Whether `provided` is the token, in time that does not depend on where they differ."""
    return hmac.compare_digest((provided or "").encode(), expected.encode())


def _missing_or_wrong(provided: str | None, server: str) -> str:
    if not provided:
        return (
            f"{server} requires an auth token and none was sent: set {TOKEN_ENV} or {TOKEN_FILE_ENV} "
            "in the client's environment"
        )
    return f"the auth token sent to {server} is wrong: check {TOKEN_ENV} or {TOKEN_FILE_ENV}"


def failure(provided: str | None, expected: str | None, server: str) -> str | None:
    """None if `provided` is acceptable (or no token is required), else the message to answer with."""
    if expected is None or matches(provided, expected):
        return None
    return _missing_or_wrong(provided, server)


# The methods only the cluster's own servers call: a worker calls these of its dispatcher, the
# dispatcher these of its workers. With a worker token they take it, and only it.
SERVER_METHODS = frozenset(
    {
        "/dataservice.v1.DispatcherService/WorkerHeartbeat",
        "/dataservice.v1.DispatcherService/WorkerUpdate",
        "/dataservice.v1.DispatcherService/GetDatasetDef",
        "/dataservice.v1.DispatcherService/GetSplits",
        "/dataservice.v1.DispatcherService/CommitSnapshotChunk",
        "/dataservice.v1.WorkerService/ProcessTask",
        "/dataservice.v1.WorkerService/PrepareDataset",
    }
)


def _role_failure(provided: str | None, client_token: str | None, worker_token: str, server_method: bool) -> str:
    """Why a call that presents one role's token to the other role's method is refused, or ""."""
    if server_method and client_token is not None and matches(provided, client_token):
        return (
            "this method is for the cluster's own servers, and a client's token cannot call it "
            "(workers authenticate with the worker token, worker_token_file)"
        )
    if not server_method and matches(provided, worker_token):
        return "the worker token is for the cluster's own servers: a client needs the client token"
    return ""


class ServerAuthInterceptor(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call without the token its method needs (health checks
    excepted). With a `worker_token`, the methods servers call of each other (SERVER_METHODS) take
    that token and no other, and the rest take the client `token` (None: they are open), so that a
    client cannot pose as a worker nor a worker's credential act as a client: presenting the
    other role's token is PERMISSION_DENIED."""

    def __init__(self, token: str | None, server: Callable[[], str], worker_token: str | None = None):
        self._token = token
        self._worker_token = worker_token
        self._server = server

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        provided = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == METADATA_KEY and isinstance(value, str) and value.startswith(_SCHEME):
                provided = value[len(_SCHEME) :]
        server_method = method in SERVER_METHODS
        expected = self._worker_token if server_method and self._worker_token is not None else self._token
        message = failure(provided, expected, self._server())
        if message is None:
            return handler
        if self._worker_token is not None:
            misuse = _role_failure(provided, self._token, self._worker_token, server_method)
            if misuse:
                return _refusal(
                    handler.response_streaming, f"{self._server()}: {misuse}", grpc.StatusCode.PERMISSION_DENIED
                )
        return _refusal(handler.response_streaming, message)


def _refusal(
    response_streaming: bool, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED
) -> grpc.RpcMethodHandler:
    """A handler that answers UNAUTHENTICATED without reading the request: it takes the request
    as a stream (of undecoded bytes) that it never iterates, so gRPC receives no more of it than
    its flow-control window, whatever its size (a unary handler would receive and decode the
    whole message first, up to the server's largest, before the refusal)."""

    def refuse(requests, context):
        context.abort(code, message)

    def refuse_stream(requests, context):
        context.abort(code, message)
        yield  # pragma: no cover - abort raises

    if response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)


class ClientAuthInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token to the metadata of every call on a channel."""

    def __init__(self, token: str):
        self._metadata = (METADATA_KEY, _SCHEME + token)

    def _with_token(self, details):
        metadata = list(details.metadata or ())
        metadata.append(self._metadata)
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
