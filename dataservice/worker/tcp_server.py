"""The worker's stream transfer servers (protocol: transfer/tcp.py): one on a TCP port, one on an
abstract Unix socket for clients on the worker's host.

One thread accepts connections; each connection is one task stream, served
on a thread of its own by streaming.stream_task, as gRPC's StreamElements is.
A connection takes one of MAX_STREAMS stream slots only once its first
request has authenticated it, which it must send within FIRST_REQUEST_TIMEOUT_S
(after the TLS handshake, itself bounded); until then it is one of at most
MAX_PENDING, so connections that never send a token cannot lock clients out.
One peer (rpc/peers.py) may have at most MAX_PENDING_PER_PEER of those and
MAX_STREAMS_PER_PEER of the stream slots, so that one host cannot take them
from the others. An authenticated stream idle for streaming.IDLE_STREAM_TIMEOUT_S is closed.
A client over any limit is told UNAVAILABLE and retries, as it would on an
overloaded gRPC server. A Unix
stream whose client asks for it carries its message bodies in a ring of
shared memory (transfer/shared_memory.py), unless TLS is on (the ring's
descriptor cannot travel over TLS) or the worker's rings are at their limit.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import cast

from dataservice import status
from dataservice.rpc import auth, peers
from dataservice.transfer import shared_memory, tcp, wire
from dataservice.v1 import worker_pb2
from dataservice.worker import streaming

log = logging.getLogger(__name__)

MAX_STREAMS = 256
# Connections that have not authenticated yet, and how long each has to.
MAX_PENDING = 1024
# One peer's share of each.
MAX_STREAMS_PER_PEER = MAX_STREAMS // 2
MAX_PENDING_PER_PEER = 64
FIRST_REQUEST_TIMEOUT_S = 10.0
# How long a client may take over its TLS handshake.
HANDSHAKE_TIMEOUT_S = 10.0

StreamFn = Callable[
    [worker_pb2.StreamElementsRequest, Iterator[worker_pb2.StreamElementsRequest], Callable[[], bool]],
    Iterator[streaming.Response],
]


def listen_tcp(port: int) -> socket.socket:
    """A listening socket on all interfaces (IPv6 and IPv4 where the host has both)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        host = "::"
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        host = "0.0.0.0"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise RuntimeError(f"could not bind data transfer port {port}: {e}") from None
    return sock


class TcpTransferServer:
    """Serves task streams accepted on `listener` (a TCP or Unix socket, listen_tcp or
    tcp.listen_unix) with `stream_fn` (streaming.stream_task bound to a worker). `rings`: Unix
    streams may use shared memory, within this budget."""

    def __init__(
        self,
        stream_fn: StreamFn,
        listener: socket.socket,
        auth_token: str | None = None,
        server: str = "the worker",
        ssl_context: ssl.SSLContext | None = None,
        rings: shared_memory.RingBudget | None = None,
    ):
        self._stream_fn = stream_fn
        self._ssl = ssl_context
        self._auth_token = auth_token
        self._server = server
        self._listener = listener
        self._rings = rings if ssl_context is None and shared_memory.available() else None
        address = self._listener.getsockname()
        self.port: int = address[1] if isinstance(address, tuple) else 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._pending = 0  # connections without a first request yet
        self._streams = 0  # authenticated connections (stream slots taken)
        # The same, per peer (their limits, the module's, read at each check).
        self._pending_by_peer = peers.KeyedLimiter(MAX_PENDING_PER_PEER)
        self._streams_by_peer = peers.KeyedLimiter(MAX_STREAMS_PER_PEER)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-transfer-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting and ends every open stream (their clients see the connection close)."""
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)
        self._thread.join(timeout=2)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, address = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                continue  # e.g. too many open files for a moment
            peer = peers.host_of_socket_address(address)
            with self._lock:
                if self._pending >= MAX_PENDING:
                    refusal = f"the worker has {MAX_PENDING} connections waiting for their first request"
                elif not self._pending_by_peer.acquire(peer, MAX_PENDING_PER_PEER):
                    refusal = (
                        f"the worker has {MAX_PENDING_PER_PEER} connections from {peer} waiting for their "
                        "first request, the most one host may have"
                    )
                else:
                    refusal = None
                    self._pending += 1
                    self._connections.add(conn)
            if refusal is not None:
                message = f"{refusal}: retry later"
                threading.Thread(target=self._refuse, args=(conn, message), daemon=True).start()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), name="tcp-transfer-stream", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        streaming_slot = False
        try:
            tcp.configure(conn)
            if self._ssl is not None:
                secured = self._handshake(conn)
                if secured is None:
                    return
                conn = secured
            conn.settimeout(FIRST_REQUEST_TIMEOUT_S)
            requests = tcp.read_requests(conn)
            try:
                request = next(requests, None)
            except tcp.BadRequest as e:
                code = status.Code.RESOURCE_EXHAUSTED if e.too_large else status.Code.INVALID_ARGUMENT
                _send_error(conn, code, f"{self._server}: {e}")
                return
            if request is None:
                return
            refused = auth.failure(request.auth_token, self._auth_token, self._server)
            if refused is not None:
                _send_error(conn, status.Code.UNAUTHENTICATED, refused)
                return
            conn.settimeout(streaming.IDLE_STREAM_TIMEOUT_S)
            refusal = self._take_stream_slot(peer)
            streaming_slot = refusal is None
            if refusal is not None:
                _send_error(conn, status.Code.UNAVAILABLE, f"{refusal}: retry later")
                return
            sender = _MessageSender(conn, self._rings, request.shared_memory_bytes)
            try:
                for header, buffers in self._stream_fn(
                    request, sender.releasing(requests), lambda: not self._stopped.is_set()
                ):
                    sender.send(header, buffers)
            except status.ServiceError as e:
                _send_error(conn, e.code, e.message)
            finally:
                sender.close()
        except OSError as e:
            log.debug("a data transfer connection ended: %s", e)
        finally:
            with self._lock:
                self._connections.discard(conn)
                if streaming_slot:
                    self._streams -= 1
                    self._streams_by_peer.release(peer)
                else:
                    self._pending -= 1
                    self._pending_by_peer.release(peer)
            _close(conn)

    def _take_stream_slot(self, peer: str) -> str | None:
        """Moves an authenticated connection from pending to a stream slot, if the worker and
        its peer have one free; else says why not."""
        with self._lock:
            if self._streams >= MAX_STREAMS:
                return f"the worker serves {MAX_STREAMS} data streams already"
            if not self._streams_by_peer.acquire(peer, MAX_STREAMS_PER_PEER):
                return (
                    f"the worker serves {MAX_STREAMS_PER_PEER} data streams to {peer} already, "
                    "the most one host may have"
                )
            self._streams += 1
            self._pending -= 1
            self._pending_by_peer.release(peer)
            return None

    def _handshake(self, raw: socket.socket) -> socket.socket | None:
        """The TLS connection over `raw`, or None if the client's handshake failed (logged) or
        took longer than HANDSHAKE_TIMEOUT_S."""
        assert self._ssl is not None  # (called for a TLS server only)
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        with self._lock:
            self._connections.discard(raw)
        try:
            # A TlsStream has the socket methods a stream uses: streams take it as a socket.
            conn = cast(socket.socket, tcp.TlsStream(self._ssl.wrap_socket(raw, server_side=True)))
        except (ssl.SSLError, OSError) as e:
            log.info("a data transfer client failed the TLS handshake: %s", e)
            return None
        with self._lock:
            self._connections.add(conn)
        return conn

    @staticmethod
    def _refuse(conn: socket.socket, message: str) -> None:
        try:
            conn.settimeout(FIRST_REQUEST_TIMEOUT_S)
            _send_error(conn, status.Code.UNAVAILABLE, message)
        except OSError:
            pass
        finally:
            _close(conn)


class _MessageSender:
    """Sends one stream's messages: their bodies in the message, or in the stream's ring of
    shared memory when it has one (made with the first body, if the client asked for one of
    `ring_bytes` and `rings` allows it) and the body fits in it."""

    def __init__(self, conn: socket.socket, rings: shared_memory.RingBudget | None, ring_bytes: int):
        self._conn = conn
        self._budget = rings
        # Whether the next body may go into a ring (the client asked, none was refused).
        self._wants_ring = rings is not None and ring_bytes > 0
        self._ring_bytes = ring_bytes
        self._ring: shared_memory.Ring | None = None
        # What the ring took of the budget (its slots may use a little less).
        self._ring_taken = 0
        self._ring_sent = False

    def releasing(self, requests: Iterator[worker_pb2.StreamElementsRequest]):
        """The client's later requests, with the ring regions they release released."""
        for request in requests:
            if request.released_regions and self._ring is not None:
                self._ring.release(list(request.released_regions))
            yield request

    def send(self, header: worker_pb2.StreamElementsResponse, buffers) -> None:
        budget = self._budget
        if self._wants_ring and budget is not None and buffers:
            body, size = wire.stream_body(buffers)
            ring = self._ring or self._make_ring(budget)
            if ring is not None:
                offset = ring.allocate(size)
                budget.count(in_ring=offset is not None)
                if offset is not None:
                    ring.write(offset, body)
                    header.region_offset, header.region_size = offset, size
                    if not self._ring_sent:
                        header.ring_bytes = ring.size
                        head = b"".join(bytes(part) for part in wire.stream_message(header))
                        shared_memory.send_fd(self._conn, head, ring.fd)
                        self._ring_sent = True
                    else:
                        tcp.send_parts(self._conn, wire.stream_message(header))
                    return
        tcp.send_parts(self._conn, wire.stream_message(header, buffers))

    def _make_ring(self, budget: shared_memory.RingBudget) -> shared_memory.Ring | None:
        size = budget.take(self._ring_bytes)
        if not size:
            self._wants_ring = False  # this stream goes without
            return None
        try:
            self._ring = shared_memory.Ring(size, shared_memory.slot_bytes_for(size))
        except OSError as e:
            log.info("no ring of shared memory for a stream: %s", e)
            budget.give_back(size)
            self._wants_ring = False
            return None
        self._ring_taken = size
        return self._ring

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            if self._budget is not None:
                self._budget.give_back(self._ring_taken)
            self._ring = None


def _send_error(conn: socket.socket, code: status.Code, message: str) -> None:
    header = worker_pb2.StreamElementsResponse(error_code=int(code), error_message=message)
    tcp.send_parts(conn, wire.stream_message(header))


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(conn: socket.socket) -> None:
    """Ends the connection for the peer at once (even if another thread still reads it), then frees it."""
    _shutdown(conn)
    conn.close()
