"""Which of an iteration's tasks changed when, so that a client heartbeat answers with the tasks
that changed since the client's last answer rather than with every task of the iteration
(ClientHeartbeatRequest.tasks_version): with a task per worker, a full answer grows with the
cluster, and every client of every job asks each second.

What a client learns of a task (common.proto TaskInfo) changes when the task is made, when it
finishes and when it is lost; the core records each such update here as it applies it. A
version is (incarnation << SEQUENCE_BITS) | sequence, the sequence counting changes in this
process: the incarnation is random per dispatcher process, so a version from before a restart,
whose sequence this process does not know, asks for every task again. Nothing here is
journaled; each iteration's record goes with the iteration.
"""

from __future__ import annotations

import bisect
import secrets

from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import journal_pb2

SEQUENCE_BITS = 40
_SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1


class TaskChanges:
    def __init__(self, incarnation: int | None = None):
        # Non-zero, and the whole version positive in an int64.
        self._incarnation = incarnation if incarnation is not None else secrets.randbelow((1 << 22) - 1) + 1
        self._sequence = 0
        # iteration id -> [(sequence, task id)], in sequence order
        self._changes: dict[int, list[tuple[int, int]]] = {}

    @property
    def version(self) -> int:
        """The version a client has once it has heard of every change so far."""
        return (self._incarnation << SEQUENCE_BITS) | self._sequence

    def record(self, update: journal_pb2.Update, state: DispatcherState) -> None:
        """Notes the tasks `update` (just applied to `state`) changed."""
        kind = update.WhichOneof("kind")
        if kind == "create_task":
            self._changed(update.create_task.iteration_id, update.create_task.task_id)
        elif kind == "finish_task":
            task = state.task(update.finish_task.task_id)
            if task is not None:
                self._changed(task.iteration_id, task.task_id)
        elif kind == "remove_worker":
            for task_id in update.remove_worker.lost_tasks:
                task = state.task(task_id)
                if task is not None:
                    self._changed(task.iteration_id, task_id)
        elif kind == "drop_iteration":
            self._changes.pop(update.drop_iteration.iteration_id, None)

    def changed_since(self, iteration_id: int, version: int) -> set[int] | None:
        """The ids of the iteration's tasks that changed after `version`; None when the client
        must be told every task (no version yet, or one this process did not give)."""
        sequence = version & _SEQUENCE_MASK
        if version <= 0 or version >> SEQUENCE_BITS != self._incarnation or sequence > self._sequence:
            return None
        changes = self._changes.get(iteration_id, [])
        first = bisect.bisect_right(changes, (sequence, float("inf")))
        return {task_id for _, task_id in changes[first:]}

    def _changed(self, iteration_id: int, task_id: int) -> None:
        self._sequence += 1
        self._changes.setdefault(iteration_id, []).append((self._sequence, task_id))
