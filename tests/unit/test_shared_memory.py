"""Rings of shared memory: slots handed out and released, the descriptor passed over a real Unix
socket pair, and regions released when the last array viewing them is freed."""

import gc
import socket

import numpy as np
import pytest

from dataservice.transfer import shared_memory
from dataservice.transfer.chunk import TF_ALIGNMENT
from dataservice.worker import streaming

pytestmark = pytest.mark.skipif(not shared_memory.available(), reason="no memfd or descriptor passing here")

SLOT = 1 << 20


def test_slots_are_handed_out_until_none_is_free_and_reused_last_released_first():
    ring = shared_memory.Ring(4 * SLOT, SLOT)
    try:
        offsets = [ring.allocate(1000) for _ in range(4)]
        assert sorted(offsets) == [0, SLOT, 2 * SLOT, 3 * SLOT]
        assert ring.allocate(10) is None  # all taken: the caller sends through the socket
        ring.release([offsets[2], offsets[0]])
        assert ring.allocate(10) == offsets[0]  # the one released last, still in the caches
        assert ring.allocate(10) == offsets[2]
    finally:
        ring.close()


def test_bodies_larger_than_a_slot_and_unknown_releases_are_refused_quietly():
    ring = shared_memory.Ring(2 * SLOT, SLOT)
    try:
        assert ring.allocate(SLOT + 1) is None
        ring.release([12345, -64, 7 * SLOT])  # not a taken slot: ignored
        assert ring.free_slots == 2
        offset = ring.allocate(SLOT)
        ring.release([offset, offset])  # twice: freed once
        assert ring.free_slots == 2
    finally:
        ring.close()


def test_a_budget_bounds_the_rings_of_all_streams():
    budget = shared_memory.RingBudget(limit=3 * shared_memory.MIN_RING_BYTES)
    assert budget.take(2 * shared_memory.MIN_RING_BYTES) == 2 * shared_memory.MIN_RING_BYTES
    assert budget.take(2 * shared_memory.MIN_RING_BYTES) == shared_memory.MIN_RING_BYTES
    assert budget.take(shared_memory.MIN_RING_BYTES) == 0  # nothing left: that stream goes without
    budget.give_back(shared_memory.MIN_RING_BYTES)
    assert budget.totals()["ring_bytes"] == 2 * shared_memory.MIN_RING_BYTES


def test_the_ring_travels_over_a_unix_socket_and_regions_are_released_when_freed():
    ring = shared_memory.Ring(2 * SLOT, SLOT)
    worker, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    released = []
    try:
        shared_memory.send_fd(worker, b"hello", ring.fd)
        data = bytearray(5)
        fd = shared_memory.recv_fd_into(client, memoryview(data))
        assert data == b"hello" and fd is not None
        view = shared_memory.RingView(fd, ring.size, released.append)
        offset = ring.allocate(4096)
        ring.write(offset, [np.arange(512, dtype=np.int64)])
        region = view.region(offset, 4096)
        values = np.frombuffer(memoryview(region)[:4096], np.int64)
        assert values.tolist() == list(range(512))
        assert values.ctypes.data % TF_ALIGNMENT == 0
        del region
        gc.collect()
        assert released == []  # `values` still views it
        del values
        gc.collect()
        assert released == [offset]
        with pytest.raises(ValueError, match="outside the ring"):
            view.region(ring.size - 64, 128)
    finally:
        worker.close()
        client.close()
        ring.close()


def test_slots_grow_with_the_ring_so_large_messages_fit_and_small_rings_keep_several():
    mib = 1024 * 1024
    smallest = shared_memory.slot_bytes_for(shared_memory.MIN_RING_BYTES)
    largest = shared_memory.slot_bytes_for(shared_memory.MAX_RING_BYTES)
    # A stream of small elements asks for the smallest ring: it still holds several messages.
    assert shared_memory.MIN_RING_BYTES // smallest >= 3
    # One of 1 MiB elements (64 held, twice that in the ring) gets slots for the largest message.
    ring_for_large = shared_memory.ring_bytes_for(64, mib)
    assert shared_memory.slot_bytes_for(ring_for_large) >= streaming.MAX_BYTES_PER_MESSAGE
    assert ring_for_large // shared_memory.slot_bytes_for(ring_for_large) >= 4
    assert smallest <= shared_memory.slot_bytes_for(32 * mib) <= largest
    assert largest == shared_memory.MAX_SLOT_BYTES
