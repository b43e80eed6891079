"""Requests that are not the message their method takes answer INVALID_ARGUMENT, naming it.

gRPC answers an undecodable request with INTERNAL ("Exception deserializing request!"),
which reads as the server's fault. This interceptor decodes requests itself, without
raising, and lets the method's handler run only on what decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from dataservice.rpc import handlers


class _Undecodable:
    def __init__(self, error: Exception):
        self.error = error


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # noqa: BLE001 - any decoding failure is the client's request
            return _Undecodable(e)

    return decode


class RequestValidationInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        message = f"the request to {method} is not a valid message of the type it takes"

        def check(request, context) -> None:
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{message} ({request.error})")

        def checked_requests(requests: Iterator, context) -> Iterator:
            for request in requests:
                check(request, context)
                yield request

        def checked(behavior: Callable, client_streaming: bool, server_streaming: bool) -> Callable:
            if client_streaming:
                return lambda requests, context: behavior(checked_requests(requests, context), context)
            if server_streaming:

                def unary_stream(request, context):
                    check(request, context)
                    yield from behavior(request, context)

                return unary_stream

            def unary_unary(request, context):
                check(request, context)
                return behavior(request, context)

            return unary_unary

        return handlers.rewrap(handler, checked, request_deserializer=_safe(handler.request_deserializer))
