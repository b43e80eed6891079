"""A worker's tasks: running, finished, and finished but not yet reported to the dispatcher.

One lock guards all three, so that a task is never both running and finished
and a stream waiting for a task wakes as soon as it starts. The book holds
no threads and makes no remote calls: the worker starts and stops runners and
talks to the dispatcher; streams look tasks up here. The running tasks share
the worker's memory budget (memory_budget.py): the book adds a runner to it
when it starts and takes it out when it finishes or is removed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dataservice import read_keys
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.round_robin import RoundRobinServer
from dataservice.worker.task_runner import TaskRunner

# How often a stream waiting for an unknown task asks again for a heartbeat.
_WAIT_POLL_S = 0.2


class TaskBook:
    """`on_unknown_task` is called while a stream waits for a task the worker has not heard
    of (the worker then heartbeats at once rather than at its next interval); `budget` is the
    memory budget its running tasks share (None: none)."""

    def __init__(self, on_unknown_task: Callable[[], None] = lambda: None, budget: MemoryBudget | None = None):
        self._on_unknown_task = on_unknown_task
        self._budget = budget
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._runners: dict[int, TaskRunner] = {}
        self._round_robins: dict[int, RoundRobinServer] = {}
        # finished task -> when (time.monotonic), until forget_finished drops it
        self._finished: dict[int, float] = {}
        self._unreported: set[int] = set()
        # Each task's iteration secret (read_keys.py; TaskDef.read_key), kept while the worker knows it.
        self._secrets: dict[int, str] = {}
        self._closed = False

    def is_known(self, task_id: int) -> bool:
        """Running or finished (or the book is closed): starting it again would be wrong."""
        with self._lock:
            return self._closed or task_id in self._runners or task_id in self._finished

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
            if self._closed or task_id in self._runners or task_id in self._finished:
                return None
            runner, round_robin = start()
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

    def finish(self, task_id: int) -> TaskRunner | None:
        """Marks the task finished (its data handed out) and to be reported; returns its runner
        for the caller to stop, or None if it had finished already."""
        with self._lock:
            if task_id in self._finished:
                return None
            self._finished[task_id] = time.monotonic()
            self._unreported.add(task_id)
            self._round_robins.pop(task_id, None)
            runner = self._runners.pop(task_id, None)
            self._leave_budget(runner)
            self._changed.notify_all()
            return runner

    def forget_finished(self, before: float, in_use: set[int]) -> list[int]:
        """Forgets the tasks that finished before `before` (time.monotonic), were reported to the
        dispatcher and are not `in_use` (no client's delivery record left): their ids and secrets
        would otherwise stay for the worker's life. A late stream for one then waits as for an
        unknown task and its client asks the dispatcher, which knows it finished. Returns them."""
        with self._lock:
            old = [
                t for t, at in self._finished.items() if at < before and t not in self._unreported and t not in in_use
            ]
            for task_id in old:
                del self._finished[task_id]
                self._secrets.pop(task_id, None)
            return old

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

    def remove(self, task_id: int) -> TaskRunner | None:
        """Forgets a running task the dispatcher stopped; returns its runner for the caller to stop."""
        with self._lock:
            self._secrets.pop(task_id, None)
            self._round_robins.pop(task_id, None)
            runner = self._runners.pop(task_id, None)
            self._leave_budget(runner)
            return runner

    def _leave_budget(self, runner: TaskRunner | None) -> None:
        if runner is not None and self._budget is not None:
            self._budget.remove(runner)

    def close(self) -> list[TaskRunner]:
        """Forgets every running task and refuses new ones; returns the runners to stop."""
        with self._lock:
            self._closed = True
            runners = list(self._runners.values())
            self._runners.clear()
            self._round_robins.clear()
            for runner in runners:
                self._leave_budget(runner)
            self._changed.notify_all()
            return runners

    def is_finished(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._finished

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
        with self._lock:
            return sorted(self._unreported)

    def mark_reported(self, task_ids: list[int]) -> None:
        with self._lock:
            self._unreported.difference_update(task_ids)

    def wait_for(self, task_id: int, timeout_s: float) -> TaskRunner | None:
        """The task's runner for a read, producing from now on (see add), waiting up to
        `timeout_s` for a task not heard of yet; None if it finished, never came, or the book
        closed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while task_id not in self._runners and task_id not in self._finished and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._on_unknown_task()
                self._changed.wait(min(remaining, _WAIT_POLL_S))
            runner = self._runners.get(task_id)
        if runner is not None:
            runner.start_producing()
        return runner
