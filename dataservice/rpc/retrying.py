"""A unary call retried on transient errors with exponential backoff until an
overall deadline, failing with an error of its status code (status.py) that
names the server and says what happened."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import grpc

from dataservice import status
from dataservice.rpc.errors import RETRYABLE_CODES, client_error

# Each try waits at least this long for an answer, however little of the call's timeout is left:
# a short timeout (dispatcher_timeout_ms=0 among them) means one try, as in TensorFlow's retry
# loop, not a try cut off before a busy server could answer.
MIN_TRY_S = 1.0


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
    rpc_timeout_s: float | None = 30.0,
) -> Any:
    """Calls `method(request)`, retrying RETRYABLE_CODES until `timeout_s` has passed.

    `server` names the peer in errors ("dispatcher at localhost:5050").
    Other errors are raised at once, as the class of their code.
    """
    backoff = Backoff(timeout_s)
    while True:
        per_try = max(MIN_TRY_S, backoff.remaining())
        if rpc_timeout_s:
            per_try = min(rpc_timeout_s, per_try)
        try:
            return method(request, timeout=per_try)
        except grpc.RpcError as e:
            retryable = e.code() in RETRYABLE_CODES or (
                e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and backoff.remaining() > 0
            )
            if not retryable:
                raise client_error(e, f"{what} ({server})") from None
            if not backoff.sleep():
                raise status.UnavailableError(
                    f"{what}: the {server} is unavailable; gave up after {timeout_s:.1f} s "
                    f"(last error: {e.code().name}: {e.details()})",
                ) from None
