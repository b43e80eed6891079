"""The service's errors as the TensorFlow client hands them to its caller: tf.errors classes.

The data path raises the errors of status.py (ServiceError, one class per
code, named as TensorFlow names its own), so that a trainer without
TensorFlow (reader.py) reads the service with the same code. Where the
TensorFlow-facing API returns to its caller (register_dataset, distribute,
from_dataset_id, distributed_save, WorkerServer), an error is re-typed as the
tf.errors class of its code, as TensorFlow's own service raises it: a
drop-in's callers catch `tf.errors.NotFoundError`. Errors raised while
tf.data reads reach the caller through tf.data's Python-function ops, which
re-type every exception themselves (README, "Compatibility").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import tensorflow as tf

from dataservice import status

_TF_ERRORS: dict[status.Code, type[tf.errors.OpError]] = {
    status.Code.CANCELLED: tf.errors.CancelledError,
    status.Code.UNKNOWN: tf.errors.UnknownError,
    status.Code.INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
    status.Code.DEADLINE_EXCEEDED: tf.errors.DeadlineExceededError,
    status.Code.NOT_FOUND: tf.errors.NotFoundError,
    status.Code.ALREADY_EXISTS: tf.errors.AlreadyExistsError,
    status.Code.PERMISSION_DENIED: tf.errors.PermissionDeniedError,
    status.Code.RESOURCE_EXHAUSTED: tf.errors.ResourceExhaustedError,
    status.Code.FAILED_PRECONDITION: tf.errors.FailedPreconditionError,
    status.Code.ABORTED: tf.errors.AbortedError,
    status.Code.OUT_OF_RANGE: tf.errors.OutOfRangeError,
    status.Code.UNIMPLEMENTED: tf.errors.UnimplementedError,
    status.Code.INTERNAL: tf.errors.InternalError,
    status.Code.UNAVAILABLE: tf.errors.UnavailableError,
    status.Code.DATA_LOSS: tf.errors.DataLossError,
    status.Code.UNAUTHENTICATED: tf.errors.UnauthenticatedError,
}

P = ParamSpec("P")
R = TypeVar("R")


def as_tf_error(error: status.ServiceError) -> tf.errors.OpError:
    """The tf.errors error of `error`'s code, with its message."""
    return _TF_ERRORS.get(error.code, tf.errors.UnknownError)(None, None, error.message)


def raising_tf_errors(function: Callable[P, R]) -> Callable[P, R]:
    """`function`, raising the service's errors as tf.errors classes."""

    @functools.wraps(function)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except status.ServiceError as e:
            raise as_tf_error(e) from None

    return wrapped
