"""The worker's memory budget (worker/memory_budget.py) over real task runners and a real task
book, no sockets: buffers shrink as tasks start and grow as they end, cache windows shrink at
once, nothing produced is dropped, and a share smaller than a chunk still lets a task run."""

import time

import numpy as np
import tensorflow as tf

from dataservice.transfer.chunk import element_at, element_columns
from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker.cross_trainer_cache import CachingTaskRunner
from dataservice.worker.delivery import MAX_UNACKNOWLEDGED_BYTES
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.task_book import TaskBook
from dataservice.worker.task_runner import DEFAULT_BUFFER_BYTES, TaskRunner
from dataservice.worker.worker_state import Stopping, StopRunner, TaskFinished

MIB = 1 << 20
SPEC = tf.TensorSpec([MIB // 4], tf.float32)  # 1 MiB an element
CODEC = ElementCodec(SPEC)


def _mib_elements():
    """An endless pipeline of 1 MiB elements, one a chunk, the i-th filled with i."""
    i = 0
    while True:
        yield element_columns(CODEC.kinds, [np.full(MIB // 4, i, np.float32)])
        i += 1


def _settled(runner: TaskRunner, seconds: float = 0.3) -> int:
    """The runner's buffered bytes once its producer has stopped adding (within 10 s)."""
    deadline = time.monotonic() + 10
    last = -1
    while time.monotonic() < deadline:
        now = runner.buffered()[1]
        if now == last:
            return now
        last = now
        time.sleep(seconds)
    raise AssertionError("the producer never waited")


def _stop_runners(instructions) -> None:
    """Stops the runners the book took out, as the worker does."""
    for instruction in instructions:
        if isinstance(instruction, StopRunner):
            instruction.runner.stop()


def _start(book: TaskBook, task_id: int, make=TaskRunner, **kwargs) -> TaskRunner:
    return book.add(task_id, lambda: (make(task_id, _mib_elements, CODEC, produce_now=False, **kwargs), None))


def _values(chunks) -> list[int]:
    return [int(element_at(c, i)[0][0]) for c in chunks for i in range(c.num_elements)]


def test_buffers_shrink_as_tasks_start_and_grow_as_they_end():
    budget = MemoryBudget(16 * MIB)
    book = TaskBook(budget=budget)
    first = _start(book, 1)
    assert first.capacity_bytes == 8 * MIB  # alone: half the budget, below its own 64 MiB
    assert 7 * MIB < _settled(first) <= 8 * MIB
    others = [_start(book, t) for t in (2, 3, 4)]
    assert budget.buffer_share() == 2 * MIB
    assert all(r.capacity_bytes == 2 * MIB for r in [first, *others])
    # What the first task made before is kept (drained by its client, not dropped) and fills the
    # pool (8 MiB, half the budget): the new tasks get the one chunk an empty buffer always takes.
    assert first.buffered()[1] > 7 * MIB
    assert [_settled(runner) for runner in others] == [MIB] * 3
    assert budget.held_bytes == sum(r.buffered()[1] for r in [first, *others])
    taken = []
    while first.buffered()[1] > 2 * MIB:
        chunks, _ = first.take(1, MIB, timeout_s=5)
        taken += chunks
    # Drained: the first holds no more than its share, and the others fill theirs.
    assert _settled(first) <= 2 * MIB
    for runner in others:
        assert MIB < _settled(runner) <= 2 * MIB
    assert sum(r.buffered()[1] for r in [first, *others]) <= 8 * MIB
    # Tasks end: the first one's share grows back and its producer goes on.
    for task_id in (2, 3, 4):
        _stop_runners(book.handle(TaskFinished(task_id, at=0.0)))
    assert first.capacity_bytes == 8 * MIB
    assert 7 * MIB < _settled(first) <= 8 * MIB
    while len(taken) < 12:
        taken += first.take(1, MIB, timeout_s=5)[0]
    assert _values(taken) == list(range(len(taken)))  # in order, nothing lost
    _stop_runners(book.handle(Stopping()))
    assert budget.buffer_share() == 8 * MIB


def test_a_task_never_gets_more_than_its_own_limit():
    book = TaskBook(budget=MemoryBudget(16 << 30))
    runner = _start(book, 1)
    assert runner.capacity_bytes == DEFAULT_BUFFER_BYTES
    _stop_runners(book.handle(Stopping()))
    assert runner.stopped


def test_a_share_smaller_than_a_chunk_still_runs_the_task():
    book = TaskBook(budget=MemoryBudget(1024))
    runner = _start(book, 1)
    assert runner.capacity_bytes == 512
    assert _settled(runner) == MIB  # one chunk: an empty buffer always takes one
    chunks = [c for _ in range(5) for c in runner.take(1, MIB, timeout_s=5)[0]]
    assert _values(chunks) == [0, 1, 2, 3, 4]
    _stop_runners(book.handle(Stopping()))
    assert runner.stopped


def test_a_cache_window_shrinks_at_once():
    budget = MemoryBudget(32 * MIB)
    book = TaskBook(budget=budget)
    cache = _start(book, 1, make=CachingTaskRunner, cache_bytes=64 * MIB)
    read = []
    while len(read) < 30:
        read += _values(cache.take(4, 4 * MIB, timeout_s=5, trainer_id="a")[0])
    before = _settled(cache)
    assert 14 * MIB < before <= 16 * MIB + 8 * MIB  # the window (16 MiB) and what is read ahead
    runners = [_start(book, t) for t in (2, 3, 4)]  # shares of 4 MiB now
    assert cache.buffered()[1] <= 4 * MIB + 8 * MIB, "the window was not trimmed"
    while len(read) < 60:
        read += _values(cache.take(4, 4 * MIB, timeout_s=5, trainer_id="a")[0])
    assert _settled(cache) <= 4 * MIB + 2 * MIB
    # In order and whole (a take gives up to 4: one that found fewer ready makes the count pass 60).
    assert read == list(range(len(read))) and len(read) >= 60
    for runner in [cache, *runners]:
        runner.stop()


def test_unacknowledged_shares_split_a_tasks_half_among_its_clients():
    budget = MemoryBudget(64 * MIB)
    assert budget.unacknowledged_share(1) == 32 * MIB  # no task yet: as if one
    book = TaskBook(budget=budget)
    runners = [_start(book, t) for t in (1, 2)]
    assert budget.unacknowledged_share(4) == 4 * MIB  # 64 MiB / 2 tasks / 2 / 4 clients
    assert MemoryBudget(1 << 40).unacknowledged_share(1) == MAX_UNACKNOWLEDGED_BYTES
    assert MemoryBudget(8).unacknowledged_share(1000) == 1  # a client always gets a message
    for runner in runners:
        runner.stop()
