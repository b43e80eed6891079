"""What a client's IterationReader knows of its iteration, and what it decides from it.

Events in, instructions out, in the shape of dask's worker state machine: the dispatcher's
heartbeat answers, streams that end and the consumer going past elements are events; opening
or abandoning a task's stream, waking the consumer, asking the dispatcher at once and
reporting tasks whose end the consumer has reached are instructions, which reader.py carries
out with threads and sockets. Nothing here waits, locks or sends, so the decisions are
unit-tested without a cluster.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping

from dataservice.v1 import common_pb2, dispatcher_pb2


@dataclasses.dataclass(frozen=True)
class OpenStream:
    """Start reading a task of the iteration from its worker."""

    task: common_pb2.TaskInfo


@dataclasses.dataclass(frozen=True)
class AbandonStream:
    """The task's worker was lost: end its stream (what it delivered stays delivered)."""

    task_id: int


@dataclasses.dataclass(frozen=True)
class WakeConsumer:
    """Something that can end the iteration for the consumer happened: let it look."""


@dataclasses.dataclass(frozen=True)
class HeartbeatNow:
    """A stream ended: ask the dispatcher now rather than at the next interval (the task may be
    finished, or its worker lost)."""


@dataclasses.dataclass(frozen=True)
class ReportConsumedEnds:
    """The consumer has gone past every element of these tasks: tell the dispatcher now (in
    parallel_epochs that is what finishes a task)."""

    task_ids: frozenset[int]


Instruction = OpenStream | AbandonStream | WakeConsumer | HeartbeatNow | ReportConsumedEnds


class ReaderState:
    """The tasks a reader reads and how far each has got. Not thread-safe: the reader calls it
    under its own lock."""

    def __init__(self) -> None:
        # Tasks whose stream was opened.
        self.streams: set[int] = set()
        self.iteration_finished = False
        # Tasks the dispatcher reports finished: their data ran out, or their worker was lost.
        self.finished_tasks: set[int] = set()
        # Per task, the elements the consumer has gone past (to compare with what its stream
        # received); the tasks whose stream ended with an end of sequence; those whose end the
        # consumer has reached.
        self.passed: collections.Counter[int] = collections.Counter()
        self.ended_tasks: set[int] = set()
        self.consumed_ends: set[int] = set()

    def on_heartbeat(
        self, response: dispatcher_pb2.ClientHeartbeatResponse, stopped: bool = False
    ) -> list[Instruction]:
        """The dispatcher's answer: tasks new to this reader get a stream (unless the reader is
        stopping), lost tasks' streams are abandoned, and the consumer is woken when the
        iteration has just finished."""
        out: list[Instruction] = []
        for task in response.tasks:
            if task.finished:
                self.finished_tasks.add(task.task_id)
                if task.lost and task.task_id in self.streams:
                    out.append(AbandonStream(task.task_id))
            elif task.task_id not in self.streams and not stopped:
                self.streams.add(task.task_id)
                out.append(OpenStream(task))
        newly_finished = response.iteration_finished and not self.iteration_finished
        self.iteration_finished = response.iteration_finished
        if newly_finished:
            out.append(WakeConsumer())
        return out

    def on_stream_ended(self, task_id: int, end_of_sequence: bool, received: int) -> list[Instruction]:
        """A task's stream will receive nothing more; `end_of_sequence`: it ended with the task's
        end (not with a lost worker or an error); `received`: the elements it received."""
        out: list[Instruction] = []
        if end_of_sequence:
            self.ended_tasks.add(task_id)
            out.extend(self._consumed_ends({task_id: received}))
        out += [WakeConsumer(), HeartbeatNow()]
        return out

    def on_passed(self, counts: Iterable[tuple[int, int]], received: Mapping[int, int]) -> list[Instruction]:
        """The consumer has gone past `counts` (task id, elements) more; `received`: what each of
        those tasks' streams has received so far."""
        for task_id, count in counts:
            self.passed[task_id] += count
        return self._consumed_ends(received)

    def _consumed_ends(self, received: Mapping[int, int]) -> list[Instruction]:
        reached = frozenset(
            t for t in (received.keys() & self.ended_tasks) - self.consumed_ends if self.passed[t] == received[t]
        )
        self.consumed_ends |= reached
        return [ReportConsumedEnds(reached)] if reached else []

    def finished(self, reads_some_tasks: bool) -> bool:
        """Whether the dispatcher's word and the streams say the iteration is over for this
        reader (the reader also waits for its credits and its queue to be empty). Reading only
        some tasks (target_workers), it is over once each of them has ended."""
        if self.iteration_finished:
            return True
        return (
            reads_some_tasks
            and bool(self.streams)
            and all(t in self.ended_tasks or t in self.finished_tasks for t in self.streams)
        )
