"""Runs the pipeline of one task into a bounded buffer that clients drain.

One producer thread iterates the dataset and encodes each element into numpy
components; client streams take elements out in batches. The buffer is
bounded in elements and bytes, so a slow client stops the producer rather
than growing the worker's memory. Several streams may drain one task (a
shared job): each element goes to exactly one of them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Set, Tuple

from dataservice.transfer.wire import Components, ElementCodec
from dataservice.worker.element_iterator import ComponentIterator

log = logging.getLogger(__name__)

DEFAULT_BUFFER_ELEMENTS = 8192
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024
NOTIFY_EVERY = 256


class ProductionTotals:
    """Elements, bytes and pipeline seconds produced on this worker, per dataset, since it
    started: the runners that still run plus those that ended (Prometheus counters never go down)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Set["TaskRunner"] = set()
        self._ended: Dict[str, List[float]] = {}

    def add(self, runner: "TaskRunner") -> None:
        with self._lock:
            self._running.add(runner)

    def ended(self, runner: "TaskRunner") -> None:
        with self._lock:
            if runner in self._running:
                self._running.discard(runner)
                _add(self._ended, runner)

    def by_dataset(self) -> Dict[str, Tuple[int, int, float]]:
        """dataset id -> (elements, bytes, pipeline seconds)."""
        with self._lock:
            result = {d: list(t) for d, t in self._ended.items()}
            for runner in self._running:
                _add(result, runner)
        return {d: (int(t[0]), int(t[1]), float(t[2])) for d, t in result.items()}


def _add(by_dataset: Dict[str, List[float]], runner: "TaskRunner") -> None:
    """Adds the runner's production to its dataset's [elements, bytes, seconds]."""
    totals = by_dataset.setdefault(runner.dataset_id, [0, 0, 0.0])
    totals[0] += runner.elements_produced
    totals[1] += runner.bytes_produced
    totals[2] += runner.processing_seconds


class TaskRunner:
    def __init__(
        self,
        task_id: int,
        make_elements: Callable[[], ComponentIterator],
        codec: Optional[ElementCodec],
        buffer_elements: int = DEFAULT_BUFFER_ELEMENTS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        dataset_id: str = "",
        totals: Optional[ProductionTotals] = None,
    ):
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
        self._make_elements = make_elements
        self._max_elements = buffer_elements
        self._max_bytes = buffer_bytes
        self._buffer: Deque[Tuple[Components, int]] = collections.deque()
        self._buffered_bytes = 0
        self._exhausted = False
        self._error: Optional[BaseException] = None
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._produce, name=f"task-{task_id}", daemon=True)
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
            elements = iter(self._make_elements())
            while True:
                try:
                    components = next(elements)
                finally:
                    self.processing_seconds += clock() - started
                size = self.codec.nbytes(components)
                self.elements_produced += 1
                self.bytes_produced += size
                with self._cond:
                    while not self._stopped and self._must_wait(size):
                        self._cond.wait()
                    if self._stopped:
                        return
                    self._buffer.append((components, size))
                    self._buffered_bytes += size
                    self._stored()
                    # Wake consumers for a first element or a full message, not for
                    # every element: each wake-up costs a GIL hand-over.
                    if len(self._buffer) == 1 or len(self._buffer) % NOTIFY_EVERY == 0:
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
        # iterator destroyed (which can block: see element_iterator).
        del elements

    # ---- what a subclass changes ------------------------------------------

    def _must_wait(self, size: int) -> bool:
        """Whether the producer waits before storing an element of `size` bytes (lock held)."""
        return bool(self._buffer) and (
            len(self._buffer) >= self._max_elements or self._buffered_bytes + size > self._max_bytes
        )

    def _stored(self) -> None:
        """Called after an element was stored (lock held)."""

    def _exhausted_error(self) -> Optional[BaseException]:
        """The error the end of the pipeline's elements is, if it is one."""
        return None

    # ---- consumers --------------------------------------------------------

    def take(
        self, max_elements: int, max_bytes: int, timeout_s: float, linger_s: float = 0.0, trainer_id: str = ""
    ) -> Tuple[List[Components], bool]:
        """Up to `max_elements` elements (at least one, at most about `max_bytes`), and
        whether the task is done (every element taken). Each element goes to one caller;
        `trainer_id` is for the cross-trainer cache (cross_trainer_cache.py), not used here.

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
                    len(self._buffer) >= max_elements
                    or self._exhausted
                    or self._error is not None
                    or self._stopped
                    or self._buffered_bytes >= max_bytes
                ),
                linger_s,
            )
            taken: List[Components] = []
            taken_bytes = 0
            while self._buffer and len(taken) < max_elements:
                components, size = self._buffer[0]
                if taken and taken_bytes + size > max_bytes:
                    break
                self._buffer.popleft()
                self._buffered_bytes -= size
                taken.append(components)
                taken_bytes += size
            if taken:
                self._cond.notify_all()
            elif self._error is not None:
                raise self._error
            return taken, self._exhausted and not self._buffer

    def buffered(self) -> Tuple[int, int]:
        """(elements, bytes) produced and not yet taken by a client."""
        with self._cond:
            return len(self._buffer), self._buffered_bytes

    @property
    def capacity_bytes(self) -> int:
        return self._max_bytes

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
            self._buffered_bytes = 0
            self._cond.notify_all()
