"""A client's flow-control credits across the task streams of one iteration.

The client may hold at most `budget` elements that it has granted to workers
and the consumer has not taken yet (in flight or in its queue). Each stream
gets its share of the budget (split evenly over the streams still open) and
is granted more only as the consumer takes elements; a stream that ends gives
back what it was granted and did not receive. Every count is read and
written under the ledger's one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable


class _Account:
    __slots__ = ("acknowledge", "done", "granted", "outstanding", "received")

    def __init__(self) -> None:
        # Granted and not yet taken by the consumer; granted in all; received in all.
        self.outstanding = 0
        self.granted = 0
        self.received = 0
        self.done = False
        # The worker asked to hear at once what has arrived (it ends the stream after).
        self.acknowledge = False


class CreditLedger:
    def __init__(self, budget: int):
        self.budget = max(1, budget)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._accounts: dict[Hashable, _Account] = {}

    def open(self, stream: Hashable) -> None:
        """Adds a stream (its share is taken from the others' as they free credits)."""
        with self._lock:
            self._accounts.setdefault(stream, _Account())

    def grant(self, stream: Hashable, timeout_s: float, stopped: Callable[[], bool]) -> int:
        """Credits for `stream`: up to its share of the budget, out of what is free. Waits up to
        `timeout_s` for that many to become grantable; small grants wait until a quarter of
        the share is free, so that credit messages stay few. 0 once stopped or ended. Returns
        early (maybe with 0) when the worker asked for an acknowledgement (see acknowledgement())."""
        with self._changed:
            account = self._accounts[stream]
            self._changed.wait_for(
                lambda: stopped() or account.done or account.acknowledge or self._grantable(account) > 0, timeout_s
            )
            if stopped() or account.done:
                return 0
            count = self._grantable(account)
            account.outstanding += count
            account.granted += count
            return count

    def _grantable(self, account: _Account) -> int:
        live = sum(not a.done for a in self._accounts.values()) or 1
        share = max(1, self.budget // live)
        free = self.budget - sum(a.outstanding for a in self._accounts.values())
        wanted = share - account.outstanding
        if wanted < max(1, share // 4):
            return 0
        return max(0, min(wanted, free))

    def received(self, stream: Hashable, count: int) -> None:
        with self._lock:
            self._accounts[stream].received += count

    def ask_acknowledgement(self, stream: Hashable) -> None:
        """The worker wants to hear at once how many elements of the stream have arrived."""
        with self._changed:
            self._accounts[stream].acknowledge = True
            self._changed.notify_all()

    def acknowledgement(self, stream: Hashable) -> bool:
        """Whether the worker asked for an acknowledgement since the last call."""
        with self._lock:
            account = self._accounts[stream]
            asked, account.acknowledge = account.acknowledge, False
            return asked

    def received_total(self, stream: Hashable) -> int:
        """Elements the stream has received in all."""
        with self._lock:
            return self._accounts[stream].received

    def unused(self, stream: Hashable) -> int:
        """Granted but not received: what a new connection of the stream must grant again."""
        with self._lock:
            account = self._accounts[stream]
            return account.granted - account.received

    def consumed(self, taken: Iterable[tuple[Hashable, int]]) -> None:
        """The consumer took `count` elements of each stream: their credits are free again."""
        with self._changed:
            for stream, count in taken:
                self._accounts[stream].outstanding -= count
            self._changed.notify_all()

    def end_connection(self, ended: threading.Event) -> None:
        """Sets `ended`, the end of one connection of a stream, under the ledger's lock: a grant()
        whose `stopped` reads it either happened before (the next connection's unused() counts
        it and grants it again) or grants nothing. Wakes grant() waiters to see it."""
        with self._changed:
            ended.set()
            self._changed.notify_all()

    def end(self, stream: Hashable) -> None:
        """The stream receives nothing more: credits granted and not received are free again."""
        with self._changed:
            account = self._accounts[stream]
            account.done = True
            account.outstanding -= account.granted - account.received
            account.granted = account.received
            self._changed.notify_all()

    def is_done(self, stream: Hashable) -> bool:
        with self._lock:
            return self._accounts[stream].done

    def all_done(self) -> bool:
        with self._lock:
            return all(a.done for a in self._accounts.values())

    def outstanding(self) -> int:
        """Elements granted and not yet taken by the consumer, over all streams."""
        with self._lock:
            return sum(a.outstanding for a in self._accounts.values())

    def wake(self) -> None:
        """Wakes grant() waiters to look at `stopped` again."""
        with self._changed:
            self._changed.notify_all()
