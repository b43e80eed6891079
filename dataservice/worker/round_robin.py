"""Coordinated reads on the worker: one task's elements served in rounds.

Round r of a task is the next `num_consumers` elements of its pipeline;
consumer c gets element c of it. A round is cut only once every consumer has
asked for it, which keeps synchronous trainers in step (no consumer runs ahead
and no round is cut for consumers that moved on) and bounds the memory to a
few rounds. A cut round is kept for a while, so a consumer whose response was
lost can ask again and get the same element.
"""

from __future__ import annotations

import collections
import threading
import time

from dataservice.transfer.chunk import Chunk
from dataservice.worker.task_runner import TaskRunner

# Cut rounds kept for consumers that ask again.
KEEP_ROUNDS = 8
# How far past this task's newest cut round (or its first) a consumer may ask. Consumers take the
# job's tasks in turn, so the next round a task serves is one task count past its last: rounds
# further ahead than this no consumer can have reached, and would only grow the table of rounds
# asked for.
MAX_ROUNDS_AHEAD = 1 << 16


class RoundPassedError(ValueError):
    """A consumer new to the task asked for a round the task has already cut: its elements went
    to the consumers before it (a trainer started again under a running job)."""


class RoundRobinServer:
    def __init__(self, runner: TaskRunner, num_consumers: int, starting_round: int):
        self._runner = runner
        self._num_consumers = num_consumers
        self.starting_round = starting_round
        self._cond = threading.Condition()
        # round -> its elements (None: the pipeline ended before the round was full).
        self._rounds: dict[int, list[Chunk] | None] = {}
        self._order: collections.deque[int] = collections.deque()
        self._requested: dict[int, set[int]] = collections.defaultdict(set)
        # consumer index -> the client that last asked as that consumer.
        self._clients: dict[int, int] = {}
        self._cutting = False

    def get(
        self, consumer_index: int, round_index: int, wait_s: float, client_id: int | None = None
    ) -> tuple[Chunk | None, bool]:
        """(element as a chunk of one, end_of_sequence) for the consumer's share of the round; (None, False)
        when not every consumer has asked for the round within `wait_s` (ask again).

        A cut round is given again to the client that asked for it (its response may have been
        lost), but not to another client asking as the same consumer (RoundPassedError): that
        is a consumer started again while the job went on, which would read what its
        predecessor read, as TensorFlow's service refuses too."""
        if not 0 <= consumer_index < self._num_consumers:
            raise ValueError(
                f"consumer_index {consumer_index} out of range: the job has {self._num_consumers} consumers"
            )
        if round_index < self.starting_round:
            raise ValueError(f"round {round_index} comes before round {self.starting_round}, this task's first")
        newest = self._order[-1] if self._order else self.starting_round
        if round_index > newest + MAX_ROUNDS_AHEAD:
            raise ValueError(
                f"round {round_index} is more than {MAX_ROUNDS_AHEAD} rounds past round {newest}, this task's "
                "newest: no consumer can have reached it"
            )
        deadline = time.monotonic() + wait_s
        with self._cond:
            if client_id is not None and self._clients.get(consumer_index) != client_id:
                if self._order and round_index <= self._order[-1]:
                    raise RoundPassedError(
                        f"consumer {consumer_index} asked for round {round_index}, but the current round has already "
                        f"reached {self._order[-1] + 1}: a consumer that starts again cannot join a coordinated job "
                        "that went on without it; start the job again under a new job_name"
                    )
                self._clients[consumer_index] = client_id
            if round_index not in self._rounds:
                if self._order and round_index < self._order[0]:
                    raise ValueError(
                        f"round {round_index} was cut and dropped long ago (oldest kept: "
                        f"{self._order[0]}): this consumer fell behind the others"
                    )
                self._requested[round_index].add(consumer_index)
                self._cond.notify_all()
                while round_index not in self._rounds:
                    everyone = len(self._requested[round_index]) == self._num_consumers
                    if everyone and not self._cutting:
                        self._cut(round_index, deadline)
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None, False
                    self._cond.wait(remaining)
            elements = self._rounds[round_index]
        if elements is None:
            return None, True
        return elements[consumer_index], False

    def _cut(self, round_index: int, deadline: float) -> None:
        """Takes the round's elements from the task's buffer. Called with the lock held;
        releases it while waiting for the pipeline."""
        self._cutting = True
        try:
            elements: list[Chunk] = []
            done = False
            self._cond.release()
            try:
                while len(elements) < self._num_consumers and not done:
                    taken, done = self._runner.take(
                        self._num_consumers - len(elements), 1 << 62, max(0.05, deadline - time.monotonic())
                    )
                    elements.extend(element for chunk in taken for element in chunk.split())
                    if not taken and not done and self._runner.stopped:
                        done = True
            finally:
                self._cond.acquire()
            self._rounds[round_index] = elements if len(elements) == self._num_consumers else None
            self._order.append(round_index)
            # Rounds up to this one that were asked for but not cut (their consumers moved on past
            # them, or never were consumers) are not asked for any more.
            for stale in [r for r in self._requested if r <= round_index]:
                del self._requested[stale]
            while len(self._order) > KEEP_ROUNDS:
                del self._rounds[self._order.popleft()]
        finally:
            self._cutting = False
            self._cond.notify_all()
