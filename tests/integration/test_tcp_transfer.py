"""The worker's TCP data transfer next to gRPC: the same elements and errors either way,
workers that offer only gRPC, and what a stranger on the data port cannot do."""

from __future__ import annotations

import socket
import struct
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from conftest import connect_from

import dataservice as service
from dataservice.rpc import channels, errors
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import local, tcp
from dataservice.v1 import common_pb2, dispatcher_pb2, worker_pb2
from dataservice.worker import streaming, tcp_server

pytestmark = pytest.mark.timeout(120)


def _registered_transfer_addresses(cluster) -> dict:
    """worker address -> transfer address, as the dispatcher knows them."""
    with DispatcherClient(cluster.address, timeout_s=10) as dispatcher:
        return {w.address: w.transfer_address for w in dispatcher.get_workers()}


def _mixed_elements() -> tf.data.Dataset:
    """Varying shapes, strings and a nested structure: elements that travel one a chunk."""
    return tf.data.Dataset.range(200).map(
        lambda x: {"id": x, "words": tf.fill([x % 5], tf.strings.as_string(x)), "vec": tf.range(x % 7)}
    )


def _as_lists(dataset: tf.data.Dataset) -> list:
    return [{k: v.tolist() for k, v in e.items()} for e in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("protocol", [None, "tcp", "grpc"])
def test_every_protocol_reads_the_same_elements(cluster, protocol):
    read = _mixed_elements().apply(
        service.distribute("parallel_epochs", cluster.target, data_transfer_protocol=protocol)
    )
    assert _as_lists(read) == _as_lists(_mixed_elements())


def test_large_elements_arrive_intact_over_tcp(cluster):
    source = tf.data.Dataset.range(5).map(lambda i: tf.random.stateless_uniform([3 * 256 * 1024], seed=[i, 7]))
    read = list(source.apply(service.distribute("parallel_epochs", cluster.target)).as_numpy_iterator())
    expected = list(source.as_numpy_iterator())
    assert len(read) == 5
    for got, want in zip(read, expected):
        np.testing.assert_array_equal(got, want)


def test_workers_offer_tcp_by_default_and_grpc_only_workers_are_read_over_grpc(cluster):
    grpc_only = cluster.add_worker(data_transfer_protocol="grpc")
    tcp_worker = cluster.workers[0]
    assert tcp_worker.transfer_address.startswith("tcp://localhost:")
    assert grpc_only.transfer_address == grpc_only.address
    registered = _registered_transfer_addresses(cluster)
    assert registered == {tcp_worker.address: tcp_worker.transfer_address, grpc_only.address: grpc_only.address}
    # parallel_epochs: each worker sends the whole dataset, one over TCP, the other over gRPC.
    read = tf.data.Dataset.range(50).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(read.as_numpy_iterator()) == sorted(list(range(50)) * 2)


def test_a_pipeline_error_arrives_over_tcp_with_its_code(cluster):
    source = tf.data.Dataset.from_tensor_slices(["1", "not a number"]).map(tf.strings.to_number)
    read = source.apply(service.distribute("parallel_epochs", cluster.target, data_transfer_protocol="tcp"))
    with pytest.raises(tf.errors.OpError, match="(?s)InvalidArgumentError.*failed on worker.*not a number"):
        list(read.as_numpy_iterator())


def test_an_unknown_task_is_unavailable_over_tcp(cluster):
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    with tcp.connect(address, 10) as sock:
        tcp.send_request(sock, worker_pb2.StreamElementsRequest(task_id=424242, credits=1))
        response, _ = tcp.recv_response(sock)
    assert errors.status_code(response.error_code) == grpc.StatusCode.UNAVAILABLE
    assert "no task 424242" in response.error_message


@pytest.mark.parametrize(
    "request_fields, wording",
    [
        ({}, "task_id must be a positive task id, got 0"),
        ({"task_id": -3, "credits": 1}, "task_id must be a positive"),
        ({"task_id": 424242, "credits": -1}, "credits must not be negative"),
        ({"task_id": 424242, "max_elements_per_message": -5}, "max_elements_per_message must not be negative"),
        ({"task_id": 424242, "shared_memory_bytes": -1}, "shared_memory_bytes must not be negative"),
        ({"task_id": 424242, "iteration_client_id": -1}, "iteration_client_id must not be negative"),
        ({"task_id": 424242, "compression": 77}, "compression 77 is not a Compression value"),
        ({"task_id": 424242, "released_regions": [0]}, "no regions to release"),
    ],
)
def test_a_request_no_client_sends_is_refused_before_waiting_for_its_task(cluster, request_fields, wording):
    """INVALID_ARGUMENT naming the field, not UNAVAILABLE after waiting for an unknown task."""
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    with tcp.connect(address, 10) as sock:
        tcp.send_request(sock, worker_pb2.StreamElementsRequest(**request_fields))
        response, _ = tcp.recv_response(sock)
    assert errors.status_code(response.error_code) == grpc.StatusCode.INVALID_ARGUMENT, response.error_message
    assert wording in response.error_message


@pytest.mark.parametrize(
    "garbage, code, wording",
    [
        # a request size over the limit: refused before anything is read or allocated for it
        (struct.pack("<I", 2**31) + b"huge", grpc.StatusCode.RESOURCE_EXHAUSTED, "MAX_REQUEST_BYTES"),
        (struct.pack("<I", 2**32 - 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "4,294,967,295 bytes"),
        # bytes that are no StreamElementsRequest
        (struct.pack("<I", 4) + b"\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "not a StreamElementsRequest"),
        (b"\x01", None, None),  # a connection closed mid-request: no answer
    ],
)
def test_garbage_on_the_data_port_closes_that_connection_only(cluster, garbage, code, wording):
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    with tcp.connect(address, 10) as sock:
        sock.settimeout(10)
        sock.sendall(garbage)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the worker answered an oversized header and closed before the rest was read
        if code is None:
            try:
                assert sock.recv(1) == b""  # the worker hung up, without an answer
            except (ConnectionResetError, OSError) as e:
                assert not isinstance(e, socket.timeout)  # it hung up with the garbage unread
        else:
            response, _ = tcp.recv_response(sock)
            assert errors.status_code(response.error_code) == code and wording in response.error_message
            assert sock.recv(1) == b""  # and then hung up
    read = tf.data.Dataset.range(20).apply(service.distribute("parallel_epochs", cluster.target))
    assert list(read.as_numpy_iterator()) == list(range(20))


def test_worker_config_checks_its_transfer_fields():
    config = service.WorkerConfig(dispatcher_address="localhost:1", worker_address="10.0.0.5:%port%")
    assert config.data_transfer_protocol == "tcp" and config.data_transfer_address == "10.0.0.5:%dts_port%"
    with pytest.raises(ValueError, match="data_transfer_protocol"):
        service.WorkerConfig(dispatcher_address="localhost:1", data_transfer_protocol="udp")
    with pytest.raises(ValueError, match="port"):
        service.WorkerConfig(dispatcher_address="localhost:1", data_transfer_port=70000)
    with pytest.raises(ValueError, match="data_transfer_address"):
        service.WorkerConfig(dispatcher_address="localhost:1", data_transfer_address="no-port")


def _iterations(cluster, count: int, dataset: tf.data.Dataset | None = None) -> list[tuple[int, int, str]]:
    """`count` iterations of `dataset` (range(10**7)) made as a client makes them: (task id,
    client id, read key)."""
    dataset = tf.data.Dataset.range(10**7) if dataset is None else dataset
    dataset_id = service.register_dataset(cluster.target, dataset).numpy().decode()
    made = []
    with DispatcherClient(cluster.address, 10) as client:
        for _ in range(count):
            job_id = client.get_or_create_job(
                dispatcher_pb2.GetOrCreateJobRequest(
                    dataset_id=dataset_id,
                    processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_OFF),
                )
            )
            iteration = client.get_or_create_iteration(job_id, 0)
            (task,) = client.client_heartbeat(iteration.iteration_client_id, read_key=iteration.read_key).tasks
            made.append((task.task_id, iteration.iteration_client_id, iteration.read_key))
    return made


def _ends_without_elements(sock: socket.socket, messages: int = 20) -> bool:
    """Whether the worker ends the connection, sending nothing but keepalives (empty messages)
    first; False if it goes on, or falls silent (the socket's timeout)."""
    for _ in range(messages):
        try:
            response, _ = tcp.recv_response(sock)
        except TimeoutError:
            return False
        except OSError:
            return True
        assert not response.chunks, "a replaced stream sent elements"
    return False


def test_a_client_holds_one_stream_per_task_under_its_own_id_only(cluster):
    """A client id holds one stream per task (a new one replaces it, as a reconnect does), and a
    stream is served only to the client the dispatcher gave the id to: an id made up, or another
    client's id with this client's key, is PERMISSION_DENIED (so the per-client stream limit,
    MAX_STREAMS_PER_CLIENT, counts ids the dispatcher issued, not ones a client chooses)."""
    (task, client, key), (other_task, other_client, other_key) = _iterations(cluster, 2)
    address = tcp.transfer_address(cluster.workers[0].transfer_address)

    def open_stream(task_id: int, client_id: int, read_key: str, credits: int = 0) -> socket.socket:
        sock = tcp.connect(address, 10)
        sock.settimeout(10)
        # Without credits the stream stays open, sending nothing.
        request = worker_pb2.StreamElementsRequest(
            task_id=task_id, iteration_client_id=client_id, credits=credits, read_key=read_key
        )
        tcp.send_request(sock, request)
        return sock

    replaced = open_stream(task, client, key, credits=1)
    assert tcp.recv_response(replaced)[0].chunks  # attached first: the next one replaces it
    current = open_stream(task, client, key)
    try:
        # The worker ends the stream the new one replaces (after keepalives, if it sent any first).
        assert _ends_without_elements(replaced)
        for task_id, client_id, read_key in (
            (task, client + 1000, key),  # an id of the attacker's making
            (task, other_client, key),  # another client's id
            (other_task, other_client, key),  # another client's task and id, this client's key
        ):
            with open_stream(task_id, client_id, read_key, credits=1) as forged:
                response, _ = tcp.recv_response(forged)
            assert errors.status_code(response.error_code) == grpc.StatusCode.PERMISSION_DENIED
            assert "read key is wrong" in response.error_message
        with open_stream(other_task, other_client, other_key, credits=1) as own:
            response, _ = tcp.recv_response(own)
        assert not response.error_code and response.chunks
    finally:
        replaced.close()
        current.close()


def test_an_idle_stream_is_closed(cluster, monkeypatch):
    """An authenticated stream on which the client sends nothing more (no credits, no
    acknowledgements) is closed after streaming.IDLE_STREAM_TIMEOUT_S, freeing its slot; a reader that
    is still there reconnects and the worker sends again what it had not acknowledged."""
    monkeypatch.setattr(streaming, "IDLE_STREAM_TIMEOUT_S", 1.0)
    ((task_id, client_id, read_key),) = _iterations(cluster, 1)
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    with tcp.connect(address, 10) as sock:
        request = worker_pb2.StreamElementsRequest(
            task_id=task_id,
            iteration_client_id=client_id,
            credits=1,
            read_key=read_key,
        )
        tcp.send_request(sock, request)
        response, _ = tcp.recv_response(sock)
        assert response.chunks and not response.error_message
        sock.settimeout(10)
        started = time.monotonic()
        with pytest.raises((ConnectionError, OSError, EOFError)):
            while True:  # what else the worker sends, until it closes the idle stream
                tcp.recv_response(sock)
        assert time.monotonic() - started < 8, "the idle stream was kept open"


def test_a_grpc_stream_whose_client_stops_reading_is_ended(cluster, monkeypatch):
    """The gRPC transfer's idle limit: a client that takes one message of 2 MiB elements and
    then stops reading and acknowledging (the worker's stream waits for acknowledgements on one
    of the server's threads) has its stream ended after streaming.IDLE_STREAM_TIMEOUT_S: what
    gRPC had buffered for it it still reads, then the end of the call, without an end of
    sequence (a reader still there reconnects, as over TCP)."""
    monkeypatch.setattr(streaming, "IDLE_STREAM_TIMEOUT_S", 1.0)
    large = tf.data.Dataset.range(10**6).map(lambda x: tf.fill([2**18], x))
    ((task_id, client_id, read_key),) = _iterations(cluster, 1, large)
    # Responses are frames (transfer/wire.py), taken here as bytes.
    stream_elements = channels.make_channel(cluster.workers[0].address).stream_stream(
        "/dataservice.v1.WorkerService/StreamElements",
        request_serializer=worker_pb2.StreamElementsRequest.SerializeToString,
    )
    request = worker_pb2.StreamElementsRequest(
        task_id=task_id, iteration_client_id=client_id, read_key=read_key, credits=1_000
    )
    done = threading.Event()

    def requests():  # the first request, and the request stream kept open (as a reader does)
        yield request
        done.wait(60)

    stream = stream_elements(requests(), timeout=30)
    try:
        assert next(stream)
        time.sleep(8)  # the watch looks every few seconds
        responses = list(stream)  # DEADLINE_EXCEEDED (30 s) if the stream is kept open
        assert 0 < len(responses) < 1_000
    finally:
        done.set()
        stream.cancel()


def test_a_reader_paused_past_the_idle_limit_reads_on_over_grpc(cluster, monkeypatch):
    """A trainer that stops reading for longer than the idle limit (an evaluation, a
    checkpoint) has its gRPC stream ended under it, reconnects when it reads again, and gets
    every element once."""
    monkeypatch.setattr(streaming, "IDLE_STREAM_TIMEOUT_S", 1.0)
    worker = cluster.workers[0]
    idle_streams = worker._servicer.idle_streams  # what the worker saw
    ended_before = idle_streams.ended
    # The client reads over gRPC as from a worker in another process, not through memory.
    serve = local.find(worker.address)
    local.unregister(worker.address)
    try:
        # A client that buffers 4 elements: its stream is open, without credits, in the pause.
        dataset = tf.data.Dataset.range(1_000).apply(
            service.distribute(
                "distributed_epoch", cluster.target, data_transfer_protocol="grpc", max_outstanding_requests=4
            )
        )
        iterator = iter(dataset)
        read = [int(next(iterator)) for _ in range(10)]
        time.sleep(8)
        assert idle_streams.ended > ended_before, "no stream was found idle"
        read.extend(int(x) for x in iterator)
        assert sorted(read) == list(range(1_000))
    finally:
        local.register(worker.address, serve)


def test_connections_without_a_request_take_no_stream_slot_and_are_closed(cluster, monkeypatch):
    """The attack: connect and send nothing, as many times as there are stream slots. Such
    connections take a slot only once authenticated, and are closed after FIRST_REQUEST_TIMEOUT_S."""
    monkeypatch.setattr(tcp_server, "MAX_STREAMS", 4)
    monkeypatch.setattr(tcp_server, "FIRST_REQUEST_TIMEOUT_S", 0.5)
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    idle = [tcp.connect(address, 10) for _ in range(8)]
    try:
        with tcp.connect(address, 10) as sock:
            tcp.send_request(sock, worker_pb2.StreamElementsRequest(task_id=424242, credits=1))
            response, _ = tcp.recv_response(sock)
        # It reached the stream logic (an unknown task), not "serves 4 data streams already".
        assert "no task 424242" in response.error_message, response.error_message
        for sock in idle:
            sock.settimeout(10)
            assert sock.recv(1) == b"", "an idle connection was kept open"
    finally:
        for sock in idle:
            sock.close()


def test_one_peer_takes_at_most_its_share_of_pending_connections_and_streams(cluster, monkeypatch):
    """The attack from one host: connections that never authenticate, then streams held open
    with no credits. Past its share (MAX_PENDING_PER_PEER, MAX_STREAMS_PER_PEER) that host is
    told to retry later, while another host (another loopback address) is served."""
    monkeypatch.setattr(tcp_server, "MAX_PENDING_PER_PEER", 3)
    monkeypatch.setattr(tcp_server, "MAX_STREAMS_PER_PEER", 2)
    address = tcp.transfer_address(cluster.workers[0].transfer_address)
    attacker, other = "127.0.0.2", "127.0.0.1"

    def first_answer(source: str, request: worker_pb2.StreamElementsRequest) -> worker_pb2.StreamElementsResponse:
        with connect_from(source, address) as sock:
            tcp.send_request(sock, request)
            response, _ = tcp.recv_response(sock)
        return response

    unknown_task = worker_pb2.StreamElementsRequest(task_id=424242, credits=1)
    silent = [connect_from(attacker, address) for _ in range(3)]
    try:
        refused = first_answer(attacker, unknown_task)
        assert errors.status_code(refused.error_code) == grpc.StatusCode.UNAVAILABLE
        assert "from 127.0.0.2 waiting for their first request" in refused.error_message
        assert "no task 424242" in first_answer(other, unknown_task).error_message
    finally:
        for sock in silent:
            sock.close()

    # The streams come from a third host: the server may not have seen the silent connections
    # above close yet, and they must not count against this part.
    attacker = "127.0.0.3"
    iterations = _iterations(cluster, 4)
    held = []
    try:
        for task_id, client_id, read_key in iterations[:2]:
            sock = connect_from(attacker, address)
            held.append(sock)
            tcp.send_request(
                sock,
                worker_pb2.StreamElementsRequest(
                    task_id=task_id, iteration_client_id=client_id, read_key=read_key, credits=1
                ),
            )
            # One element, then no more credits: the stream is served (holds its slot) and waits.
            first, _ = tcp.recv_response(sock)
            assert first.chunks and not first.error_message, first
        task_id, client_id, read_key = iterations[2]
        third = worker_pb2.StreamElementsRequest(
            task_id=task_id, iteration_client_id=client_id, read_key=read_key, credits=1
        )
        refused = first_answer(attacker, third)
        assert errors.status_code(refused.error_code) == grpc.StatusCode.UNAVAILABLE, refused
        assert "to 127.0.0.3 already, the most one host may have" in refused.error_message
        task_id, client_id, read_key = iterations[3]
        served = first_answer(
            other,
            worker_pb2.StreamElementsRequest(
                task_id=task_id, iteration_client_id=client_id, read_key=read_key, credits=1
            ),
        )
        assert served.chunks and not served.error_message
    finally:
        for sock in held:
            sock.close()
