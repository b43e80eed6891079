"""The worker's stream transfers: StreamElements over a plain TCP connection, or over a Unix
socket to a client on the worker's host.

Why not only gRPC: grpc-python hands a received message to Python as bytes
built by copying each of its slices and joining them (two copies), the client
then copies each tensor to memory TensorFlow can adopt (a third), and the
worker's frame is joined once and copied into gRPC's slices. For MiB-sized
elements those copies and the hand-offs between gRPC's threads cost the
client more than the rest of its work. Here the worker sends the arrays'
own memory (sendmsg) and the client receives each message body straight into
aligned memory (recv_into) that its tensors are views of: the kernel's copy
is the only one (README's benchmarks give what that buys).

One connection per task stream:
    client -> worker: requests, each `u32 size | StreamElementsRequest`; the
        first names the task, later ones grant credits (flow control as over gRPC);
    worker -> client: messages as wire.stream_message lays them out; a failed
        stream ends with a response carrying error_code (a gRPC status code) and
        error_message.
A worker that offers it registers the transfer address "tcp://host:port";
gRPC (the worker's own address) stays available to every client. A worker
also listens on a Unix socket in the abstract namespace, named after its
process ("unix://@dataservice-worker-<uid>"; nothing on the file system), and
registers both addresses, comma-separated. A client connects to the Unix
socket first: it exists only on the worker's host (and network namespace),
so a connection that succeeds is the same-host transport, and one that is
refused falls back to TCP. Over a Unix socket the stream may carry its
message bodies in a ring of shared memory (shared_memory.py).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
from google.protobuf.message import DecodeError

from dataservice.rpc.tls import TlsFiles
from dataservice.transfer import shared_memory, wire
from dataservice.v1 import worker_pb2

log = logging.getLogger(__name__)

SCHEME = "tcp://"
PROTOCOL = "tcp"
UNIX_SCHEME = "unix://"
UNIX_PROTOCOL = "unix"
_REQUEST_SIZE = struct.Struct("<I")
# Bounds on what a peer may claim, so garbage on the port cannot make the other end allocate without limit.
MAX_REQUEST_BYTES = 1024 * 1024
MAX_HEADER_BYTES = 256 * 1024 * 1024
MAX_BODY_BYTES = 2**40
# A dead peer that sent no FIN is noticed after about KEEPALIVE_IDLE_S + 3 * KEEPALIVE_INTERVAL_S.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10


def transfer_address(address: str) -> str | None:
    """'host:port' of the TCP transfer in a worker's transfer addresses; None when there is none."""
    return transfer_addresses(address).get(PROTOCOL)


def transfer_addresses(value: str) -> dict[str, str]:
    """A worker's registered transfer addresses ("tcp://host:port,unix://@name") by protocol:
    {"tcp": "host:port", "unix": "@name"}; a gRPC address gives {}."""
    found = {}
    for address in value.split(","):
        for scheme, protocol in ((SCHEME, PROTOCOL), (UNIX_SCHEME, UNIX_PROTOCOL)):
            if address.startswith(scheme) and len(address) > len(scheme):
                found.setdefault(protocol, address[len(scheme) :])
    return found


def unix_socket_name(worker_uid: int) -> str:
    """The abstract Unix socket name of the worker process with this uid ("@..." as `ss` shows it)."""
    return f"@dataservice-worker-{worker_uid:016x}"


def _unix_address(name: str) -> str:
    if not name.startswith("@") or len(name) < 2:
        raise ValueError(f"a Unix transfer address must name an abstract socket ('@name'), got {name!r}")
    return "\0" + name[1:]


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 host]:port"."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a data transfer address must be 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


def configure(sock: socket.socket) -> None:
    """No Nagle delay (credits and small messages go out at once), and keepalive probes (TCP
    only: a Unix socket has neither)."""
    if sock.family == socket.AF_UNIX:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", 3),
    ):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class TlsStream:
    """A TLS connection that one thread reads while another writes.

    OpenSSL does not allow one connection to be used by two threads at once, and a stream
    is read by one thread and written by another (credits one way, elements the other). So
    every read and write holds a lock while it calls into TLS; a reader waiting for data
    waits outside the lock (polling the socket), so a writer is never held up by it."""

    POLL_S = 0.5

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._lock = threading.Lock()
        self._timeout_s: float | None = None
        sock.setblocking(False)

    def _deadline(self) -> float | None:
        return None if self._timeout_s is None else time.monotonic() + self._timeout_s

    @staticmethod
    def _check(deadline: float | None) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("timed out")

    def recv_into(self, view: memoryview) -> int:
        deadline = self._deadline()
        while True:
            with self._lock:
                try:
                    return self._sock.recv_into(view)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            self._check(deadline)
            _wait_for(self._sock, select.POLLIN)

    def sendall(self, data) -> None:
        deadline = self._deadline()
        view = memoryview(data).cast("B")
        while view:
            with self._lock:
                try:
                    sent = self._sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    sent = 0
            if sent:
                view = view[sent:]
            else:
                self._check(deadline)
                _wait_for(self._sock, select.POLLOUT)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)  # without the lock: it ends a wait in another thread

    def close(self) -> None:
        self._sock.close()

    def settimeout(self, timeout: float | None) -> None:
        """Each later read or write raises TimeoutError once it has waited `timeout` seconds
        (to within POLL_S); None: they wait as long as it takes."""
        self._timeout_s = timeout

    def __enter__(self) -> TlsStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wait_for(sock: socket.socket, event: int) -> None:
    """Waits up to TlsStream.POLL_S for `event` on `sock`. poll, not select: select cannot
    watch a descriptor numbered 1024 or more, which a server with many connections has."""
    poller = select.poll()
    poller.register(sock, event)
    poller.poll(TlsStream.POLL_S * 1000)


def connect_unix(name: str, timeout_s: float, tls: TlsFiles | None = None, server_hostname: str = "") -> socket.socket:
    """A connection to the abstract Unix socket `name` ("@..."), over TLS with `tls` (the server's
    certificate verified for `server_hostname`, its TCP host); raises OSError
    (ConnectionRefusedError when no such socket exists here) when it cannot be made."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(_unix_address(name))
        if tls is not None:
            return TlsStream(tls.client_context().wrap_socket(sock, server_hostname=server_hostname or None))
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise


def listen_unix(name: str) -> socket.socket:
    """A listening abstract Unix socket named `name` ("@...")."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(_unix_address(name))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise RuntimeError(f"could not bind the Unix transfer socket {name}: {e}") from None
    return sock


def connect(address: str, timeout_s: float, tls: TlsFiles | None = None) -> socket.socket:
    """A connection to 'host:port', configured, over TLS with `tls` (the server's certificate
    verified for the host); raises OSError (ssl.SSLError for TLS) when it cannot be made."""
    host, port = split_host_port(address)
    sock = socket.create_connection((host, port), timeout=timeout_s)
    configure(sock)
    if tls is not None:
        try:
            return TlsStream(tls.client_context().wrap_socket(sock, server_hostname=host))
        except BaseException:
            sock.close()
            raise
    sock.settimeout(None)
    return sock


def send_parts(sock: socket.socket, parts: list[wire.Buffer]) -> None:
    """Sends the parts in order, from their own memory, however the kernel splits the writes
    (over TLS, which has no scatter-gather send, one part at a time)."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    if isinstance(sock, TlsStream):
        for view in views:
            sock.sendall(view)
        return
    while views:
        sent = sock.sendmsg(views[:512])  # IOV_MAX is 1024 on Linux
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_request(sock: socket.socket, request: worker_pb2.StreamElementsRequest) -> None:
    data = request.SerializeToString()
    send_parts(sock, [_REQUEST_SIZE.pack(len(data)), data])


class BadRequest(ValueError):
    """A request the worker will not read: over MAX_REQUEST_BYTES (`too_large`), or not a request."""

    def __init__(self, message: str, too_large: bool = False):
        super().__init__(message)
        self.too_large = too_large


def read_requests(sock: socket.socket) -> Iterator[worker_pb2.StreamElementsRequest]:
    """The client's requests until it closes the connection (or it breaks). Raises BadRequest
    for a size prefix over MAX_REQUEST_BYTES (before reading or allocating anything for it)
    or bytes that are not a StreamElementsRequest."""
    size_bytes = bytearray(_REQUEST_SIZE.size)
    while True:
        try:
            _recv_exactly(sock, memoryview(size_bytes))
        except OSError as e:
            log.debug("no more requests: %s", e)
            return
        (size,) = _REQUEST_SIZE.unpack(size_bytes)
        if size > MAX_REQUEST_BYTES:
            raise BadRequest(
                f"a request of {size:,} bytes is over the limit of {MAX_REQUEST_BYTES:,} (MAX_REQUEST_BYTES)",
                too_large=True,
            )
        data = bytearray(size)
        try:
            _recv_exactly(sock, memoryview(data))
        except OSError as e:
            log.debug("no more requests: %s", e)
            return
        try:
            request = worker_pb2.StreamElementsRequest.FromString(bytes(data))
        except DecodeError:
            raise BadRequest("the peer sent something that is not a StreamElementsRequest") from None
        yield request


def recv_response(sock: socket.socket) -> tuple[worker_pb2.StreamElementsResponse, wire.FrameBuffers]:
    """The next message's header and buffers; the body lands in TF_ALIGNMENT-aligned memory.
    Raises ConnectionError when the connection ends first."""
    response, body, _ = recv_message(sock)
    return response, wire.FrameBuffers(body, 0, wire.TF_ALIGNMENT)


def recv_message(
    sock: socket.socket, receive_fd: bool = False
) -> tuple[worker_pb2.StreamElementsResponse, np.ndarray, int | None]:
    """The next message's header, its body (in TF_ALIGNMENT-aligned memory) and, with
    `receive_fd`, the descriptor that came with it (shared_memory.py). Raises ConnectionError
    when the connection ends first."""
    prefix = bytearray(wire.STREAM_PREFIX.size)
    fd = None
    if receive_fd:
        fd = shared_memory.recv_fd_into(sock, memoryview(prefix))
    else:
        _recv_exactly(sock, memoryview(prefix))
    try:
        header_size, body_size = wire.STREAM_PREFIX.unpack(prefix)
        if header_size > MAX_HEADER_BYTES or body_size > MAX_BODY_BYTES:
            raise ConnectionError(
                f"a message claims a header of {header_size} bytes and a body of {body_size}: "
                "the peer is not a dataservice worker"
            )
        header = bytearray(header_size)
        _recv_exactly(sock, memoryview(header))
        body = wire.tf_aligned_empty((body_size,), np.uint8)
        _recv_exactly(sock, memoryview(body))
        try:
            response = worker_pb2.StreamElementsResponse.FromString(bytes(header))
        except DecodeError:
            raise ConnectionError("the peer sent a header that is not a StreamElementsResponse") from None
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return response, body, fd


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fills `view` from the socket: one call for the whole message where the kernel allows
    (MSG_WAITALL), and more only when a signal or the socket's buffer interrupts it."""
    flags = 0 if isinstance(sock, TlsStream) else socket.MSG_WAITALL
    received = 0
    while received < len(view):
        count = sock.recv_into(view[received:], 0, flags) if flags else sock.recv_into(view[received:])
        if not count:
            raise ConnectionError("the connection was closed by the peer")
        received += count
