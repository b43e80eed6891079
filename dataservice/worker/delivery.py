"""What a worker has sent each client of each task and the client has not confirmed yet.

A stream can break with messages in flight: sent by the worker and never read by the client (a
reset connection, a partition, a socket that died with its process). Their elements were taken
out of the task's buffer, so without a record of them they would be lost, silently, and in
distributed_epoch nothing produces them again. So the worker keeps each message it sent until the
client acknowledges it (a client's requests carry how many of the task's elements it has
received), a reconnecting client's first request says where it stopped, and the new stream sends
again what followed before it takes new elements. A stream ends with end_of_sequence only once
the client has acknowledged every element, so a client that misses the end and reconnects is
told where it stands, never given less.

What is kept is bounded: a worker sends only what a client granted credits for, and our client
grants only for room it has and acknowledges with every grant; MAX_UNACKNOWLEDGED_BYTES holds back
a client that grants and never acknowledges. A record no stream has used for RETAIN_S is dropped
(its client gave up), as are a task's records when the dispatcher stops it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

from dataservice import status
from dataservice.transfer.chunk import Chunk
from dataservice.transfer.element_codec import ElementCodec

# How long a client's record outlives its last stream: a reconnecting client comes back within
# its retry deadline, and one that is away longer has failed its read.
RETAIN_S = 300.0
# A stream sends nothing new while its client holds this much unacknowledged data.
MAX_UNACKNOWLEDGED_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class SentMessage:
    """One message's elements: the `count` elements from `first` on (positions count the
    elements this client has been sent of the task)."""

    first: int
    count: int
    chunks: tuple[Chunk, ...]
    nbytes: int
    codec: ElementCodec

    @property
    def end(self) -> int:
        return self.first + self.count


class Delivery:
    """One client's messages of one task, sent and not yet acknowledged, in order; and which
    stream sends them now (a reconnect supersedes the stream it replaces)."""

    def __init__(self, now: float, count: Callable[[int], None] | None = None) -> None:
        """`count(delta)` is told each change of what the client holds unacknowledged (the
        worker's memory pool, memory_budget.py)."""
        self._count = count
        self._cond = threading.Condition()
        self._messages: collections.deque[SentMessage] = collections.deque()
        self._by_first: dict[int, SentMessage] = {}
        self._acknowledged = 0
        self._sent = 0
        self._unacknowledged_bytes = 0
        self._ended = False
        self._stream = 0
        self._attached = False
        self._idle_since = now

    def attach(self, received: int) -> int:
        """A new stream for a client that has received `received` elements: everything before is
        acknowledged, and the stream it replaces stops. Returns the new stream's number; raises
        ValueError when no client of ours could have received that many."""
        with self._cond:
            if not self._acknowledged <= received <= self._sent:
                raise ValueError(
                    f"the client says it received {received} elements, but it was sent {self._sent} "
                    f"and acknowledged {self._acknowledged}"
                )
            if received != self._sent and received not in self._by_first:
                raise ValueError(f"the client says it received {received} elements, which ends no message it was sent")
            self._acknowledge(received)
            self._stream += 1
            self._attached = True
            self._cond.notify_all()
            return self._stream

    def detach(self, stream: int, now: float) -> None:
        with self._cond:
            if stream == self._stream:
                self._attached = False
                self._idle_since = now

    def is_current(self, stream: int) -> bool:
        with self._cond:
            return stream == self._stream

    def message_at(self, position: int) -> SentMessage | None:
        """The recorded message whose first element is at `position`, if any."""
        with self._cond:
            return self._by_first.get(position)

    def record(self, chunks: list[Chunk], codec: ElementCodec) -> SentMessage:
        """Records a message of `chunks` (encoded with `codec`), about to be sent."""
        count = sum(chunk.num_elements for chunk in chunks)
        nbytes = sum(chunk.nbytes for chunk in chunks)
        with self._cond:
            message = SentMessage(self._sent, count, tuple(chunks), nbytes, codec)
            self._sent += count
            self._messages.append(message)
            self._by_first[message.first] = message
            self._change_unacknowledged(nbytes)
            return message

    def end(self) -> None:
        """Every element of the task that this client will get is recorded."""
        with self._cond:
            self._ended = True

    @property
    def ended(self) -> bool:
        with self._cond:
            return self._ended

    def acknowledge(self, received: int) -> None:
        """The client has received `received` elements (more than were sent counts as all)."""
        with self._cond:
            self._acknowledge(min(received, self._sent))
            self._cond.notify_all()

    def _acknowledge(self, received: int) -> None:
        if received <= self._acknowledged:
            return
        self._acknowledged = received
        while self._messages and self._messages[0].end <= received:
            message = self._messages.popleft()
            del self._by_first[message.first]
            self._change_unacknowledged(-message.nbytes)

    def _change_unacknowledged(self, nbytes: int) -> None:
        self._unacknowledged_bytes += nbytes
        if self._count is not None:
            self._count(nbytes)

    def uncount(self) -> None:
        """The record is dropped: what it holds leaves the count (and later changes stay out)."""
        with self._cond:
            if self._count is not None:
                self._count(-self._unacknowledged_bytes)
                self._count = None

    def wait_acknowledged(self, position: int, timeout_s: float) -> bool:
        """Waits up to `timeout_s` for the client to acknowledge the elements before `position`."""
        with self._cond:
            return self._cond.wait_for(lambda: self._acknowledged >= position, timeout_s)

    def wait_for_room(
        self,
        timeout_s: float,
        limit_bytes: int = MAX_UNACKNOWLEDGED_BYTES,
        pool_has_room: Callable[[], bool] = lambda: True,
    ) -> int:
        """Waits up to `timeout_s` until the client holds less than `limit_bytes` unacknowledged
        (its share of the worker's memory budget, memory_budget.py) and the worker's pool has
        room, or the client holds nothing unacknowledged (then it gets a message whatever the
        pool). Returns what the client holds unacknowledged then, or -1 if it never had room.
        (Room made in the pool by other clients is seen at the timeout.)"""

        def room() -> bool:
            held = self._unacknowledged_bytes
            return held == 0 or (held < limit_bytes and pool_has_room())

        with self._cond:
            return self._unacknowledged_bytes if self._cond.wait_for(room, timeout_s) else -1

    def unacknowledged_bytes(self) -> int:
        with self._cond:
            return self._unacknowledged_bytes

    def expired(self, now: float) -> bool:
        with self._cond:
            return not self._attached and now - self._idle_since > RETAIN_S


class Deliveries:
    """The worker's records, one per (task, iteration client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[tuple[int, int], Delivery] = {}
        self._count: Callable[[int], None] | None = None
        self._clients_per_task: collections.Counter[int] = collections.Counter()

    def attach(self, task_id: int, client_id: int, received: int) -> tuple[Delivery, int]:
        """The client's record of the task (new if it has none and received nothing) and the
        number of the stream that now sends it. Raises status.ServiceError: DATA_LOSS when the
        client received elements but the record is gone, INVALID_ARGUMENT when no client of
        ours could have received `received` elements."""
        with self._lock:
            delivery = self._records.get((task_id, client_id))
            if delivery is None:
                if received:
                    raise status.error(
                        status.Code.DATA_LOSS,
                        f"this worker no longer knows what it sent iteration client {client_id} of task "
                        f"{task_id} after its element {received} (a client's record is kept {RETAIN_S:.0f} s "
                        "after its last stream): elements in flight then may be lost",
                    )
                delivery = self._records[(task_id, client_id)] = Delivery(time.monotonic(), self._count)
                self._clients_per_task[task_id] += 1
        try:
            return delivery, delivery.attach(received)
        except ValueError as e:
            raise status.invalid_argument(f"bad StreamElements request for task {task_id}: {e}") from None

    def detach(self, delivery: Delivery, stream: int) -> None:
        delivery.detach(stream, time.monotonic())

    def forget_task(self, task_id: int) -> None:
        """Drops the task's records (the dispatcher stopped it: no client reads it any more)."""
        with self._lock:
            for key in [k for k in self._records if k[0] == task_id]:
                self._records.pop(key).uncount()
            self._clients_per_task.pop(task_id, None)

    def count_into(self, count: Callable[[int], None]) -> None:
        """Records made from now on tell `count` each change of what their clients hold
        unacknowledged (the worker's memory pool)."""
        with self._lock:
            self._count = count

    def clients_of(self, task_id: int) -> int:
        """How many clients have a record of the task."""
        with self._lock:
            return self._clients_per_task.get(task_id, 0)

    def tasks(self) -> set[int]:
        """The tasks some client still has a record of."""
        with self._lock:
            return {task_id for task_id, _ in self._records}

    def expire(self) -> None:
        """Drops the records no stream has used for RETAIN_S."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, d in self._records.items() if d.expired(now)]:
                self._records.pop(key).uncount()
                self._clients_per_task[key[0]] -= 1
                if self._clients_per_task[key[0]] <= 0:
                    del self._clients_per_task[key[0]]

    def unacknowledged_bytes(self) -> int:
        """Bytes sent and not yet acknowledged, over every record (for metrics)."""
        with self._lock:
            records = list(self._records.values())
        return sum(d.unacknowledged_bytes() for d in records)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)
