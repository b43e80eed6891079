"""Runs the pipeline of one task into a bounded buffer that clients drain.

One producer thread iterates the dataset in chunks (chunk_iterator.py);
client streams take elements out, whole chunks or parts of one (a part is a
view, not a copy). The buffer is bounded in elements and bytes, so a slow
client stops the producer rather than growing the worker's memory. Several
streams may drain one task (a shared job): each element goes to exactly one
of them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dataservice.transfer.chunk import Chunk
from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker.chunk_iterator import ChunkIterator

if TYPE_CHECKING:
    from dataservice.worker.memory_budget import MemoryBudget

log = logging.getLogger(__name__)

DEFAULT_BUFFER_ELEMENTS = 8192
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024
# A producer waiting for room in the worker's memory pool looks again at least this often (it is
# woken when room is made; this is the backstop).
_POOL_RECHECK_S = 1.0


class ProductionTotals:
    """Elements, bytes and pipeline seconds produced on this worker, per dataset, since it
    started: the runners that still run plus those that ended (Prometheus counters never go down)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[TaskRunner] = set()
        self._ended: dict[str, list[float]] = {}

    def add(self, runner: TaskRunner) -> None:
        with self._lock:
            self._running.add(runner)

    def ended(self, runner: TaskRunner) -> None:
        with self._lock:
            if runner in self._running:
                self._running.discard(runner)
                _add(self._ended, runner)

    def by_dataset(self) -> dict[str, tuple[int, int, float]]:
        """dataset id -> (elements, bytes, pipeline seconds)."""
        with self._lock:
            result = {d: list(t) for d, t in self._ended.items()}
            for runner in self._running:
                _add(result, runner)
        return {d: (int(t[0]), int(t[1]), float(t[2])) for d, t in result.items()}


def _add(by_dataset: dict[str, list[float]], runner: TaskRunner) -> None:
    """Adds the runner's production to its dataset's [elements, bytes, seconds]."""
    totals = by_dataset.setdefault(runner.dataset_id, [0, 0, 0.0])
    totals[0] += runner.elements_produced
    totals[1] += runner.bytes_produced
    totals[2] += runner.processing_seconds


class TaskRunner:
    def __init__(
        self,
        task_id: int,
        make_chunks: Callable[[], ChunkIterator],
        codec: ElementCodec | None,
        buffer_elements: int = DEFAULT_BUFFER_ELEMENTS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        dataset_id: str = "",
        totals: ProductionTotals | None = None,
        produce_now: bool = True,
    ):
        """`produce_now=False`: the producer starts at start_producing(), for an owner that first
        gives the buffer its share of the worker's memory budget (task_book.py)."""
        self.task_id = task_id
        self.dataset_id = dataset_id
        self.codec = codec
        # Written by the producer thread only (readers see a recent value): what the pipeline
        # produced and the seconds it spent producing it, not waiting for room in the buffer.
        self.elements_produced = 0
        self.bytes_produced = 0
        self.processing_seconds = 0.0
        self._totals = totals
        if totals is not None:
            totals.add(self)
        self._make_chunks = make_chunks
        self._max_elements = buffer_elements
        # The buffer's own limit, and what it may hold now: less while the worker's memory
        # budget is shared among many tasks (memory_budget.py).
        self._limit_bytes = buffer_bytes
        self._max_bytes = buffer_bytes
        # The worker's memory pool the buffer's bytes count in (memory_budget.py), once it joins.
        self._pool: MemoryBudget | None = None
        self._waiting = False  # the producer waits for room
        # Chunks and their bytes, oldest first; what they hold in all.
        self._buffer: collections.deque[tuple[Chunk, int]] = collections.deque()
        self._buffered_elements = 0
        self._buffered_bytes = 0
        self._exhausted = False
        self._error: BaseException | None = None
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._produce, name=f"task-{task_id}", daemon=True)
        self._producing = False
        if produce_now:
            self.start_producing()

    def start_producing(self) -> None:
        """Starts the producer thread (once)."""
        with self._cond:
            if self._producing:
                return
            self._producing = True
        self._thread.start()

    def _produce(self) -> None:
        try:
            self._produce_into_buffer()
        finally:
            if self._totals is not None:
                self._totals.ended(self)

    def _produce_into_buffer(self) -> None:
        clock = time.perf_counter
        try:
            started = clock()
            chunks = iter(self._make_chunks())
            while True:
                try:
                    chunk = next(chunks)
                finally:
                    self.processing_seconds += clock() - started
                size = chunk.nbytes
                self.elements_produced += chunk.num_elements
                self.bytes_produced += size
                with self._cond:
                    while not self._stopped and self._must_wait(chunk.num_elements, size):
                        self._waiting = True
                        self._cond.wait(_POOL_RECHECK_S if self._pool is not None else None)
                    self._waiting = False
                    if self._stopped:
                        return
                    self._store(chunk, size)
                    self._cond.notify_all()
                started = clock()
        except StopIteration:
            error = self._exhausted_error()
            if error is not None:
                with self._cond:
                    self._error = error
                    self._cond.notify_all()
                return
        except Exception as e:  # noqa: BLE001 - handed to the clients, which raise it
            log.warning("task %d failed: %s", self.task_id, e)
            with self._cond:
                self._error = e
                self._cond.notify_all()
            return
        with self._cond:
            self._exhausted = True
            self._cond.notify_all()
        # Only now, with the end already visible to clients, is the pipeline's
        # iterator destroyed (which can block: see chunk_iterator).
        del chunks

    # ---- what a subclass changes ------------------------------------------

    def _must_wait(self, elements: int, size: int) -> bool:
        """Whether the producer waits before storing a chunk of `elements` and `size` bytes (lock held)."""
        return bool(self._buffer) and (
            self._buffered_elements + elements > self._max_elements
            or self._buffered_bytes + size > self._max_bytes
            or self._pool_is_full(size)
        )

    def _store(self, chunk: Chunk, size: int) -> None:
        """Stores a chunk the producer made (lock held)."""
        self._buffer.append((chunk, size))
        self._buffered_elements += chunk.num_elements
        self._hold(size)

    def _hold(self, nbytes: int) -> None:
        """The buffer holds `nbytes` more (fewer, if negative), counted in the pool too (lock held)."""
        self._buffered_bytes += nbytes
        if self._pool is not None:
            self._pool.hold(nbytes)

    def _pool_is_full(self, size: int) -> bool:
        return self._pool is not None and not self._pool.has_room(size)

    def _exhausted_error(self) -> BaseException | None:
        """The error the end of the pipeline's elements is, if it is one."""
        return None

    # ---- consumers --------------------------------------------------------

    def take(
        self, max_elements: int, max_bytes: int, timeout_s: float, linger_s: float = 0.0, trainer_id: str = ""
    ) -> tuple[list[Chunk], bool]:
        """Chunks of up to `max_elements` elements in all (at least one element, at most about
        `max_bytes`), and whether the task is done (every element taken). Each element goes to
        one caller; `trainer_id` is for the cross-trainer cache (cross_trainer_cache.py), not
        used here.

        Waits up to `timeout_s` for the first element, then up to `linger_s` for
        more, so a slow pipeline is not delayed by batching.
        Raises the pipeline's error once the buffer before it is drained.
        """
        with self._cond:
            self._cond.wait_for(
                lambda: self._buffer or self._exhausted or self._error is not None or self._stopped, timeout_s
            )
            # Linger briefly for more elements: one message per element would cap
            # throughput at the per-message cost, and a few ms add little latency.
            self._cond.wait_for(
                lambda: (
                    self._buffered_elements >= max_elements
                    or self._exhausted
                    or self._error is not None
                    or self._stopped
                    or self._buffered_bytes >= max_bytes
                ),
                linger_s,
            )
            taken: list[Chunk] = []
            count = taken_bytes = 0
            while self._buffer and count < max_elements:
                chunk, size = self._buffer[0]
                fits = _fitting(chunk, size, max_elements - count, max_bytes - taken_bytes, first=not taken)
                if fits == 0:
                    break
                self._buffer.popleft()
                if fits < chunk.num_elements:
                    rest = chunk.slice(fits, chunk.num_elements)
                    chunk = chunk.slice(0, fits)
                    self._buffer.appendleft((rest, rest.nbytes))
                    size -= rest.nbytes
                self._buffered_elements -= fits
                self._hold(-size)
                taken.append(chunk)
                count += fits
                taken_bytes += size
            if taken:
                self._cond.notify_all()
            elif self._error is not None:
                raise self._error
            done = self._exhausted and not self._buffer
        if taken and self._pool is not None:
            self._pool.freed()
        return taken, done

    def buffered(self) -> tuple[int, int]:
        """(elements, bytes) produced and not yet taken by a client."""
        with self._cond:
            return self._buffered_elements, self._buffered_bytes

    @property
    def capacity_bytes(self) -> int:
        return self._max_bytes

    def set_memory_share(self, nbytes: int) -> None:
        """The task's share of the worker's memory budget for its buffer: it holds at most that
        (or its own limit, if smaller) from now on; what it holds beyond is drained, not dropped."""
        with self._cond:
            self._max_bytes = max(1, min(self._limit_bytes, nbytes))
            self._cond.notify_all()

    def join_pool(self, pool: MemoryBudget) -> None:
        """Counts the buffer's bytes in the worker's memory pool from now on."""
        with self._cond:
            self._pool = pool
            pool.hold(self._buffered_bytes)

    def pool_freed(self) -> None:
        """Room was made in the pool: a producer waiting looks again."""
        if self._waiting:
            with self._cond:
                self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        with self._cond:
            return self._stopped

    @property
    def done(self) -> bool:
        with self._cond:
            return self._exhausted and not self._buffer

    def stop(self) -> None:
        """Stops producing (the thread ends after the element it is computing) and drops the buffer."""
        with self._cond:
            self._stopped = True
            self._buffer.clear()
            self._buffered_elements = 0
            self._hold(-self._buffered_bytes)
            self._cond.notify_all()
        if self._pool is not None:
            self._pool.freed()


def _fitting(chunk: Chunk, size: int, max_elements: int, max_bytes: int, first: bool) -> int:
    """How many of the chunk's first elements fit in `max_elements` and `max_bytes` (at least
    one when `first`: a message carries at least one element, however large)."""
    if chunk.num_elements <= max_elements and size <= max_bytes:
        return chunk.num_elements
    count = min(chunk.num_elements, max_elements)
    if size > max_bytes:
        sizes = chunk.element_nbytes()[:count]
        count = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))
    return max(count, 1) if first else count
