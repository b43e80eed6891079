"""What a worker keeps of what it sent until the client acknowledges it (worker/delivery.py), and
the stream that sends it again to a reconnecting client (worker/streaming.py), driven directly:
requests in, responses out, no sockets."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import tensorflow as tf

from dataservice import status
from dataservice.transfer import local
from dataservice.transfer.element_codec import ElementCodec
from dataservice.v1 import worker_pb2
from dataservice.worker import delivery as delivery_lib
from dataservice.worker import streaming
from dataservice.worker.chunk_iterator import ChunkIterator
from dataservice.worker.delivery import Deliveries, Delivery
from dataservice.worker.task_book import TaskBook
from dataservice.worker.task_runner import TaskRunner
from dataservice.worker.worker_state import TaskFinished

pytestmark = pytest.mark.timeout(60)

TASK = 7
CLIENT = 3


def test_acknowledged_messages_are_forgotten_and_the_rest_can_be_found_again():
    codec = ElementCodec(tf.TensorSpec([], tf.int64))
    delivery = Delivery(now=0.0)
    stream = delivery.attach(0)
    first = delivery.record([_chunk(codec, 0, 3)], codec)
    second = delivery.record([_chunk(codec, 3, 5)], codec)
    assert (first.first, first.count, second.first, second.count) == (0, 3, 3, 2)
    assert delivery.message_at(3) is second and delivery.message_at(1) is None
    delivery.acknowledge(3)
    assert delivery.message_at(0) is None and delivery.message_at(3) is second
    assert delivery.unacknowledged_bytes() == second.nbytes
    delivery.acknowledge(100)  # more than was sent counts as everything
    assert delivery.unacknowledged_bytes() == 0 and delivery.wait_acknowledged(5, 0)
    assert delivery.is_current(stream)
    assert delivery.attach(5) != stream and not delivery.is_current(stream)


def test_a_client_cannot_claim_what_it_was_never_sent_or_take_back_an_acknowledgement():
    codec = ElementCodec(tf.TensorSpec([], tf.int64))
    deliveries = Deliveries()
    delivery, _ = deliveries.attach(TASK, CLIENT, 0)
    delivery.record([_chunk(codec, 0, 4)], codec)
    with pytest.raises(status.ServiceError) as raised:
        deliveries.attach(TASK, CLIENT, 5)
    assert raised.value.code == status.Code.INVALID_ARGUMENT and "sent 4" in raised.value.message
    delivery.acknowledge(4)
    with pytest.raises(status.ServiceError) as raised:
        deliveries.attach(TASK, CLIENT, 2)
    assert raised.value.code == status.Code.INVALID_ARGUMENT
    delivery.record([_chunk(codec, 4, 8)], codec)
    with pytest.raises(status.ServiceError) as raised:
        deliveries.attach(TASK, CLIENT, 6)
    assert raised.value.code == status.Code.INVALID_ARGUMENT and "ends no message" in raised.value.message
    with pytest.raises(status.ServiceError) as raised:
        deliveries.attach(TASK, CLIENT + 1, 2)  # no record: what it missed cannot be sent again
    assert raised.value.code == status.Code.DATA_LOSS and "no longer knows" in raised.value.message


def test_records_expire_only_when_no_stream_has_used_them_for_retain_s(monkeypatch):
    deliveries = Deliveries()
    delivery, stream = deliveries.attach(TASK, CLIENT, 0)
    deliveries.attach(TASK + 1, CLIENT, 0)
    monkeypatch.setattr(delivery_lib, "RETAIN_S", 0.0)
    deliveries.expire()
    assert len(deliveries) == 2, "attached records never expire"
    deliveries.detach(delivery, stream)
    time.sleep(0.01)
    deliveries.expire()
    assert len(deliveries) == 1
    deliveries.forget_task(TASK + 1)
    assert len(deliveries) == 0


class _Client:
    """One connection of a client, as the reader makes it: requests go in through a queue."""

    def __init__(self, context: streaming.StreamContext, received: int, credits: int):
        self.requests: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        first = worker_pb2.StreamElementsRequest(
            task_id=TASK, iteration_client_id=CLIENT, credits=credits, received=received, max_elements_per_message=4
        )
        self.responses = streaming.stream_task(context, first, self._later(), lambda: not self._closed.is_set())

    def _later(self):
        while not self._closed.is_set():
            try:
                request = self.requests.get(timeout=0.1)
            except queue.Empty:
                continue
            yield request

    def next_values(self, codec: ElementCodec) -> tuple[worker_pb2.StreamElementsResponse, list[int]]:
        response, buffers = next(self.responses)
        values = []
        for proto in response.chunks:
            chunk = codec.decode(proto, local.BufferList(buffers))
            values += [int(v) for v in chunk.columns[0].values.reshape(-1)]
        return response, values

    def cut(self) -> None:
        """The connection breaks: the worker's side of the stream ends where it is."""
        self._closed.set()
        self.responses.close()


def _context(elements: int) -> tuple[streaming.StreamContext, ElementCodec]:
    dataset = tf.data.Dataset.range(elements)
    codec = ElementCodec(dataset.element_spec)
    tasks = TaskBook()
    tasks.add(TASK, lambda: (TaskRunner(TASK, lambda: ChunkIterator.over(dataset, codec, max_chunk=4), codec), None))
    finished = []

    def report_finished(task_id: int) -> None:
        finished.append(task_id)
        tasks.handle(TaskFinished(task_id, at=0.0))

    return streaming.StreamContext("worker:1", tasks, report_finished), codec


def test_a_reconnecting_client_gets_again_exactly_what_it_missed_then_the_end():
    context, codec = _context(40)
    first = _Client(context, received=0, credits=40)
    got: list[int] = []
    while len(got) < 12:
        response, values = first.next_values(codec)
        assert response.first_element == len(got)
        got += values
    # Two more messages go out and are lost with the connection.
    lost = first.next_values(codec)[1] + first.next_values(codec)[1]
    assert lost and lost[0] == len(got)
    first.cut()
    second = _Client(context, received=len(got), credits=40 - len(got))
    while True:
        response, values = second.next_values(codec)
        if response.acknowledge:
            second.requests.put(worker_pb2.StreamElementsRequest(received=len(got)))
            continue
        if response.end_of_sequence:
            break
        assert response.first_element == len(got), "a message out of place"
        got += values
    assert got == list(range(40))
    assert context.tasks.is_finished(TASK)


def test_the_end_waits_for_the_acknowledgement_and_a_reconnect_after_it_gets_the_end_alone():
    context, codec = _context(6)
    client = _Client(context, received=0, credits=10)
    messages: list[list[int]] = []
    while sum(map(len, messages)) < 6:
        messages.append(client.next_values(codec)[1])
    assert len(messages) >= 2, "the task's chunks grow from one element"
    response, _ = client.next_values(codec)
    assert response.acknowledge and not response.end_of_sequence and not response.chunks
    client.cut()  # the client never acknowledged: what it was sent is kept
    received = 6 - len(messages[-1])
    again = _Client(context, received=received, credits=10)
    response, values = again.next_values(codec)
    assert (response.first_element, values) == (received, messages[-1])
    assert again.next_values(codec)[0].acknowledge
    again.requests.put(worker_pb2.StreamElementsRequest(received=6))
    assert again.next_values(codec)[0].end_of_sequence
    last = _Client(context, received=6, credits=10)
    response, values = last.next_values(codec)
    assert response.end_of_sequence and not values


def _chunk(codec: ElementCodec, start: int, stop: int):
    return codec.batch_chunk([tf.range(start, stop, dtype=tf.int64)])
