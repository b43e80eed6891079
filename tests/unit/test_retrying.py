"""retrying.call: how many tries a timeout buys and how long each try may wait, without servers."""

from __future__ import annotations

import grpc
import pytest

from dataservice import status
from dataservice.rpc import retrying


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "no answer"


class _Server:
    """A method that fails with `codes` in turn, then answers; it records each try's deadline."""

    def __init__(self, *codes: grpc.StatusCode):
        self.codes = list(codes)
        self.deadlines: list[float] = []

    def __call__(self, request: str, timeout: float) -> str:
        self.deadlines.append(timeout)
        if self.codes:
            raise _Failure(self.codes.pop(0))
        return f"answer to {request}"


def _call(server: _Server, timeout_s: float, rpc_timeout_s: float | None = 30.0) -> str:
    return retrying.call(
        server, "ping", server="dispatcher at test", what="ping", timeout_s=timeout_s, rpc_timeout_s=rpc_timeout_s
    )


def test_a_timeout_shorter_than_a_try_still_gives_one_try_its_full_wait():
    server = _Server()
    assert _call(server, timeout_s=0.001) == "answer to ping"
    assert server.deadlines == [retrying.MIN_TRY_S]


def test_a_try_waits_for_the_rest_of_the_timeout_up_to_the_calls_own_limit():
    server = _Server()
    _call(server, timeout_s=60.0, rpc_timeout_s=10.0)
    assert server.deadlines == [10.0]
    server = _Server()
    _call(server, timeout_s=5.0, rpc_timeout_s=None)
    assert 4.0 < server.deadlines[0] <= 5.0


def test_an_expired_timeout_ends_after_one_unanswered_try():
    server = _Server(grpc.StatusCode.DEADLINE_EXCEEDED)
    with pytest.raises(status.DeadlineExceededError):
        _call(server, timeout_s=0.0)
    assert len(server.deadlines) == 1


def test_unavailable_is_retried_until_the_timeout_then_named():
    server = _Server(*[grpc.StatusCode.UNAVAILABLE] * 1000)
    with pytest.raises(status.UnavailableError, match="dispatcher at test is unavailable; gave up after 0.3 s"):
        _call(server, timeout_s=0.3)
    assert 2 <= len(server.deadlines) < 1000


def test_a_transient_failure_is_retried_to_an_answer():
    server = _Server(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
    assert _call(server, timeout_s=10.0) == "answer to ping"
    assert len(server.deadlines) == 3


def test_errors_that_retrying_cannot_mend_are_raised_at_once():
    server = _Server(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(status.InvalidArgumentError, match="ping"):
        _call(server, timeout_s=10.0)
    assert len(server.deadlines) == 1
