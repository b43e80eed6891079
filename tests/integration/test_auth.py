"""The shared auth token: every dispatcher and worker RPC and every TCP data stream needs it;
a missing or wrong one is UNAUTHENTICATED, naming the server; health checks need none."""

from __future__ import annotations

import logging

import grpc
import psutil
import pytest
import tensorflow as tf
from conftest import wait_for_workers
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dataservice
from dataservice import errors
from dataservice.local_cluster import LocalCluster
from dataservice.rpc import auth
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import grpc_service, tcp
from dataservice.v1 import dispatcher_pb2, dispatcher_pb2_grpc, worker_pb2

TOKEN = "s3cret-token-9f8e7d"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture
def secured(token_file, monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    monkeypatch.delenv(auth.TOKEN_FILE_ENV, raising=False)
    options = {"auth_token_file": token_file}
    with LocalCluster(
        1, processes=False, dispatcher_options=options, worker_options={**options, "heartbeat_interval_ms": 200}
    ) as cluster:
        yield cluster


def test_missing_and_wrong_tokens_are_unauthenticated_naming_the_server(secured, caplog):
    caplog.set_level(logging.DEBUG)
    address = secured.address
    with DispatcherClient(address, 5) as anonymous:
        with pytest.raises(errors.UnauthenticatedError) as raised:
            anonymous.get_workers()
    assert f"the dispatcher at {address} requires an auth token and none was sent" in raised.value.message
    assert auth.TOKEN_ENV in raised.value.message
    with DispatcherClient(address, 5, auth_token="wrong") as wrong:
        with pytest.raises(errors.UnauthenticatedError, match=f"the auth token sent to the dispatcher at {address}"):
            wrong.get_workers()
    with DispatcherClient(address, 5, auth_token=TOKEN) as right:
        assert len(right.get_workers()) == 1
    # Straight to the worker's gRPC port, and raw calls without any client code.
    worker = secured.workers[0]
    with grpc.insecure_channel(worker.address) as channel:
        stream = grpc_service.WorkerDataStub(channel).StreamElements(
            iter([worker_pb2.StreamElementsRequest(task_id=1)])
        )
        with pytest.raises(grpc.RpcError) as raw:
            next(iter(stream))
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED and f"worker {worker.address}" in raw.value.details()
        # Health needs no token (Kubernetes probes send none).
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as raw:
            dispatcher_pb2_grpc.DispatcherServiceStub(channel).GetStatus(dispatcher_pb2.GetStatusRequest(), timeout=5)
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not any(TOKEN in record.getMessage() for record in caplog.records)


def test_tcp_streams_need_the_token(secured, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    iterator = iter(tf.data.Dataset.range(10**6).apply(dataservice.distribute("parallel_epochs", secured.target)))
    next(iterator)  # a task exists and is being read
    transfer = tcp.transfer_address(secured.workers[0].transfer_address)
    for sent, wording in (("", "none was sent"), ("wrong", "is wrong")):
        sock = tcp.connect(transfer, 5)
        try:
            tcp.send_request(sock, worker_pb2.StreamElementsRequest(task_id=1, credits=10, auth_token=sent))
            response, _ = tcp.recv_response(sock)
        finally:
            sock.close()
        assert response.error_code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert wording in response.error_message and not response.chunks
    del iterator


@pytest.mark.parametrize("protocol", ["tcp", "grpc"])
def test_clients_with_the_token_read_as_usual(secured, monkeypatch, token_file, protocol):
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, token_file)
    dataset = tf.data.Dataset.range(100).apply(
        dataservice.distribute("distributed_epoch", secured.target, data_transfer_protocol=protocol)
    )
    assert sorted(dataset.as_numpy_iterator()) == list(range(100))


def test_a_client_without_the_token_fails_at_once(secured):
    with pytest.raises(tf.errors.UnauthenticatedError, match="requires an auth token"):
        dataservice.register_dataset(secured.target, tf.data.Dataset.range(3))


def test_processes_with_a_token(processes, token_file, monkeypatch):
    dispatcher = processes("--role=dispatcher", "--port=0", f"--auth_token_file={token_file}")
    worker = processes(
        "--role=worker", "--port=0", f"--dispatcher_address={dispatcher.address}", f"--auth_token_file={token_file}"
    )
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    wait_for_workers(dispatcher.address, 1)
    dataset = tf.data.Dataset.range(50).apply(dataservice.distribute("parallel_epochs", f"grpc://{dispatcher.address}"))
    assert sorted(dataset.as_numpy_iterator()) == list(range(50))
    # A worker with another token cannot register.
    other = token_file + ".other"
    with open(other, "w") as f:
        f.write("another-token")
    with pytest.raises(RuntimeError, match="auth token sent to the dispatcher"):
        processes(
            "--role=worker",
            "--port=0",
            f"--dispatcher_address={dispatcher.address}",
            f"--auth_token_file={other}",
            "--dispatcher_timeout_ms=3000",
        )
    assert not any(TOKEN in line for line in dispatcher.stderr_lines + worker.stderr_lines)
    _an_unauthenticated_large_request_is_not_read(dispatcher)


# What the refusal of an unauthenticated request may add to the server's memory: a request is
# refused before it is read, so only gRPC's flow-control window of it arrives.
UNAUTHENTICATED_GROWTH_LIMIT_MIB = 40


def _an_unauthenticated_large_request_is_not_read(dispatcher) -> None:
    """The attack: a 100 MiB RegisterDataset without a token (the dispatcher takes graphs of up to
    max_graph_bytes, 1 GiB, from a client with one)."""
    before = psutil.Process(dispatcher.proc.pid).memory_info().rss
    payload = b"\x0a" + b"\xff" * (100 * 2**20)
    with grpc.insecure_channel(dispatcher.address, options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_unary("/dataservice.v1.DispatcherService/RegisterDataset")
        with pytest.raises(grpc.RpcError) as raised:
            call(payload, timeout=30)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, raised.value.details()
    grown_mib = (psutil.Process(dispatcher.proc.pid).memory_info().rss - before) / 2**20
    assert grown_mib < UNAUTHENTICATED_GROWTH_LIMIT_MIB, f"the dispatcher grew {grown_mib:.0f} MiB"


def test_unreadable_or_empty_token_files_are_config_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        dataservice.DispatcherConfig(auth_token_file=str(empty))
    with pytest.raises(ValueError, match="cannot read the auth token file"):
        dataservice.WorkerConfig(dispatcher_address="localhost:1", auth_token_file=str(tmp_path / "missing"))


def test_health_watch_streams_without_a_token_hold_no_server_threads(secured):
    """The attack: health needs no token, so open more Watch streams than the dispatcher has
    threads. Watch runs without holding one (gRPC's non-blocking mode), and an authenticated
    call still gets its answer."""
    address = secured.address
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(48)]
        try:
            for watch in watches:
                assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            with DispatcherClient(address, 10, auth_token=TOKEN) as client:
                assert len(client.get_workers()) == 1
        finally:
            for watch in watches:
                watch.cancel()
