"""What a caller without the token can do to a TLS + token cluster of `data-server` processes:
open health Watch streams, take the worker's TCP data-port connections from one host and never
send a request,
and send a 100 MiB request. None of it keeps a trainer with the token from reading every element,
and the large request is refused before it is read (the dispatcher's memory is measured)."""

from __future__ import annotations

import grpc
import psutil
import tensorflow as tf
from conftest import connect_from, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dataservice
from dataservice.monitoring import health
from dataservice.rpc import errors, tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import tcp
from dataservice.v1 import worker_pb2
from dataservice.worker import tcp_server

# What the refusal of an unauthenticated request may add to the server's memory: only gRPC's
# flow-control window of the request arrives before the refusal.
UNAUTHENTICATED_GROWTH_LIMIT_MIB = 40


def _trainer_reads(secure_cluster, elements: int = 2_000, protocol: str = "tcp") -> None:
    dataset = tf.data.Dataset.range(elements).apply(
        dataservice.distribute("distributed_epoch", secure_cluster.target, data_transfer_protocol=protocol)
    )
    assert sorted(dataset.as_numpy_iterator()) == list(range(elements))


def _credentials(secure_cluster) -> grpc.ChannelCredentials:
    return tls.TlsFiles(ca_file=secure_cluster.certs.ca_file).channel_credentials()


def test_watch_streams_without_a_token_starve_no_one(secure_cluster):
    """More Watch streams (no token needed) than the dispatcher has threads, and than it serves:
    the extra ones are RESOURCE_EXHAUSTED, and a trainer reads meanwhile."""
    with grpc.secure_channel(secure_cluster.dispatcher.address, _credentials(secure_cluster)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # Each under a name of its own, as a caller growing the server's table of names would.
        requests = [health_pb2.HealthCheckRequest(service=f"name-{i}") for i in range(health.MAX_WATCHERS + 8)]
        watches = [stub.Watch(request, timeout=120) for request in requests]
        try:
            answered, refused = 0, 0
            for watch in watches:
                try:
                    assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                    answered += 1
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                    refused += 1
            assert (answered, refused) == (health.MAX_WATCHERS, 8)
            _trainer_reads(secure_cluster, protocol="grpc")
        finally:
            for watch in watches:
                watch.cancel()
        # Their places are free again once they end.
        wait_until(lambda: _watch_answers(stub), "a Watch stream to be served again")


def _watch_answers(stub) -> bool:
    watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    try:
        return next(watch).status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
    finally:
        watch.cancel()


def test_silent_connections_to_the_data_port_lock_no_trainer_out(secure_cluster):
    """One host (another loopback address) opens more connections than the worker lets wait
    for their first request, and never sends a byte: it holds only its share of them
    (MAX_PENDING_PER_PEER), so a connection from this host is still taken to authentication
    (answered UNAUTHENTICATED without a token, rather than told to retry), and a trainer reads."""
    tls_files = tls.TlsFiles(ca_file=secure_cluster.certs.ca_file)
    with DispatcherClient(secure_cluster.dispatcher.address, 10, tls=tls_files) as client:
        (worker,) = client.get_workers()
    address = tcp.transfer_address(worker.transfer_address)
    silent = []
    try:
        for _ in range(tcp_server.MAX_PENDING + 16):
            silent.append(connect_from("127.0.0.2", address))
        with tcp.connect(address, 10, tls=tls_files) as sock:
            sock.settimeout(10)
            tcp.send_request(sock, worker_pb2.StreamElementsRequest(task_id=1, credits=1))
            response, _ = tcp.recv_response(sock)
        assert errors.status_code(response.error_code) == grpc.StatusCode.UNAUTHENTICATED, response.error_message
        _trainer_reads(secure_cluster, protocol="tcp")
    finally:
        for sock in silent:
            sock.close()


def test_a_large_request_without_a_token_is_refused_unread(secure_cluster):
    process = psutil.Process(secure_cluster.dispatcher.proc.pid)
    before = process.memory_info().rss
    payload = b"\x0a" + b"\xff" * (100 * 2**20)
    options = [("grpc.max_send_message_length", -1)]
    with grpc.secure_channel(secure_cluster.dispatcher.address, _credentials(secure_cluster), options) as channel:
        call = channel.unary_unary("/dataservice.v1.DispatcherService/RegisterDataset")
        try:
            call(payload, timeout=60)
            raise AssertionError("an unauthenticated request was served")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.details()
    grown_mib = (process.memory_info().rss - before) / 2**20
    assert grown_mib < UNAUTHENTICATED_GROWTH_LIMIT_MIB, f"the dispatcher grew {grown_mib:.0f} MiB"
