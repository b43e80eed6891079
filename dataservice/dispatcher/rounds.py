"""Coordinated reads: the rounds the dispatcher grants an iteration's consumers.

Consumers of a job with num_consumers read in rounds, each round one element from every task
(modes.py). A worker serves a round only once the dispatcher has granted it (the iteration's
round_limit, journaled), so that a task added later starts at a round no consumer has read
yet. Grants run a few seconds ahead of the most advanced consumer at the rate they read, and
are journaled only when half a grant is used: a journal append per grant, not per round.
"""

from __future__ import annotations

from dataservice import status
from dataservice.dispatcher.context import CoreContext
from dataservice.dispatcher.state import IterationId
from dataservice.v1 import journal_pb2

# The fewest rounds granted ahead of the consumers, how many seconds of reading (at the rate the
# consumers report) a grant covers, and how often that rate is measured.
MIN_ROUND_WINDOW = 16
ROUND_WINDOW_S = 4.0
ROUND_RATE_PERIOD_S = 0.5


class RoundGrants:
    """Extends iterations' round limits as their consumers report the round they are in."""

    def __init__(self, ctx: CoreContext):
        self._ctx = ctx
        # Per iteration: (time, round, rounds/s) of the consumers' last measured report.
        self._reports: dict[IterationId, tuple[float, int, float]] = {}

    def extend(self, iteration_id: IterationId, current_round: int, now: float) -> None:
        """Grants rounds ahead of `current_round` (a consumer's), a few seconds' worth at the rate
        the consumers read (at least MIN_ROUND_WINDOW), journaled when half the grant is used."""
        if current_round < 0:
            raise status.invalid_argument(f"current_round must be >= 0, got {current_round}")
        ctx = self._ctx
        with ctx.lock:
            iteration = ctx.state.known_iteration(iteration_id)
            key = iteration.iteration_id
            last_time, last_round, rate = self._reports.get(key, (now, current_round, 0.0))
            if now - last_time >= ROUND_RATE_PERIOD_S:
                rate = max(0, current_round - last_round) / (now - last_time)
                self._reports[key] = (now, max(current_round, last_round), rate)
            elif key not in self._reports:
                self._reports[key] = (now, current_round, 0.0)
            window = max(MIN_ROUND_WINDOW, int(rate * ROUND_WINDOW_S))
            if current_round + window // 2 >= iteration.round_limit:
                ctx.commit(
                    extend_rounds=journal_pb2.ExtendRoundsUpdate(iteration_id=key, round_limit=current_round + window)
                )

    def forget(self, iteration_id: IterationId) -> None:
        """The iteration was dropped: its rate is not needed any more."""
        self._reports.pop(iteration_id, None)
