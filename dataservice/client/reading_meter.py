"""What a client reports of its reading: elements and bytes handed to its consumer, the time
it waited for data, and the time its consumer spent on what it was handed.

tf.data calls for the reader's next chunk when the consumer wants more (saveable_stream.py), so
the time from handing out a chunk to the next request is the consumer's own time on it (its pace);
the time from that request until a chunk is there is waiting for the service. The
dispatcher turns these totals into the job's consumption rate, the clients' waiting share
and the recommended number of workers (dispatcher/load.py).
"""

from __future__ import annotations

import threading
import time

from dataservice.rpc.dispatcher_client import ReadingTotals


class ReadingMeter:
    """Totals of one reader; updated by the consumer's thread, read by the heartbeat thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._elements = 0
        self._bytes = 0
        self._wait_s = 0.0
        self._consume_s = 0.0
        self._handed_at: float | None = None
        self._waiting_since: float | None = None

    def wait_started(self) -> None:
        """The consumer asked for the next chunk: its time on the previous one ends here (a
        second call while still waiting changes nothing)."""
        now = time.perf_counter()
        with self._lock:
            if self._handed_at is not None:
                self._consume_s += now - self._handed_at
                self._handed_at = None
            if self._waiting_since is None:
                self._waiting_since = now

    def handed(self, elements: int, nbytes: int) -> None:
        """A chunk is handed to the consumer: the wait for it ends here."""
        now = time.perf_counter()
        with self._lock:
            if self._waiting_since is not None:
                self._wait_s += now - self._waiting_since
                self._waiting_since = None
            self._elements += elements
            self._bytes += nbytes
            self._handed_at = now

    def totals(self) -> ReadingTotals:
        """The totals so far, a wait or a consumer's turn in progress included up to now."""
        now = time.perf_counter()
        with self._lock:
            wait_s = self._wait_s + (now - self._waiting_since if self._waiting_since is not None else 0.0)
            consume_s = self._consume_s + (now - self._handed_at if self._handed_at is not None else 0.0)
            return ReadingTotals(self._elements, self._bytes, wait_s, consume_s)
