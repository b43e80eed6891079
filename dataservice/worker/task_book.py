"""A worker's tasks as the data path sees them: runners, round servers and secrets by task.

The decisions (which tasks start, finish, are deleted, reported or forgotten) are the
worker state machine's (worker_state.py); the book runs it under one lock with the maps
streams read, so that a task is never both running and finished, a task never starts
twice, and a stream waiting for a task wakes as soon as it starts. The book holds no
threads and makes no remote calls: the worker carries out the instructions the book hands
back (starting pipelines, stopping runners, talking to the dispatcher). The running tasks
share the worker's memory budget (memory_budget.py): the book adds a runner to it when it
starts and takes it out when it finishes or is removed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from dataservice import read_keys
from dataservice.worker import delivery, worker_state
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.round_robin import RoundRobinServer
from dataservice.worker.task_runner import TaskRunner
from dataservice.worker.worker_state import DeleteTask, ForgetTasks, StopRunner, WorkerState

# How often a stream waiting for an unknown task asks again for a heartbeat.
_WAIT_POLL_S = 0.2


class TaskBook:
    """`on_unknown_task` is called while a stream waits for a task the worker has not heard
    of (the worker then heartbeats at once rather than at its next interval); `budget` is the
    memory budget its running tasks share (None: none); `retain_s`: how long a finished task
    is remembered at least (WorkerState; by default as long as its clients' delivery records)."""

    def __init__(
        self,
        on_unknown_task: Callable[[], None] = lambda: None,
        budget: MemoryBudget | None = None,
        retain_s: float = delivery.RETAIN_S,
    ):
        self._on_unknown_task = on_unknown_task
        self._budget = budget
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._state = WorkerState(retain_s)
        self._runners: dict[int, TaskRunner] = {}
        self._round_robins: dict[int, RoundRobinServer] = {}
        # Each task's iteration secret (read_keys.py; TaskDef.read_key), kept while the worker knows it.
        self._secrets: dict[int, str] = {}

    def handle(self, event: worker_state.Event) -> list[worker_state.Instruction]:
        """Runs the event through the worker's state machine and does what it decides to the
        book's own maps; returns the instructions left for the worker, a StopRunner or
        DeleteTask carrying the runner the book took out (ForgetTasks is the book's alone)."""
        with self._lock:
            out = [self._apply(instruction) for instruction in self._state.handle(event)]
            self._changed.notify_all()
            return [instruction for instruction in out if not isinstance(instruction, ForgetTasks)]

    def _apply(self, instruction: worker_state.Instruction) -> worker_state.Instruction:
        if isinstance(instruction, (StopRunner, DeleteTask)):
            task_id = instruction.task_id
            self._round_robins.pop(task_id, None)
            if isinstance(instruction, DeleteTask):
                self._secrets.pop(task_id, None)
            runner = self._runners.pop(task_id, None)
            if runner is not None and self._budget is not None:
                self._budget.remove(runner)
            return dataclasses.replace(instruction, runner=runner)
        if isinstance(instruction, ForgetTasks):
            for task_id in instruction.task_ids:
                self._secrets.pop(task_id, None)
        return instruction

    def is_known(self, task_id: int) -> bool:
        """Running or finished (or the worker stops): starting it again would be wrong."""
        with self._lock:
            return self._state.is_known(task_id)

    def add(
        self,
        task_id: int,
        start: Callable[[], tuple[TaskRunner, RoundRobinServer | None]],
        secret: str = "",
        produce_now: bool = True,
    ) -> TaskRunner | None:
        """Starts a task with `start` (called under the lock, so a task is never started twice)
        and records its runner, round server and its iteration's secret; None if it is known
        already. `produce_now=False`: its pipeline runs from the first read (wait_for), for a
        task that must not take work no client will read (a distributed_epoch task takes splits
        from the iteration's pool, and a worker that no client reads, one that target_workers
        leaves out, would take them from the readers of the others)."""
        with self._lock:
            if self._state.is_known(task_id):
                return None
            runner, round_robin = start()
            self._state.handle(worker_state.TaskStarted(task_id))
            self._runners[task_id] = runner
            if self._budget is not None:
                self._budget.add(runner)
            if produce_now:
                runner.start_producing()  # (a runner made with produce_now=False: now it has its share)
            self._secrets[task_id] = secret
            if round_robin is not None:
                self._round_robins[task_id] = round_robin
            self._changed.notify_all()
            return runner

    def may_read(self, task_id: int, client_id: int, read_key: str) -> bool:
        """Whether `read_key` is the key of client `client_id` of the task's iteration (a task the
        book does not know, or has forgotten, has no secret to check against: streams then wait
        or end as for any unknown or finished task)."""
        with self._lock:
            secret = self._secrets.get(task_id, "")
        return read_keys.matches(read_key, secret, client_id)

    def receipt(self, task_id: int, elements: int) -> str:
        """The task's receipt for `elements` sent to a client (read_keys.receipt); "" for a task
        the book no longer knows."""
        with self._lock:
            secret = self._secrets.get(task_id, "")
        return read_keys.receipt(secret, task_id, elements) if secret else ""

    def is_finished(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._state.finished

    def runner(self, task_id: int) -> TaskRunner | None:
        with self._lock:
            return self._runners.get(task_id)

    def round_robin(self, task_id: int) -> RoundRobinServer | None:
        """The round server of a coordinated-reads task (None for other tasks)."""
        with self._lock:
            return self._round_robins.get(task_id)

    def runners(self) -> list[TaskRunner]:
        """The running tasks' runners, in task order."""
        with self._lock:
            return [self._runners[t] for t in sorted(self._runners)]

    def running(self) -> list[int]:
        """Ids of the running tasks, in order."""
        with self._lock:
            return sorted(self._runners)

    def unreported(self) -> list[int]:
        """Finished tasks the dispatcher has not yet taken the report of, in order."""
        with self._lock:
            return sorted(self._state.unreported)

    def wait_for(self, task_id: int, timeout_s: float) -> TaskRunner | None:
        """The task's runner for a read, producing from now on (see add), waiting up to
        `timeout_s` for a task not heard of yet; None if it finished, never came, or the book
        closed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._state.is_known(task_id):  # (a running task is known)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._on_unknown_task()
                self._changed.wait(min(remaining, _WAIT_POLL_S))
            runner = self._runners.get(task_id)
        if runner is not None:
            runner.start_producing()
        return runner
