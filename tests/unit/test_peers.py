"""Per-peer shares (rpc/peers.py): the keyed counts, how a peer's host is read from gRPC's and
from sockets' addresses, and the interceptor on a real gRPC server, one peer reaching it over
IPv6 loopback and another over IPv4 loopback."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from dataservice.rpc import peers, servers

_METHOD = "/test.Streams/Hold"


def test_the_limiter_counts_each_key_up_to_its_limit():
    limiter = peers.KeyedLimiter(limit=2)
    assert limiter.acquire(1) and limiter.acquire(1)
    assert not limiter.acquire(1), "a third for key 1"
    assert limiter.acquire(2), "another key is not affected"
    limiter.release(1)
    assert limiter.held(1) == 1
    assert limiter.acquire(1)
    for _ in range(3):
        limiter.release(2)  # releasing more than was held leaves nothing behind
    assert limiter.held(2) == 0 and limiter.acquire(2)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.1.2.3:5000", "10.1.2.3"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:%5B::1%5D:38647", "::1"),
        ("ipv6:[::ffff:127.0.0.2]:41000", "127.0.0.2"),
        ("ipv6:[fe80::1%eth0]:5000", "fe80::1"),
        ("unix:/tmp/socket", peers.LOCAL_PEER),
        ("unix-abstract:name", peers.LOCAL_PEER),
    ],
)
def test_the_host_of_a_grpc_peer(peer, host):
    assert peers.host_of_grpc_peer(peer) == host


def test_the_host_of_a_socket_address():
    assert peers.host_of_socket_address(("::ffff:127.0.0.2", 5000, 0, 0)) == "127.0.0.2"
    assert peers.host_of_socket_address(("::1", 5000, 0, 0)) == "::1"
    assert peers.host_of_socket_address(("10.0.0.1", 5000)) == "10.0.0.1"
    assert peers.host_of_socket_address("") == peers.LOCAL_PEER
    assert peers.host_of_socket_address(b"") == peers.LOCAL_PEER


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_one_peer_holds_at_most_its_share_of_a_servers_streams():
    """With 4 threads and a share of half, an IPv6-loopback peer holding 2 streams gets
    UNAVAILABLE for a third, while the IPv4-loopback peer still gets its streams served."""
    assert _ipv6_loopback(), "this test needs IPv6 loopback (::1)"
    release = threading.Event()

    def hold(request, context):
        yield b"started"
        while context.is_active() and not release.wait(0.05):
            pass

    server = servers.new_server(max_workers=4, max_receive_bytes=1024)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Streams", {"Hold": grpc.unary_stream_rpc_method_handler(hold)})]
    )
    port = servers.bind(server, 0)
    server.start()
    channels = [grpc.insecure_channel(f"{host}:{port}") for host in ("[::1]", "127.0.0.1")]
    calls = []
    try:
        ipv6, ipv4 = (channel.unary_stream(_METHOD) for channel in channels)
        for _ in range(2):
            calls.append(ipv6(b"", timeout=30))
            assert next(calls[-1]) == b"started"
        refused = ipv6(b"", timeout=30)
        with pytest.raises(grpc.RpcError) as refusal:
            next(refused)
        assert refusal.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "for ::1 already" in refusal.value.details()
        # The other peer is served on the threads the first may not take.
        calls.append(ipv4(b"", timeout=30))
        assert next(calls[-1]) == b"started"
        # A stream that ends gives its place back (once its handler has seen the end).
        calls.pop(0).cancel()
        deadline = time.monotonic() + 10
        while True:
            calls.append(ipv6(b"", timeout=30))
            try:
                assert next(calls[-1]) == b"started"
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, e.details()
                time.sleep(0.05)
    finally:
        release.set()
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()
        server.stop(None)
