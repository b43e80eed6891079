"""The worker's memory budget: what its tasks' buffers, cross-trainer cache windows and the
messages its clients have not acknowledged yet may hold together (WorkerConfig.memory_budget_bytes).

A worker takes every task the dispatcher gives it: refusing one would stall that task's job,
which waits for every worker's share. So the budget is kept by shrinking, not refusing. Half of
it is a pool for the tasks' buffers and cache windows: a task's producer stores a chunk only
while the pool has room for it and the task holds less than its share (an equal part of the
pool, and never more than the task's own limit, task_runner.DEFAULT_BUFFER_BYTES or
cross_trainer_cache_size_bytes). The other half bounds the messages clients hold
unacknowledged: each task's equal part, split among its clients (and never more than
delivery.MAX_UNACKNOWLEDGED_BYTES each); a message is cut to fit. When a task starts, the
others' shares shrink: what they made before is drained by their clients, not dropped (a cache
window shrinks at once), and until it is, the pool keeps every producer from adding to it. When
a task ends, the shares grow. However full the pool, an empty buffer takes one chunk and a
client that has acknowledged everything gets one more message, so a task never stalls for want
of budget, it only reads less far ahead: the budget can be exceeded by one chunk per task and
one element per client, what any task needs to run at all.
"""

from __future__ import annotations

import threading
from typing import Protocol

from dataservice.worker.delivery import MAX_UNACKNOWLEDGED_BYTES


class Shares(Protocol):
    """What the budget asks of a task runner (task_runner.TaskRunner)."""

    def set_memory_share(self, nbytes: int) -> None: ...

    def join_pool(self, pool: MemoryBudget) -> None: ...

    def pool_freed(self) -> None: ...


class MemoryBudget:
    """Splits `total_bytes` among the running tasks (see the module's docstring)."""

    def __init__(self, total_bytes: int):
        self.total_bytes = total_bytes
        self._lock = threading.Lock()
        self._tasks: set[Shares] = set()
        # Held while shares are handed out, so that they are handed out in order.
        self._rebalancing = threading.Lock()
        # Bytes the tasks' buffers and windows hold, all together; bytes clients hold unacknowledged.
        self._held = 0
        self._unacknowledged = 0

    def add(self, task: Shares) -> None:
        task.join_pool(self)
        with self._rebalancing:
            with self._lock:
                self._tasks.add(task)
            self._rebalance()

    def remove(self, task: Shares) -> None:
        with self._rebalancing:
            with self._lock:
                if task not in self._tasks:
                    return
                self._tasks.discard(task)
            self._rebalance()

    def hold(self, nbytes: int) -> None:
        """A task's buffer holds `nbytes` more (fewer, if negative). Called with the task's lock
        held: takes only the budget's own."""
        with self._lock:
            self._held += nbytes

    def has_room(self, nbytes: int) -> bool:
        """Whether the pool has room for `nbytes` more."""
        with self._lock:
            return self._held + nbytes <= self.total_bytes // 2

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def freed(self) -> None:
        """Room was made in the pool: producers waiting for it look again. Called with no task's
        lock held (each task takes its own)."""
        with self._lock:
            tasks = list(self._tasks)
        for task in tasks:
            task.pool_freed()

    def count_unacknowledged(self, nbytes: int) -> None:
        """Clients hold `nbytes` more unacknowledged (fewer, if negative)."""
        with self._lock:
            self._unacknowledged += nbytes

    def unacknowledged_left(self) -> int:
        """Room left in the pool for messages clients hold unacknowledged (0 when full)."""
        with self._lock:
            return max(0, self.total_bytes - self.total_bytes // 2 - self._unacknowledged)

    def buffer_share(self) -> int:
        """Each running task's share for its buffer or cache window."""
        with self._lock:
            return self._buffer_share(len(self._tasks))

    def unacknowledged_share(self, clients_of_task: int) -> int:
        """What one of a task's `clients_of_task` clients may hold unacknowledged."""
        with self._lock:
            per_task = self.total_bytes // max(1, len(self._tasks)) // 2
        return max(1, min(MAX_UNACKNOWLEDGED_BYTES, per_task // max(1, clients_of_task)))

    def _buffer_share(self, tasks: int) -> int:
        return max(1, self.total_bytes // max(1, tasks) // 2)

    def _rebalance(self) -> None:
        """Gives every task its share (self._rebalancing held, self._lock not: each task takes
        its own lock, under which its producer asks the pool for room)."""
        with self._lock:
            tasks = list(self._tasks)
            share = self._buffer_share(len(tasks))
        for task in tasks:
            task.set_memory_share(share)
        self.freed()
