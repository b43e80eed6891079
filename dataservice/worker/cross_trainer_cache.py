"""A task whose elements several trainers share: a sliding window over its elements (as
TensorFlow's CrossTrainerCache), for jobs read with cross_trainer_cache.

Every trainer (clients with one trainer_id share a position) reads the task's elements in
order from its own position; elements are produced only when the trainer furthest ahead
needs more, so trainers that keep up with each other read what was produced for the first
of them instead of making the worker produce more. The window holds up to
cross_trainer_cache_size_bytes of elements that some trainer has read; older ones are
dropped, and a trainer that falls behind the window skips to its oldest element. A trainer
that joins starts at the oldest element in the window. A trainer that has taken nothing for
TRAINER_IDLE_S is forgotten (trainer ids are the clients' to choose, and a long-lived task
sees many trainers come and go); if it comes back, it starts as one that joins.
"""

from __future__ import annotations

import time

from dataservice import status
from dataservice.config import DEFAULT_CROSS_TRAINER_CACHE_BYTES
from dataservice.transfer.chunk import Chunk
from dataservice.worker.task_runner import TaskRunner

# The most elements produced ahead of the trainer furthest ahead.
READ_AHEAD_ELEMENTS = 1024
# The largest chunk such a task's pipeline produces at once (chunk_iterator.py): its producer waits
# for room only after making a chunk, so a chunk is what it may make beyond READ_AHEAD_ELEMENTS.
CACHE_CHUNK_ELEMENTS = 16
# How long a trainer's position is kept after its last read, and how often idle ones are looked for.
TRAINER_IDLE_S = 600.0
_PRUNE_EVERY_S = 10.0


class CachingTaskRunner(TaskRunner):
    def __init__(self, *args, cache_bytes: int = DEFAULT_CROSS_TRAINER_CACHE_BYTES, **kwargs):
        # Set before the producer thread starts (in TaskRunner's constructor). The window's own
        # limit, and what it may hold now (less while the worker's memory budget is shared).
        self._cache_limit_bytes = cache_bytes
        self._cache_bytes = cache_bytes
        self._first = 0  # the index of the oldest element in the window (_buffer[0])
        self._positions: dict[str, int] = {}
        # trainer -> when it last asked for elements (time.monotonic)
        self._last_asked: dict[str, float] = {}
        self._pruned_at = time.monotonic()
        # Elements handed to trainers, all trainers together (for the production ratio).
        self.elements_consumed = 0
        super().__init__(*args, **kwargs)

    def _end(self) -> int:
        return self._first + len(self._buffer)

    def _furthest(self) -> int:
        return max(self._positions.values(), default=self._first)

    def _must_wait(self, elements: int, size: int) -> bool:
        # Read ahead of the furthest trainer: at most READ_AHEAD_ELEMENTS and the buffer's limits,
        # and at most half the window, so that elements produced ahead are not dropped before
        # anyone reads them.
        ahead = self._end() - self._furthest()
        element_size = max(size // max(elements, 1), 1)
        limit = max(1, min(READ_AHEAD_ELEMENTS, self._max_elements, self._cache_bytes // (2 * element_size)))
        return ahead >= limit or (ahead > 0 and (ahead * element_size >= self._max_bytes or self._pool_is_full(size)))

    def _store(self, chunk: Chunk, size: int) -> None:
        # Trainers read from positions of their own: the window holds elements one by one.
        for element in chunk.split():
            super()._store(element, element.nbytes if chunk.num_elements > 1 else size)
        self._trim_window()

    def _trim_window(self) -> None:
        """Drops the oldest elements beyond the window's size that every trainer has read. Call
        with self._cond held."""
        furthest = self._furthest()
        while self._buffered_bytes > self._cache_bytes and len(self._buffer) > 1 and self._first < furthest:
            _, size = self._buffer.popleft()
            self._hold(-size)
            self._buffered_elements -= 1
            self._first += 1

    def set_memory_share(self, nbytes: int) -> None:
        """As TaskRunner's, for the window: it shrinks at once to what the share allows."""
        with self._cond:
            self._cache_bytes = max(1, min(self._cache_limit_bytes, nbytes))
            self._trim_window()
        super().set_memory_share(nbytes)

    def _forget_idle_trainers(self) -> None:
        """Drops the positions of trainers that have asked for nothing for TRAINER_IDLE_S (at
        most every _PRUNE_EVERY_S). Call with self._cond held."""
        now = time.monotonic()
        if now - self._pruned_at < min(_PRUNE_EVERY_S, TRAINER_IDLE_S):
            return
        self._pruned_at = now
        for trainer_id in [t for t, asked in self._last_asked.items() if now - asked > TRAINER_IDLE_S]:
            del self._last_asked[trainer_id]
            del self._positions[trainer_id]

    @property
    def trainers(self) -> int:
        """Trainers whose positions the task keeps."""
        with self._cond:
            return len(self._positions)

    def _exhausted_error(self) -> BaseException | None:
        return status.invalid_argument(
            "Cross-trainer caching requires the input dataset to be infinite. However, it reached the end of sequence."
        )

    def take(
        self, max_elements: int, max_bytes: int, timeout_s: float, linger_s: float = 0.0, trainer_id: str = ""
    ) -> tuple[list[Chunk], bool]:
        """Up to `max_elements` elements (chunks of one) from `trainer_id`'s position on; never done (the
        dataset is infinite). Raises the pipeline's error once the trainer reaches it."""
        with self._cond:
            self._forget_idle_trainers()
            self._positions.setdefault(trainer_id, self._first)
            self._last_asked[trainer_id] = time.monotonic()
            # A new position can let the producer go on.
            self._cond.notify_all()

            def available() -> int:
                return self._end() - max(self._positions[trainer_id], self._first)

            def ready() -> bool:
                return available() > 0 or self._error is not None or self._stopped

            self._cond.wait_for(ready, timeout_s)
            self._cond.wait_for(
                lambda: available() >= max_elements or self._error is not None or self._stopped, linger_s
            )
            position = max(self._positions[trainer_id], self._first)  # behind the window: skip ahead
            taken: list[Chunk] = []
            taken_bytes = 0
            while position < self._end() and len(taken) < max_elements:
                element, size = self._buffer[position - self._first]
                if taken and taken_bytes + size > max_bytes:
                    break
                taken.append(element)
                taken_bytes += size
                position += 1
            self._positions[trainer_id] = position
            if taken:
                self.elements_consumed += len(taken)
                self._cond.notify_all()
            elif self._error is not None:
                raise self._error
            return taken, False
