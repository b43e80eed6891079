"""How long a pipeline takes per unit of work on this worker (an element, a split), as the
median over its latest measurements.

A measurement can include a wait that is not the pipeline's (the GIL held by
another thread for its switch interval, a page fault, a preemption, a consumer
that held the pipeline back); a moving average would let one such sample of a
fast pipeline shrink every later task's chunks or ranges for a long while, the
median ignores it.
"""

from __future__ import annotations

import collections
import statistics
import threading


class MedianRate:
    """Seconds per unit over the latest WINDOW samples, shared by a dataset's tasks."""

    WINDOW = 15

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: collections.deque[float] = collections.deque(maxlen=self.WINDOW)

    def record(self, units: int, seconds: float) -> None:
        if units > 0:
            with self._lock:
                self._samples.append(seconds / units)

    def measured(self) -> float | None:
        """The median seconds per unit, or None before any sample."""
        with self._lock:
            return statistics.median(self._samples) if self._samples else None
