"""A ring of shared memory between a worker and a client on one host, for message bodies.

Over a socket, every byte of an element is copied twice by the kernel (into
the socket, out of it), and on a host of few cores those copies are what
limits a same-host transfer. With a ring, the worker copies a message's body
into memory both processes map and sends only its header over the Unix
socket; the client's arrays are views of the ring, which TensorFlow adopts
without a copy. One copy instead of two, and no socket traffic for the bytes.

The ring is a memfd (an anonymous file: no name under /dev/shm, nothing left
behind by a process that is killed) whose descriptor travels with the
stream's first message (SCM_RIGHTS), cut into slots of one message body
each. A slot is free again once the client released it: the client releases
a slot when the last array viewing it is freed (tf.data dropped the
elements), and says so in a request of its own. A body that finds no free
slot (the client still holds them all, say behind a large shuffle buffer) or
is larger than a slot is sent in the message as over TCP: the ring never
holds the stream back.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
import weakref
from collections.abc import Callable

import numpy as np

from dataservice.transfer.chunk import TF_ALIGNMENT

# The largest ring a worker makes for one stream, and for all its streams together.
MAX_RING_BYTES = 256 * 1024 * 1024
MAX_TOTAL_RING_BYTES = 1024 * 1024 * 1024
MIN_RING_BYTES = 16 * 1024 * 1024
# A slot holds one message body. Slots are a ring's eighth, between these sizes: a stream of
# large elements sends large messages and asks for a large ring, one of small elements small
# ones; a body larger than its ring's slots goes through the socket.
RING_SLOTS = 8
MIN_SLOT_BYTES = 4 * 1024 * 1024 + 64 * 1024
MAX_SLOT_BYTES = 16 * 1024 * 1024 + 64 * 1024


def ring_bytes_for(elements: int, element_bytes: int) -> int:
    """The ring a client asks for: room for twice what it may hold of elements of
    `element_bytes` (0: unknown, then MAX_RING_BYTES), within [MIN_RING_BYTES, MAX_RING_BYTES]."""
    wanted = 2 * elements * element_bytes if element_bytes else MAX_RING_BYTES
    return max(MIN_RING_BYTES, min(MAX_RING_BYTES, wanted))


def slot_bytes_for(ring_bytes: int) -> int:
    """The slot size of a ring of `ring_bytes`: its RING_SLOTS-th, within [MIN_SLOT_BYTES, MAX_SLOT_BYTES]."""
    return max(MIN_SLOT_BYTES, min(MAX_SLOT_BYTES, ring_bytes // RING_SLOTS))


def available() -> bool:
    """Whether this platform has what rings need (memfd, descriptor passing)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "SCM_RIGHTS")


class RingBudget:
    """The ring bytes a worker's streams hold together, up to MAX_TOTAL_RING_BYTES."""

    def __init__(self, limit: int = MAX_TOTAL_RING_BYTES):
        self.limit = limit
        self._lock = threading.Lock()
        self._used = 0
        # Messages of streams with a ring: their bodies in the ring, and in the socket.
        self.messages = 0
        self.inline_messages = 0

    def count(self, in_ring: bool) -> None:
        with self._lock:
            if in_ring:
                self.messages += 1
            else:
                self.inline_messages += 1

    def totals(self) -> dict:
        with self._lock:
            return {"ring_bytes": self._used, "messages": self.messages, "inline_messages": self.inline_messages}

    def take(self, wanted: int) -> int:
        """Up to `wanted` bytes (at least MIN_RING_BYTES, else 0: no ring)."""
        with self._lock:
            size = min(wanted, MAX_RING_BYTES, self.limit - self._used)
            size -= size % mmap.PAGESIZE
            if size < MIN_RING_BYTES:
                return 0
            self._used += size
            return size

    def give_back(self, size: int) -> None:
        with self._lock:
            self._used -= size


class Ring:
    """The worker's side: the memfd, mapped, in slots of `slot_bytes` (a message body each).

    Free slots are a stack: the slot released last is written next, while its pages are still
    in the processor's caches (a ring walked in order would push every message through memory)."""

    def __init__(self, size: int, slot_bytes: int):
        slot_bytes += -slot_bytes % mmap.PAGESIZE
        self.slot_bytes = slot_bytes
        self.size = max(slot_bytes, size - size % slot_bytes)
        self.fd = os.memfd_create("dataservice-stream", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self._map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self._map, np.uint8)
        self._lock = threading.Lock()
        self._free = list(range(self.size // slot_bytes - 1, -1, -1))
        self._taken = set()

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a free slot for a body of `nbytes`, or None (too large, or none free)."""
        if nbytes > self.slot_bytes:
            return None
        with self._lock:
            if not self._free:
                return None
            slot = self._free.pop()
            self._taken.add(slot)
            return slot * self.slot_bytes

    def release(self, offsets: list[int]) -> None:
        """The client no longer holds these slots. Offsets of no taken slot are ignored."""
        with self._lock:
            for offset in offsets:
                slot, misaligned = divmod(offset, self.slot_bytes)
                if not misaligned and slot in self._taken:
                    self._taken.discard(slot)
                    self._free.append(slot)

    @property
    def free_slots(self) -> int:
        with self._lock:
            return len(self._free)

    def write(self, offset: int, parts: list) -> None:
        """Copies the parts (the message body, padding included) into the ring at `offset`."""
        position = offset
        for part in parts:
            if isinstance(part, np.ndarray):
                data = part.reshape(-1).view(np.uint8)
            else:
                data = np.frombuffer(part, np.uint8)
            self.array[position : position + data.nbytes] = data
            position += data.nbytes

    def close(self) -> None:
        os.close(self.fd)
        del self.array
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive somewhere: the mapping goes with it


class RingView:
    """The client's side: the ring mapped, regions handed out as arrays whose release (the last
    view of them freed) is reported through `on_release(offset)`."""

    def __init__(self, fd: int, size: int, on_release: Callable[[int], None]):
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        self._array = np.frombuffer(self._map, np.uint8)
        self._on_release = on_release

    def region(self, offset: int, size: int) -> np.ndarray:
        if offset < 0 or size < 0 or offset + size > self.size or offset % TF_ALIGNMENT:
            raise ValueError(f"a ring region [{offset}, {offset + size}) is outside the ring of {self.size} bytes")
        # A copy of the view object (not of the bytes): every array decoded from the region keeps
        # it alive, so its finalizer runs when the last of them is freed.
        region = self._array[offset : offset + size].view()
        weakref.finalize(region, self._on_release, offset)
        return region


def send_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    """Sends `data` with the descriptor `fd` attached (all of `data`)."""
    sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, np.array([fd], np.int32).tobytes())])
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def recv_fd_into(sock: socket.socket, view: memoryview) -> int | None:
    """Fills `view` from the socket; returns the descriptor that came with its first bytes, if any."""
    received, ancillary, _, _ = sock.recvmsg_into([view], socket.CMSG_SPACE(4))
    fd = None
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(data) >= 4:
            fds = np.frombuffer(data[: len(data) - len(data) % 4], np.int32).tolist()
            fd = fds[0]
            for extra in fds[1:]:
                os.close(extra)
    if received == 0:
        if fd is not None:
            os.close(fd)
        raise ConnectionError("the connection was closed by the peer")
    while received < len(view):
        count = sock.recv_into(view[received:])
        if not count:
            if fd is not None:
                os.close(fd)
            raise ConnectionError("the connection was closed by the peer")
        received += count
    return fd
