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
# the connection dropped. CANCELLED too: a server that stops cancels the calls in flight (gRPC's
# shutdown; our worker's streams when it stops), which for a client is a server gone, as a
# killed one is UNAVAILABLE; our clients never cancel a call they still wait for.
RETRYABLE = frozenset({Code.UNAVAILABLE, Code.ABORTED, Code.CANCELLED})


def code_of_number(value: int | None) -> Code:
    """The code numbered `value` (as a transport carries it), else UNKNOWN."""
    if value is None:
        return Code.UNKNOWN
    try:
        return Code(value)
    except ValueError:
        return Code.UNKNOWN


class ServiceError(Exception):
    """Raised by a service to answer with `code` and a message the user can act on.

    Clients raise the subclass of the code (error(), below), named as TensorFlow names its
    error classes: a trainer without TensorFlow catches `dataservice.errors.UnavailableError`
    where one with it catches `tf.errors.UnavailableError`; the TensorFlow client turns one
    into the other where its API hands errors to the caller (tf_errors.py)."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = Code(code)
        self.message = message

    @property
    def error_code(self) -> int:
        """The code's number, under TensorFlow's attribute name."""
        return int(self.code)

    def __reduce__(self):
        return error, (int(self.code), self.message)


class _CodedError(ServiceError):
    """A ServiceError whose class says its code (CODE)."""

    CODE = Code.UNKNOWN

    def __init__(self, message: str):
        super().__init__(self.CODE, message)


class CancelledError(_CodedError):
    CODE = Code.CANCELLED


class UnknownError(_CodedError):
    CODE = Code.UNKNOWN


class InvalidArgumentError(_CodedError):
    CODE = Code.INVALID_ARGUMENT


class DeadlineExceededError(_CodedError):
    CODE = Code.DEADLINE_EXCEEDED


class NotFoundError(_CodedError):
    CODE = Code.NOT_FOUND


class AlreadyExistsError(_CodedError):
    CODE = Code.ALREADY_EXISTS


class PermissionDeniedError(_CodedError):
    CODE = Code.PERMISSION_DENIED


class ResourceExhaustedError(_CodedError):
    CODE = Code.RESOURCE_EXHAUSTED


class FailedPreconditionError(_CodedError):
    CODE = Code.FAILED_PRECONDITION


class AbortedError(_CodedError):
    CODE = Code.ABORTED


class OutOfRangeError(_CodedError):
    CODE = Code.OUT_OF_RANGE


class UnimplementedError(_CodedError):
    CODE = Code.UNIMPLEMENTED


class InternalError(_CodedError):
    CODE = Code.INTERNAL


class UnavailableError(_CodedError):
    CODE = Code.UNAVAILABLE


class DataLossError(_CodedError):
    CODE = Code.DATA_LOSS


class UnauthenticatedError(_CodedError):
    CODE = Code.UNAUTHENTICATED


# The class of each code.
_CLASSES: dict[Code, type[_CodedError]] = {cls.CODE: cls for cls in _CodedError.__subclasses__()}


def error(code: Code | int, message: str) -> ServiceError:
    """The error of `code` (a number as a transport carries it) as the class of its code."""
    return _CLASSES[code_of_number(int(code))](message) if int(code) else ServiceError(Code.OK, message)


def invalid_argument(message: str) -> ServiceError:
    return error(Code.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return error(Code.NOT_FOUND, message)


def already_exists(message: str) -> ServiceError:
    return error(Code.ALREADY_EXISTS, message)


def failed_precondition(message: str) -> ServiceError:
    return error(Code.FAILED_PRECONDITION, message)


def permission_denied(message: str) -> ServiceError:
    return error(Code.PERMISSION_DENIED, message)


def unavailable(message: str) -> ServiceError:
    return error(Code.UNAVAILABLE, message)


def code_of(exc: BaseException) -> Code:
    """The code of a TensorFlow error (its error_code), of a ServiceError, else INTERNAL."""
    if isinstance(exc, ServiceError):
        return exc.code
    value = getattr(exc, "error_code", None)
    try:
        return Code(value) if value is not None else Code.INTERNAL
    except ValueError:
        return Code.UNKNOWN
