"""What a worker knows of its tasks, and what it decides from what it hears.

Events in, instructions out, in the shape of dask's worker state machine (and of the
client's client/reader_state.py): the dispatcher's heartbeat answers and pushed tasks, a
task's data running out, reports the dispatcher took, time passing and the worker stopping
are events; starting, deleting and stopping tasks, heartbeating at once, forgetting old
tasks and starting or dropping distributed_save chunks are instructions, which the task
book (task_book.py: runners, secrets) and the worker (worker_server.py: pipelines, threads,
RPCs) carry out. Nothing here waits, locks, sends or reads a clock (times come with the
events), so the decisions are unit-tested without a cluster, on a fake clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dataservice.v1 import common_pb2, dispatcher_pb2

# ---- events ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HeartbeatAnswered:
    """The dispatcher's answer to a heartbeat: tasks to start and delete, save chunks."""

    response: dispatcher_pb2.WorkerHeartbeatResponse


@dataclasses.dataclass(frozen=True)
class TaskOffered:
    """The dispatcher pushed a task (ProcessTask), ahead of the next heartbeat."""

    task: common_pb2.TaskDef


@dataclasses.dataclass(frozen=True)
class TaskStarted:
    """The task's runner exists: streams may read it."""

    task_id: int


@dataclasses.dataclass(frozen=True)
class TaskFinished:
    """Every element of the task was handed out (a stream saw its end), at `at` seconds."""

    task_id: int
    at: float


@dataclasses.dataclass(frozen=True)
class TasksReported:
    """The dispatcher took the report that these tasks finished."""

    task_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Tick:
    """Time passed (`now`, seconds); `in_use`: finished tasks some client's delivery record
    still names (a late stream must still find their secret)."""

    now: float
    in_use: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class Stopping:
    """The worker stops: no task starts any more."""


Event = HeartbeatAnswered | TaskOffered | TaskStarted | TaskFinished | TasksReported | Tick | Stopping

# ---- instructions --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StartTask:
    """Build the task's pipeline and runner (it reports TaskStarted once it exists)."""

    task: common_pb2.TaskDef


@dataclasses.dataclass(frozen=True)
class DeleteTask:
    """The dispatcher deleted the task: stop its runner if it runs, forget its clients'
    delivery records and its secret. `runner`: the one the task book took out (None if it
    was not running)."""

    task_id: int
    runner: Any = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class StopRunner:
    """Stop the task's runner (its data is handed out, or the worker stops). `runner`: the
    one the task book took out."""

    task_id: int
    runner: Any = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class HeartbeatNow:
    """Tell the dispatcher now rather than at the next interval (a task finished: a client
    asking the dispatcher right after its end of sequence must learn the task is over)."""


@dataclasses.dataclass(frozen=True)
class ForgetTasks:
    """Drop what is kept of these long finished, reported and unread tasks (their secrets):
    it would otherwise stay for the worker's life."""

    task_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class WriteSaveChunk:
    """Write a distributed_save chunk the dispatcher assigned."""

    chunk: Any


@dataclasses.dataclass(frozen=True)
class DropSaveChunk:
    """Stop writing a distributed_save chunk the dispatcher took back."""

    ref: Any


Instruction = StartTask | DeleteTask | StopRunner | HeartbeatNow | ForgetTasks | WriteSaveChunk | DropSaveChunk


class WorkerState:
    """The worker's tasks: running, finished (when), and finished but not yet reported.
    `retain_s`: how long a finished, reported task is remembered at least. Not thread-safe:
    the task book calls it under its lock."""

    def __init__(self, retain_s: float):
        self.retain_s = retain_s
        self.running: set[int] = set()
        self.finished: dict[int, float] = {}
        self.unreported: set[int] = set()
        self.stopping = False

    def is_known(self, task_id: int) -> bool:
        """Running or finished (or the worker stops): starting it again would be wrong."""
        return self.stopping or task_id in self.running or task_id in self.finished

    def handle(self, event: Event) -> list[Instruction]:
        match event:
            case HeartbeatAnswered(response):
                return self._on_heartbeat(response)
            case TaskOffered(task):
                return [] if self.is_known(task.task_id) else [StartTask(task)]
            case TaskStarted(task_id):
                if not self.is_known(task_id):
                    self.running.add(task_id)
                return []
            case TaskFinished(task_id, at):
                if task_id in self.finished or self.stopping:
                    return []
                self.finished[task_id] = at
                self.unreported.add(task_id)
                self.running.discard(task_id)
                return [StopRunner(task_id), HeartbeatNow()]
            case TasksReported(task_ids):
                self.unreported.difference_update(task_ids)
                return []
            case Tick(now, in_use):
                return self._forget(now, in_use)
            case Stopping():
                self.stopping = True
                stop: list[Instruction] = [StopRunner(t) for t in sorted(self.running)]
                self.running.clear()
                return stop
        raise TypeError(f"not a worker event: {event!r}")

    def _on_heartbeat(self, response: dispatcher_pb2.WorkerHeartbeatResponse) -> list[Instruction]:
        out: list[Instruction] = []
        # Deletions first: a task deleted and offered in one answer is not started again.
        for task_id in response.tasks_to_delete:
            self.running.discard(task_id)
            out.append(DeleteTask(task_id))
        deleted = set(response.tasks_to_delete)
        out += [StartTask(t) for t in response.new_tasks if not self.is_known(t.task_id) and t.task_id not in deleted]
        if not self.stopping:
            out += [WriteSaveChunk(chunk) for chunk in response.snapshot_chunks]
        out += [DropSaveChunk(ref) for ref in response.snapshot_chunks_to_drop]
        return out

    def _forget(self, now: float, in_use: frozenset[int]) -> list[Instruction]:
        before = now - self.retain_s
        old = tuple(
            sorted(t for t, at in self.finished.items() if at < before and t not in self.unreported and t not in in_use)
        )
        for task_id in old:
            del self.finished[task_id]
        return [ForgetTasks(old)] if old else []
