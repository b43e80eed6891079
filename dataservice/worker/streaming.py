"""One client's stream of a task's elements, whichever transfer carries it (gRPC or TCP).

The client's first request names the task and grants credits; later ones
grant more. The worker sends at most as many elements as granted, in
messages of up to max_elements_per_message elements and about
MAX_BYTES_PER_MESSAGE bytes (each message one chunk of the wire, whatever
chunks the task produced them in), and ends with end_of_sequence. A failure ends
the stream with status.ServiceError, which each transfer turns into its own status.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence

from google.protobuf.message import Message

from dataservice import status
from dataservice.config import default_memory_budget_bytes
from dataservice.rpc import peers
from dataservice.transfer import compression, local, tcp, wire
from dataservice.transfer.element_codec import ElementCodec
from dataservice.v1 import common_pb2, worker_pb2
from dataservice.worker.delivery import Deliveries, Delivery, SentMessage
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.round_robin import RoundPassedError
from dataservice.worker.task_book import TaskBook
from dataservice.worker.task_runner import TaskRunner

DEFAULT_MAX_ELEMENTS_PER_MESSAGE = 4096
# Large elements travel several to a message: each message costs both ends a few calls into
# Python and the client one chunk to hand to tf.data, whatever its size (README, "Figures
# behind the defaults"). A ring of shared memory holds messages of this size in slots of
# their own (shared_memory.slot_bytes_for).
MAX_BYTES_PER_MESSAGE = 16 * 1024 * 1024
# How long a stream for a task the worker has not heard of yet waits for it.
UNKNOWN_TASK_WAIT_S = 5.0
_TAKE_POLL_S = 0.5
# How long a stream waits for more elements before it sends a partial message (after
# the first, which goes out at once). The producer keeps filling the task's buffer
# meanwhile, so a slow pipeline loses no throughput, only up to this much latency;
# every message saved is one receive and one call into Python less on the client
# (README, "Figures behind the defaults").
LINGER_S = 0.02

# Coordinated reads: how long a GetElement waits for the other consumers before
# it answers not_ready (the client asks again).
ROUND_WAIT_S = 2.0
# Streams one iteration client may have open on one worker at once. A client reads each
# task with one stream (a retry may overlap the stream it replaces), and has one task per
# worker and iteration: anything near this is a client gone wrong, or hostile.
MAX_STREAMS_PER_CLIENT = 16
# A stream whose client sent no request (credits, acknowledgements) and took nothing the worker
# sent for this long is ended by its transfer, so that idle streams do not hold connection
# slots or server threads for good; a client still reading reconnects, and the worker sends
# again what it had not acknowledged (worker/delivery.py), so nothing is lost.
IDLE_STREAM_TIMEOUT_S = 300.0

# A response header and the buffers that follow it.
Response = tuple[Message, list[wire.BufferEntry]]


class TransferStats:
    """Elements and bytes sent, and streams open, per transfer protocol (for metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, list[int]] = {}
        self._open: dict[str, int] = {}

    def opened(self, protocol: str, delta: int = 1) -> None:
        with self._lock:
            self._open[protocol] = self._open.get(protocol, 0) + delta

    def sent(self, protocol: str, elements: int, buffers: Sequence[wire.BufferEntry]) -> None:
        nbytes = sum(wire.nbytes(b) for b in buffers)
        with self._lock:
            totals = self._sent.setdefault(protocol, [0, 0])
            totals[0] += elements
            totals[1] += nbytes

    def snapshot(self) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
        """({protocol: (elements, bytes) sent}, {protocol: streams open})."""
        with self._lock:
            return {p: (t[0], t[1]) for p, t in self._sent.items()}, dict(self._open)


@dataclasses.dataclass(frozen=True)
class StreamContext:
    """What serving a task's elements needs from its worker: its address (for messages), its
    tasks, how to report a task whose elements were all handed out (without waiting), where to
    count what was sent, what each client has not acknowledged yet, and the memory budget that
    bounds it (memory_budget.py)."""

    worker_address: str
    tasks: TaskBook
    report_finished: Callable[[int], None]
    transfer: TransferStats = dataclasses.field(default_factory=TransferStats)
    limiter: peers.KeyedLimiter = dataclasses.field(default_factory=lambda: peers.KeyedLimiter(MAX_STREAMS_PER_CLIENT))
    deliveries: Deliveries = dataclasses.field(default_factory=Deliveries)
    budget: MemoryBudget = dataclasses.field(default_factory=lambda: MemoryBudget(default_memory_budget_bytes()))

    def __post_init__(self) -> None:
        self.deliveries.count_into(self.budget.count_unacknowledged)


def pipeline_error(task_id: int, address: str, error: BaseException) -> str:
    message = getattr(error, "message", str(error))
    return f"the pipeline of task {task_id} failed on worker {address}: {type(error).__name__}: {message}"


def unknown_task_message(address: str, task_id: int) -> str:
    return f"worker {address} has no task {task_id} (yet)"


def stopped_message(task_id: int) -> str:
    return (
        f"task {task_id} was stopped by the dispatcher: its iteration ended, or the dispatcher "
        "restarted without fault_tolerant_mode and no longer knows it"
    )


def _problems(request: Message, non_negative: tuple[str, ...]) -> list[str]:
    """What is wrong in the fields every stream and round request has, and in `non_negative`."""
    problems = []
    if request.task_id <= 0:
        problems.append(f"task_id must be a positive task id, got {request.task_id}")
    problems += [
        f"{name} must not be negative, got {getattr(request, name)}"
        for name in ("iteration_client_id",) + non_negative
        if getattr(request, name) < 0
    ]
    if request.compression not in common_pb2.Compression.values():
        problems.append(f"compression {request.compression} is not a Compression value")
    return problems


def check_stream_request(request: worker_pb2.StreamElementsRequest) -> None:
    """Refuses a first request that no client of ours sends, before anything waits on it (a
    stream for a task the worker does not know yet waits UNKNOWN_TASK_WAIT_S for it)."""
    problems = _problems(request, ("max_elements_per_message", "credits", "shared_memory_bytes", "received"))
    if request.released_regions:
        problems.append("a stream's first request has no regions to release")
    if problems:
        raise status.invalid_argument("bad StreamElements request: " + "; ".join(problems))


def check_round_request(request: worker_pb2.GetElementRequest) -> None:
    """As check_stream_request, for a coordinated read's request."""
    problems = _problems(request, ("consumer_index", "round"))
    if problems:
        raise status.invalid_argument("bad GetElement request: " + "; ".join(problems))


def _check_read_key(worker: StreamContext, request: worker_pb2.StreamElementsRequest | worker_pb2.GetElementRequest):
    if not worker.tasks.may_read(request.task_id, request.iteration_client_id, request.read_key):
        raise status.permission_denied(
            f"worker {worker.worker_address}: task {request.task_id} belongs to an iteration this client did not "
            f"create or join, or iteration client {request.iteration_client_id} is not this client (its read key "
            "is wrong)"
        )


def stream_task(
    worker: StreamContext,
    request: worker_pb2.StreamElementsRequest,
    later_requests: Iterator[worker_pb2.StreamElementsRequest],
    is_active: Callable[[], bool],
    protocol: str = "grpc",
) -> Generator[Response, None, None]:
    """The responses (header and buffers) of the stream that `request` opens; `later_requests`
    (read on a thread of its own) grant more credits and acknowledge what arrived. A reconnecting
    client's stream first sends again what the client did not receive (delivery.py). `protocol`
    names the transfer for the worker's metrics. Raises status.ServiceError."""
    check_stream_request(request)
    runner = worker.tasks.wait_for(request.task_id, UNKNOWN_TASK_WAIT_S)
    if runner is None and not worker.tasks.is_finished(request.task_id):
        raise status.unavailable(unknown_task_message(worker.worker_address, request.task_id))
    _check_read_key(worker, request)
    client_id = request.iteration_client_id
    if not worker.limiter.acquire(client_id):
        raise status.error(
            status.Code.RESOURCE_EXHAUSTED,
            f"worker {worker.worker_address} serves {worker.limiter.limit} streams to iteration client {client_id} "
            "already (its limit of concurrent streams per client, MAX_STREAMS_PER_CLIENT): close streams first",
        )
    try:
        delivery, stream = worker.deliveries.attach(request.task_id, client_id, request.received)
    except status.ServiceError:
        worker.limiter.release(client_id)
        raise
    credits = _Credits(request.credits, delivery.acknowledge)
    threading.Thread(
        target=credits.read, args=(later_requests,), name=f"credits-{request.task_id}", daemon=True
    ).start()
    # Between processes of one host (a Unix socket, or memory) bandwidth is not short: never compress.
    same_host = protocol in (tcp.UNIX_PROTOCOL, local.PROTOCOL)
    compressor = compression.StreamCompressor(common_pb2.COMPRESSION_NONE if same_host else request.compression)
    sender = _Sender(worker, request, runner, delivery, credits, compressor, protocol)
    worker.transfer.opened(protocol)
    try:
        position = request.received
        last_sent = time.monotonic()
        while is_active() and delivery.is_current(stream) and not credits.closed:
            if time.monotonic() - last_sent >= wire.STREAM_KEEPALIVE_S:
                # Nothing to send for a while (a slow pipeline, no credits): the client hears
                # that this worker is alive (wire.STREAM_KEEPALIVE_S).
                yield worker_pb2.StreamElementsResponse(), []
                last_sent = time.monotonic()
            message = delivery.message_at(position)
            if message is None and (runner is None or delivery.ended):
                # Everything is sent; the end goes out once the client has acknowledged it all.
                if not delivery.wait_acknowledged(position, 0):
                    for response in sender.ask_to_acknowledge(position):
                        yield response
                        last_sent = time.monotonic()
                    if not delivery.wait_acknowledged(position, _TAKE_POLL_S):
                        continue
                yield worker_pb2.StreamElementsResponse(end_of_sequence=True), []
                return
            if message is None:
                # Recorded, then sent from the record at its turn: a stream this one replaced may
                # record a message of its own meanwhile, which goes first.
                if sender.take():
                    # No room until the client acknowledges what it holds, and a client that has
                    # granted every credit it has sends no request (with its acknowledgement) of
                    # its own: ask for one.
                    for response in sender.ask_to_acknowledge(position):
                        yield response
                        last_sent = time.monotonic()
                continue
            yield sender.encode(message)
            last_sent = time.monotonic()
            position = message.end
    finally:
        worker.transfer.opened(protocol, -1)
        worker.limiter.release(client_id)
        worker.deliveries.detach(delivery, stream)
        credits.close()


class _Sender:
    """What one stream sends: new elements taken from the task (recorded in the client's
    delivery before they go), messages encoded for this stream, and the request for an
    acknowledgement before the end."""

    def __init__(
        self,
        worker: StreamContext,
        request: worker_pb2.StreamElementsRequest,
        runner: TaskRunner | None,
        delivery: Delivery,
        credits: _Credits,
        compressor: compression.StreamCompressor,
        protocol: str,
    ):
        self._worker, self._request, self._runner = worker, request, runner
        self._delivery, self._credits, self._compressor, self._protocol = delivery, credits, compressor, protocol
        self._max_elements = request.max_elements_per_message or DEFAULT_MAX_ELEMENTS_PER_MESSAGE
        self._linger_s = 0.0  # the first message goes out at once: time to first element matters
        self._asked_at = -1
        # Whether the client was asked to acknowledge since the last message was recorded.
        self._acknowledgement_asked = False

    def take(self) -> bool:
        """Records a message of new elements in the delivery, unless there are no credits, no room,
        nothing produced yet, or the task is done (then the delivery has ended). Returns whether
        it found no room while the client holds unacknowledged elements. Raises
        status.ServiceError."""
        runner, task_id = self._runner, self._request.task_id
        assert runner is not None
        allowed = self._credits.wait(_TAKE_POLL_S)
        if not allowed and runner.done:
            allowed = 1  # nothing is left to send: the end needs no credits
        if not allowed:
            return False
        budget = self._worker.budget
        share = budget.unacknowledged_share(self._worker.deliveries.clients_of(task_id))
        # Without room, ask the client for its acknowledgement at once; once asked, wait.
        timeout_s = _TAKE_POLL_S if self._acknowledgement_asked else 0.0
        held = self._delivery.wait_for_room(timeout_s, share, lambda: budget.unacknowledged_left() > 0)
        if held < 0:
            asked, self._acknowledgement_asked = self._acknowledgement_asked, True
            return not asked
        # A message is cut to the room left (at least one element is sent, however large).
        max_bytes = min(MAX_BYTES_PER_MESSAGE, max(1, min(share - held, budget.unacknowledged_left())))
        try:
            chunks, done = runner.take(
                min(self._max_elements, allowed),
                max_bytes,
                _TAKE_POLL_S,
                self._linger_s,
                self._request.trainer_id,
            )
            self._linger_s = LINGER_S
        except Exception as e:  # noqa: BLE001 - the pipeline's own error, for the client
            message = pipeline_error(task_id, self._worker.worker_address, e)
            raise status.error(status.code_of(e), message) from None
        if chunks:
            self._delivery.record(chunks, _codec_of(runner))
            self._acknowledgement_asked = False
        if done:
            self._delivery.end()
            self._worker.report_finished(task_id)
        elif not chunks and runner.stopped:
            raise status.error(status.Code.CANCELLED, stopped_message(task_id))
        return False

    def encode(self, message: SentMessage) -> Response:
        self._credits.spend(message.count)
        chunk, buffers = message.codec.encode(list(message.chunks), self._compressor)
        response = worker_pb2.StreamElementsResponse(
            first_element=message.first,
            receipt=self._worker.tasks.receipt(self._request.task_id, message.end),
        )
        response.chunks.append(chunk)
        self._worker.transfer.sent(self._protocol, message.count, buffers)
        return response, buffers

    def ask_to_acknowledge(self, position: int) -> Iterator[Response]:
        """Asks the client, once, to acknowledge at once everything before `position`."""
        if self._asked_at != position:
            self._asked_at = position
            yield worker_pb2.StreamElementsResponse(acknowledge=True), []


def get_element(worker: StreamContext, request: worker_pb2.GetElementRequest) -> Response:
    """Coordinated reads: consumer `request.consumer_index`'s element of round `request.round`
    of the task, or not_ready when the other consumers have not asked for the round yet
    (within ROUND_WAIT_S), or end_of_sequence. Raises status.ServiceError."""
    check_round_request(request)
    runner = worker.tasks.wait_for(request.task_id, UNKNOWN_TASK_WAIT_S)
    _check_read_key(worker, request)
    if runner is None:
        if worker.tasks.is_finished(request.task_id):
            return worker_pb2.GetElementResponse(end_of_sequence=True), []
        raise status.unavailable(unknown_task_message(worker.worker_address, request.task_id))
    rounds = worker.tasks.round_robin(request.task_id)
    if rounds is None:
        raise status.failed_precondition(
            f"task {request.task_id} is not a coordinated-reads task: read it with StreamElements"
        )
    try:
        element, end = rounds.get(request.consumer_index, request.round, ROUND_WAIT_S, request.iteration_client_id)
    except RoundPassedError as e:
        raise status.failed_precondition(f"task {request.task_id}: {e}") from None
    except ValueError as e:
        raise status.invalid_argument(f"task {request.task_id}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the pipeline's own error, for the client
        raise status.error(status.code_of(e), pipeline_error(request.task_id, worker.worker_address, e)) from None
    if end:
        return worker_pb2.GetElementResponse(end_of_sequence=True), []
    if element is None:
        if runner.stopped:
            raise status.error(status.Code.CANCELLED, stopped_message(request.task_id))
        return worker_pb2.GetElementResponse(not_ready=True), []
    chunk, buffers = _codec_of(runner).encode([element], compression.StreamCompressor(request.compression))
    worker.transfer.sent("grpc", 1, buffers)
    return worker_pb2.GetElementResponse(chunk=chunk), buffers


def _codec_of(runner: TaskRunner) -> ElementCodec:
    """The codec of a task that produced elements: only a task whose dataset the worker refused
    has none, and it fails with the reason before producing any (worker_server.start_task)."""
    if runner.codec is None:
        raise status.error(status.Code.INTERNAL, f"task {runner.task_id} produced elements without a codec")
    return runner.codec


class _Credits:
    """How many more elements a client can take: granted by its requests, spent by responses."""

    def __init__(self, initial: int, on_received: Callable[[int], None]):
        self._available = max(0, initial)
        self._on_received = on_received
        self._closed = False
        self._cond = threading.Condition()

    def read(self, request_iterator) -> None:
        """Adds the credits of the client's later requests (runs until the stream ends)."""
        try:
            for request in request_iterator:
                if request.received:
                    self._on_received(request.received)
                with self._cond:
                    self._available += max(0, request.credits)
                    self._cond.notify_all()
        except ValueError:
            pass  # requests that broke off (the transfer's BadRequest): the sending side sees it too
        finally:
            self.close()

    def wait(self, timeout_s: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._available > 0 or self._closed, timeout_s)
            return self._available

    def spend(self, count: int) -> None:
        with self._cond:
            self._available -= count

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed
