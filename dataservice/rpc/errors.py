"""Errors across the RPC boundary.

- handler(): the decorator of unary servicer methods that turns a
  status.ServiceError (or any unexpected exception) into a gRPC status
  instead of a dead server thread; grpc_code() maps a status.Code;
- from_rpc_error(): a failed gRPC call as a status.ServiceError, the data
  path's one error type whatever the transport;
- client_error(): either, prefixed by what was attempted, as the class of its
  code that clients raise (status.py; the TensorFlow client re-types it as
  tf.errors where it hands it to its caller: tf_errors.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import grpc

from dataservice import status

log = logging.getLogger(__name__)


def from_rpc_error(error: grpc.RpcError) -> status.ServiceError:
    """What a gRPC call failed with, in the data path's transport-free terms."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return status.error(status.code_of_number(code.value[0]), details or "")


def status_code(value: int | None) -> grpc.StatusCode:
    """The gRPC status code numbered `value` (TensorFlow's error codes are the same numbers), else UNKNOWN."""
    for candidate in grpc.StatusCode:
        if candidate.value[0] == value:
            return candidate
    return grpc.StatusCode.UNKNOWN


def grpc_code(code: status.Code) -> grpc.StatusCode:
    """The gRPC code of a status code (the same number)."""
    return status_code(int(code))


# status.RETRYABLE as gRPC's codes (for calls made with gRPC's own errors).
RETRYABLE_CODES = frozenset(grpc_code(code) for code in status.RETRYABLE)


def handler(method: Callable) -> Callable:
    """Wraps a unary servicer method: a status.ServiceError becomes its status, any other
    exception INTERNAL, so that nothing a client sends can kill the server."""

    @functools.wraps(method)
    def wrapped(self, request, context: grpc.ServicerContext):
        try:
            return method(self, request, context)
        except status.ServiceError as e:
            context.abort(grpc_code(e.code), e.message)
        except Exception as e:  # the server must survive any request
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(e).__name__}: {e}")

    return wrapped


def client_error(error: grpc.RpcError | status.ServiceError, what: str) -> status.ServiceError:
    """The error of `error`'s status code, its message prefixed by what was attempted."""
    if not isinstance(error, status.ServiceError):
        error = from_rpc_error(error)
    return status.error(error.code, f"{what}: {error.message}")
