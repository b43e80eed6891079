"""The "local" data transfer: a client reads the tasks of a worker that runs in its own
process through memory, with no socket (TensorFlow's local transfer protocol).

Each WorkerServer registers how it serves a task's stream under its address while it runs;
a client whose task is on a registered worker calls that directly: the worker's encoded
buffers reach the client as they are, uncompressed, and numeric components are decoded as
views of the worker's arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence

from google.protobuf.message import Message

from dataservice.v1 import common_pb2, worker_pb2

PROTOCOL = "local"

# (first request, later requests, is_active) -> (response header, buffers) until the stream ends;
# raises status.ServiceError.
Serve = Callable[
    [worker_pb2.StreamElementsRequest, Iterator[worker_pb2.StreamElementsRequest], Callable[[], bool]],
    Generator[tuple[Message, list], None, None],
]

_lock = threading.Lock()
_workers: dict[str, Serve] = {}


def register(worker_address: str, serve: Serve) -> None:
    with _lock:
        _workers[worker_address] = serve


def unregister(worker_address: str) -> None:
    with _lock:
        _workers.pop(worker_address, None)


def find(worker_address: str) -> Serve | None:
    """How to read the worker at `worker_address` through memory, if it runs in this process."""
    with _lock:
        return _workers.get(worker_address)


class BufferList:
    """The buffers of one response, taken in order (FrameBuffers' interface, without a frame).
    A buffer sent in parts (a column's values from several chunks) is joined here: the one copy
    the local transfer makes."""

    def __init__(self, buffers: Sequence) -> None:
        self._buffers = list(buffers)
        self._next = 0

    def take(self, size: int) -> memoryview:
        if self._next >= len(self._buffers):
            raise ValueError("a local response has fewer buffers than its chunks describe")
        buffer = self._buffers[self._next]
        self._next += 1
        if isinstance(buffer, list):  # wire.Contiguous: one buffer in parts
            buffer = buffer[0] if len(buffer) == 1 else b"".join(buffer)
        view = memoryview(buffer).cast("B")
        if view.nbytes != size:
            raise ValueError(f"a local buffer has {view.nbytes} bytes, its chunk says {size}")
        return view


def uncompressed(request: worker_pb2.StreamElementsRequest) -> worker_pb2.StreamElementsRequest:
    """The first request as the local transfer sends it: nothing to gain from compressing."""
    local = worker_pb2.StreamElementsRequest()
    local.CopyFrom(request)
    local.compression = common_pb2.COMPRESSION_NONE
    return local
