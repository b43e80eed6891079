"""Rewrapping a gRPC method handler, for the server interceptors (metrics, authentication,
request validation): the one place that knows gRPC's four handler kinds."""

from __future__ import annotations

from collections.abc import Callable

import grpc

# behavior, client_streaming, server_streaming -> the new behavior
Wrap = Callable[[Callable, bool, bool], Callable]

_KINDS = (
    ("unary_unary", False, False, grpc.unary_unary_rpc_method_handler),
    ("unary_stream", False, True, grpc.unary_stream_rpc_method_handler),
    ("stream_unary", True, False, grpc.stream_unary_rpc_method_handler),
    ("stream_stream", True, True, grpc.stream_stream_rpc_method_handler),
)


def rewrap(
    handler: grpc.RpcMethodHandler, wrap: Wrap, request_deserializer: Callable | None = None
) -> grpc.RpcMethodHandler:
    """A handler of the same kind and serializers as `handler` (its request deserializer
    replaced by `request_deserializer`, if given) whose behavior is `wrap(behavior,
    client_streaming, server_streaming)`; `handler` itself for a non-blocking behavior."""
    deserializer = request_deserializer or handler.request_deserializer
    for kind, client_streaming, server_streaming, make in _KINDS:
        behavior = getattr(handler, kind)
        if behavior is not None and getattr(behavior, "experimental_non_blocking", False):
            # gRPC calls such a behavior with a callback to send responses through and returns
            # its thread at once (the health service's Watch). Any wrapper would turn it back
            # into a generator that holds a server thread for the whole call, so that enough
            # open calls, which need no token, stall every other RPC: it is left as it is.
            return handler
        if behavior is not None:
            return make(wrap(behavior, client_streaming, server_streaming), deserializer, handler.response_serializer)
    raise ValueError(f"a handler of no known kind: {handler!r}")
