"""gRPC plumbing shared by the servers and the client.

- addresses: "grpc://host:port" or ("grpc", "host:port") to "host:port";
- channels with message limits raised so that any element fits;
- ServiceError: how a handler answers with a status code, and the decorator
  that turns it (or any unexpected exception) into a gRPC status instead of a
  dead server thread;
- call(): a unary call retried on transient errors with exponential backoff
  until an overall deadline, failing with a TensorFlow error that names the
  server and says what happened.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from typing import Any, Callable, Optional, Tuple, Union

import grpc
import tensorflow as tf

log = logging.getLogger(__name__)

# Elements and dataset graphs can be far larger than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC's reconnect backoff grows to 120 s by default: a dispatcher back after a
    # restart of a few seconds would then time its workers out before they retried.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.so_reuseport", 0),
]

# Codes after which the same call may succeed: the server is (re)starting,
# overloaded, or the connection dropped.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})

_TF_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: tf.errors.NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: tf.errors.AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: tf.errors.FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: tf.errors.UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: tf.errors.DeadlineExceededError,
    grpc.StatusCode.CANCELLED: tf.errors.CancelledError,
    grpc.StatusCode.ABORTED: tf.errors.AbortedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: tf.errors.ResourceExhaustedError,
    grpc.StatusCode.UNIMPLEMENTED: tf.errors.UnimplementedError,
    grpc.StatusCode.PERMISSION_DENIED: tf.errors.PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: tf.errors.UnauthenticatedError,
}


def strip_protocol(address: str) -> str:
    """ "grpc://host:port" -> "host:port"; other protocols are a ValueError."""
    if "://" in address:
        protocol, _, address = address.partition("://")
        if protocol != "grpc":
            raise ValueError(f"only the 'grpc' protocol is supported, got {protocol!r}")
    if not address or ":" not in address:
        raise ValueError(f"expected an address of the form 'host:port', got {address!r}")
    return address


def parse_service(service: Union[str, Tuple[str, str]]) -> str:
    """The dispatcher address of a `service` argument: "grpc://host:port" or (protocol, address)."""
    if isinstance(service, (tuple, list)) and len(service) == 2:
        protocol, address = service
        return strip_protocol(f"{protocol}://{address}")
    if isinstance(service, str):
        return strip_protocol(service)
    raise ValueError(f"service must be 'grpc://host:port' or a (protocol, address) tuple, got {service!r}")


def make_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class ServiceError(Exception):
    """Raised by an RPC handler to answer with `code` and a message for the user."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class RemoteError(grpc.RpcError):
    """A status that reached the client outside gRPC (the TCP data transfer), with
    grpc.RpcError's code() and details() so that it is handled as gRPC's are."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def status_code(value: Optional[int]) -> grpc.StatusCode:
    """The gRPC status code numbered `value` (TensorFlow's error codes are the same numbers), else UNKNOWN."""
    for status in grpc.StatusCode:
        if status.value[0] == value:
            return status
    return grpc.StatusCode.UNKNOWN


def invalid_argument(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)


def handler(method: Callable) -> Callable:
    """Wraps a unary servicer method: ServiceError becomes its status, any other
    exception INTERNAL, so that nothing a client sends can kill the server."""

    @functools.wraps(method)
    def wrapped(self, request, context: grpc.ServicerContext):
        try:
            return method(self, request, context)
        except ServiceError as e:
            context.abort(e.code, e.message)
        except Exception as e:  # noqa: BLE001 - the server must survive any request
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(e).__name__}: {e}")

    return wrapped


def to_tf_error(error: grpc.RpcError, what: str) -> tf.errors.OpError:
    """A TensorFlow error with the status code of `error`, prefixed by what was attempted."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _TF_ERRORS.get(code, tf.errors.UnknownError)
    return cls(None, None, f"{what}: {details}")


class Backoff:
    """Exponential backoff with jitter, capped, until a deadline."""

    def __init__(self, timeout_s: float, initial_s: float = 0.05, max_s: float = 2.0):
        self.deadline = time.monotonic() + timeout_s
        self.delay = initial_s
        self.max_s = max_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def sleep(self) -> bool:
        """Sleeps before the next try; False once the deadline has passed."""
        remaining = self.remaining()
        if remaining <= 0:
            return False
        time.sleep(min(remaining, self.delay * random.uniform(0.5, 1.0)))
        self.delay = min(self.max_s, self.delay * 2)
        return True


def call(
    method: Callable[..., Any],
    request: Any,
    *,
    server: str,
    what: str,
    timeout_s: float,
    rpc_timeout_s: Optional[float] = 30.0,
) -> Any:
    """Calls `method(request)`, retrying RETRYABLE_CODES until `timeout_s` has passed.

    `server` names the peer in errors ("dispatcher at localhost:5050").
    Other errors are raised at once as the matching tf.errors class.
    """
    backoff = Backoff(timeout_s)
    while True:
        per_try = max(0.01, min(rpc_timeout_s or timeout_s, backoff.remaining()))
        try:
            return method(request, timeout=per_try)
        except grpc.RpcError as e:
            retryable = e.code() in RETRYABLE_CODES or (
                e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and backoff.remaining() > 0
            )
            if not retryable:
                raise to_tf_error(e, f"{what} ({server})") from None
            if not backoff.sleep():
                raise tf.errors.UnavailableError(
                    None,
                    None,
                    f"{what}: the {server} is unavailable; gave up after {timeout_s:.1f} s "
                    f"(last error: {e.code().name}: {e.details()})",
                ) from None
