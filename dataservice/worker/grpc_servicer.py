"""The worker's gRPC service: a thin adapter over the worker's task streams (worker/streaming.py).

ProcessTask and PrepareDataset (called by the dispatcher) hand their request
to the worker; StreamElements and GetElement answer frames (transfer/wire.py)
built by the transport-free stream logic, whose status.ServiceError becomes
the call's gRPC status. A stream on which the client has sent nothing and
taken nothing for streaming.IDLE_STREAM_TIMEOUT_S is ended (IdleStreams, as
over TCP), so that a client that stops reading does not hold a server thread
for good.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from dataservice import status
from dataservice.rpc import errors
from dataservice.transfer import wire
from dataservice.v1 import common_pb2, worker_pb2
from dataservice.worker import streaming

# How long a stream told to end has to see it (it looks at least every streaming._TAKE_POLL_S).
_ENDING_GRACE_S = 5.0


@dataclasses.dataclass
class _OpenStream:
    context: grpc.ServicerContext
    last_active: float
    ending_since: float | None = None


class IdleStreams:
    """Ends the gRPC streams on which the client has sent no request (credits,
    acknowledgements) and taken no message for streaming.IDLE_STREAM_TIMEOUT_S, as the TCP
    transfer closes such a connection. gRPC buffers what a client does not read, so such a
    stream ends up waiting for acknowledgements (MAX_UNACKNOWLEDGED_BYTES) on a server thread.
    An idle stream is first told to end (its wait sees it within a poll, and the call ends
    without an end of sequence, which a client still there takes as a cue to reconnect, as
    from TCP); one still open _ENDING_GRACE_S later, held in a send, is cancelled. One thread
    watches, started with the first stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, _OpenStream] = {}
        self._ids = itertools.count()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.ended = 0  # streams found idle

    def opened(self, context: grpc.ServicerContext) -> int:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._watch, name="idle-streams", daemon=True)
                self._thread.start()
            stream = next(self._ids)
            self._streams[stream] = _OpenStream(context, time.monotonic())
        return stream

    def active(self, stream: int) -> None:
        """The client sent a request or took a message."""
        with self._lock:
            if stream in self._streams:
                self._streams[stream].last_active = time.monotonic()

    def is_open(self, stream: int) -> bool:
        """Whether the stream may go on: its call is active and it was not found idle."""
        with self._lock:
            entry = self._streams.get(stream)
            return entry is not None and entry.ending_since is None and entry.context.is_active()

    def closed(self, stream: int) -> None:
        with self._lock:
            self._streams.pop(stream, None)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stopped.wait(min(5.0, streaming.IDLE_STREAM_TIMEOUT_S / 4)):
            now = time.monotonic()
            stuck = []
            with self._lock:
                for stream, entry in list(self._streams.items()):
                    if entry.ending_since is not None and entry.ending_since < now - _ENDING_GRACE_S:
                        stuck.append(self._streams.pop(stream).context)
                    elif entry.ending_since is None and entry.last_active < now - streaming.IDLE_STREAM_TIMEOUT_S:
                        entry.ending_since = now
                        self.ended += 1
            for context in stuck:
                context.cancel()  # the blocked send fails, and gRPC closes the generator


class WorkerServicer:
    def __init__(
        self,
        streams: streaming.StreamContext,
        start_task: Callable[[common_pb2.TaskDef], None],
        prepare_dataset: Callable[[str], None],
    ):
        self._streams = streams
        self._start_task = start_task
        self._prepare_dataset = prepare_dataset
        self.idle_streams = IdleStreams()

    @errors.handler
    def ProcessTask(self, request, context):
        if not request.task.task_id:
            raise status.invalid_argument("ProcessTask needs a task with a task_id")
        self._start_task(request.task)
        return worker_pb2.ProcessTaskResponse()

    @errors.handler
    def PrepareDataset(self, request, context):
        if not request.dataset_id:
            raise status.invalid_argument("PrepareDataset needs a dataset_id")
        self._prepare_dataset(request.dataset_id)
        return worker_pb2.PrepareDatasetResponse()

    def StreamElements(self, request_iterator, context):
        request = next(request_iterator, None)
        if request is None:
            return
        stream = self.idle_streams.opened(context)
        later = _until_broken(request_iterator, lambda: self.idle_streams.active(stream))
        try:
            is_open = functools.partial(self.idle_streams.is_open, stream)
            for header, buffers in streaming.stream_task(self._streams, request, later, is_open):
                yield wire.frame(header, buffers)
                if header.ByteSize():  # not a keepalive: those go out to an idle client too
                    self.idle_streams.active(stream)
        except status.ServiceError as e:
            context.abort(errors.grpc_code(e.code), e.message)
        finally:
            self.idle_streams.closed(stream)

    def GetElement(self, request, context):
        try:
            header, buffers = streaming.get_element(self._streams, request)
        except status.ServiceError as e:
            context.abort(errors.grpc_code(e.code), e.message)
        return wire.frame(header, buffers)


def _until_broken(
    requests: Iterator[worker_pb2.StreamElementsRequest], received: Callable[[], None]
) -> Iterator[worker_pb2.StreamElementsRequest]:
    """The client's later requests (each reported to `received`) until the call ends, cancelled
    or broken (gRPC raises then): the transport-free stream logic sees an end, as from the
    other transfers."""
    try:
        for request in requests:
            received()
            yield request
    except grpc.RpcError:
        return
