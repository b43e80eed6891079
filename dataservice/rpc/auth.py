"""A shared token that every dispatcher and worker RPC, and every TCP data stream, must carry.

Servers read it from `auth_token_file` (a config field; the file holds the token,
surrounding whitespace ignored). Clients read it from the environment:
DATASERVICE_AUTH_TOKEN, or the file DATASERVICE_AUTH_TOKEN_FILE names. A worker
uses its own token to reach the dispatcher, and the dispatcher its own to push
tasks to workers: a cluster shares one token. gRPC calls carry it as
`authorization: Bearer TOKEN` metadata; a TCP data stream in its first request.
A missing or wrong token is UNAUTHENTICATED (clients raise
tf.errors.UnauthenticatedError naming the server). Tokens are compared in
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


class ServerAuthInterceptor(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call without the server's token (health checks excepted)."""

    def __init__(self, token: str, server: Callable[[], str]):
        self._token = token
        self._server = server

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        provided = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == METADATA_KEY and isinstance(value, str) and value.startswith(_SCHEME):
                provided = value[len(_SCHEME) :]
        message = failure(provided, self._token, self._server())
        if message is None:
            return handler

        return _refusal(handler.response_streaming, message)


def _refusal(response_streaming: bool, message: str) -> grpc.RpcMethodHandler:
    """A handler that answers UNAUTHENTICATED without reading the request: it takes the request
    as a stream (of undecoded bytes) that it never iterates, so gRPC receives no more of it than
    its flow-control window, whatever its size (a unary handler would receive and decode the
    whole message first, up to the server's largest, before the refusal)."""

    def refuse(requests, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    def refuse_stream(requests, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
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
