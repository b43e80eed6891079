"""The service's errors, named as tf.errors names them, for code that reads without TensorFlow.

Every one is a ServiceError with `code` (status.Code, gRPC's and TensorFlow's
numbers), `error_code` (the same, as an int) and `message`. The TensorFlow
client raises tf.errors classes instead (tf_errors.py).
"""

from dataservice.status import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    Code,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ServiceError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "Code",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "ServiceError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
]
