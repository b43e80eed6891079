"""Status codes and the error a service answers with, without any transport.

The dispatcher core and the worker's stream logic raise ServiceError with a
Code; each transport maps it (the gRPC servicers to grpc.StatusCode, the TCP
data transfer to the number in its header). The numbers are the canonical
ones that gRPC and TensorFlow share, so a code survives every hop unchanged.
"""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# Codes after which the same call may succeed: the server is (re)starting, overloaded, or
# the connection dropped.
RETRYABLE = frozenset({Code.UNAVAILABLE, Code.ABORTED})


def code_of_number(value: int | None) -> Code:
    """The code numbered `value` (as a transport carries it), else UNKNOWN."""
    try:
        return Code(value)
    except ValueError:
        return Code.UNKNOWN


class ServiceError(Exception):
    """Raised by a service to answer with `code` and a message the user can act on."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = Code(code)
        self.message = message


def invalid_argument(message: str) -> ServiceError:
    return ServiceError(Code.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(Code.NOT_FOUND, message)


def already_exists(message: str) -> ServiceError:
    return ServiceError(Code.ALREADY_EXISTS, message)


def failed_precondition(message: str) -> ServiceError:
    return ServiceError(Code.FAILED_PRECONDITION, message)


def permission_denied(message: str) -> ServiceError:
    return ServiceError(Code.PERMISSION_DENIED, message)


def unavailable(message: str) -> ServiceError:
    return ServiceError(Code.UNAVAILABLE, message)


def code_of(error: BaseException) -> Code:
    """The code of a TensorFlow error (its error_code), of a ServiceError, else INTERNAL."""
    if isinstance(error, ServiceError):
        return error.code
    value = getattr(error, "error_code", None)
    try:
        return Code(value) if value is not None else Code.INTERNAL
    except ValueError:
        return Code.UNKNOWN
