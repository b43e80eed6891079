"""A task's StreamElements call: through memory from a worker in this process
(transfer/local.py), over a Unix socket (with a ring of shared memory) from a worker on this
host, over the worker's TCP data transfer, or over gRPC.

All yield (StreamElementsResponse, buffers to decode) and fail with a status.ServiceError
(GrpcElementStream turns gRPC's errors into it), so the reader handles them alike.
"""

from __future__ import annotations

import collections
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Protocol

import grpc

from dataservice import status
from dataservice.rpc import auth, errors
from dataservice.rpc.channels import shared_channels
from dataservice.rpc.tls import TlsFiles, diagnose
from dataservice.transfer import grpc_service, local, shared_memory, tcp, wire
from dataservice.v1 import common_pb2, worker_pb2

Requests = Iterator[worker_pb2.StreamElementsRequest]
Response = tuple[worker_pb2.StreamElementsResponse, wire.Buffers]
# How long a TCP connection to a worker may take to open before it counts as a transient failure.
CONNECT_TIMEOUT_S = 10.0


def open_stream(
    task: common_pb2.TaskInfo,
    protocol: str | None,
    requests: Requests,
    tls: TlsFiles | None = None,
    ring_bytes: int = 0,
) -> ElementStream:
    """The stream of `task`: through memory when its worker runs in this process (whatever
    `protocol`, as TensorFlow's client does); else, unless `protocol` is "grpc", over the
    worker's Unix socket when it is on this host (not for "tcp"; asking for a ring of
    `ring_bytes` of shared memory), else over TCP where the worker offers it; else over gRPC
    at the worker's address. Over TLS with `tls`."""
    serve = local.find(task.worker_address)
    if serve is not None:
        return LocalElementStream(serve, requests)
    addresses = tcp.transfer_addresses(task.transfer_address)
    if protocol != "grpc":
        requests = iter(requests)
        if tcp.UNIX_PROTOCOL in addresses and protocol != tcp.PROTOCOL:
            host = tcp.split_host_port(addresses[tcp.PROTOCOL])[0] if tcp.PROTOCOL in addresses else ""
            try:
                sock = tcp.connect_unix(addresses[tcp.UNIX_PROTOCOL], CONNECT_TIMEOUT_S, tls, host)
            except OSError:
                pass  # not on this host (or not in this network namespace)
            else:
                return UnixElementStream(sock, requests, ring_bytes if tls is None else 0)
        if tcp.PROTOCOL in addresses:
            return TcpElementStream(addresses[tcp.PROTOCOL], requests, tls)
    return GrpcElementStream(task.worker_address, requests, tls)


class ElementStream(Protocol):
    def __iter__(self) -> Iterator[Response]: ...

    def cancel(self) -> None:
        """Ends the stream from another thread: iteration stops with an error."""

    def close(self) -> None:
        """Releases what the stream holds, once it is over."""


class GrpcElementStream:
    def __init__(self, address: str, requests: Requests, tls: TlsFiles | None = None):
        self._address = address
        self._tls = tls
        self._channel = shared_channels.acquire(address, tls)
        self._call = grpc_service.WorkerDataStub(self._channel).StreamElements(requests)

    def __iter__(self) -> Iterator[Response]:
        try:
            for data in self._call:
                yield wire.unframe(data, worker_pb2.StreamElementsResponse)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    def close(self) -> None:
        self._call.cancel()
        shared_channels.release(self._channel)


class LocalElementStream:
    """A worker in this process serves the stream on the calling thread; credits go to it on a
    thread of its own (as over TCP)."""

    def __init__(self, serve: local.Serve, requests: Requests):
        self._requests = iter(requests)
        self._cancelled = threading.Event()
        first = local.uncompressed(next(self._requests))
        self._responses = serve(first, self._requests, lambda: not self._cancelled.is_set())

    def __iter__(self) -> Iterator[tuple[worker_pb2.StreamElementsResponse, local.BufferList]]:
        for response, buffers in self._responses:
            yield response, local.BufferList(buffers)
        if self._cancelled.is_set():
            raise status.error(status.Code.CANCELLED, "the local stream was cancelled")

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        self._cancelled.set()
        self._responses.close()


class TcpElementStream:
    """One connection: requests go out on a thread of their own, responses are read by the
    iterating one. Connects to `address` over TCP unless given a connected `sock`."""

    def __init__(
        self, address: str, requests: Requests, tls: TlsFiles | None = None, sock: socket.socket | None = None
    ):
        self._address = address
        self._send_lock = threading.Lock()
        if sock is None:
            sock = self._connect(address, tls)
        self._sock = sock
        self._sender = threading.Thread(
            target=self._send, args=(requests, auth.client_token()), name=f"credits-to-{address}", daemon=True
        )
        self._sender.start()

    @staticmethod
    def _connect(address: str, tls: TlsFiles | None) -> socket.socket:
        try:
            return tcp.connect(address, CONNECT_TIMEOUT_S, tls)
        except ssl.SSLError as e:
            reason = diagnose(address, tls) or f"the TLS handshake failed: {e}"
            raise status.unavailable(f"cannot connect to {address}: {reason}") from None
        except OSError as e:
            raise status.unavailable(f"cannot connect to {address}: {e}") from None

    def _first(self, request: worker_pb2.StreamElementsRequest) -> worker_pb2.StreamElementsRequest:
        """The first request as this transfer sends it."""
        return request

    def _send(self, requests: Requests, token: str | None) -> None:
        try:
            first = True
            for request in requests:
                if first:
                    request = self._first(request)
                    if token:  # the first request authenticates the stream (rpc/auth.py)
                        authenticated = worker_pb2.StreamElementsRequest()
                        authenticated.CopyFrom(request)
                        authenticated.auth_token = token
                        request = authenticated
                    first = False
                self.send_request(request)
        except OSError:
            pass  # the connection broke: the reading side reports it

    def send_request(self, request: worker_pb2.StreamElementsRequest) -> None:
        with self._send_lock:
            tcp.send_request(self._sock, request)

    def _receive(self) -> tuple[worker_pb2.StreamElementsResponse, wire.FrameBuffers]:
        return tcp.recv_response(self._sock)

    def __iter__(self) -> Iterator[Response]:
        while True:
            try:
                response, buffers = self._receive()
            except OSError as e:
                raise status.unavailable(f"the data connection to {self._address} broke: {e}") from None
            if response.error_code:
                raise status.error(status.code_of_number(response.error_code), response.error_message)
            yield response, buffers
            if response.end_of_sequence:
                return

    def cancel(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.cancel()
        self._sender.join(timeout=2)
        self._sock.close()


class UnixElementStream(TcpElementStream):
    """A stream from a worker on this host over its Unix socket; with `ring_bytes`, it asks for a
    ring of shared memory for the message bodies (transfer/shared_memory.py), whose regions it
    releases (in a request of their own) as soon as the last array viewing them is freed."""

    def __init__(self, sock: socket.socket, requests: Requests, ring_bytes: int = 0):
        self._ring_bytes = ring_bytes if shared_memory.available() else 0
        self._ring: shared_memory.RingView | None = None
        self._released: collections.deque[int] = collections.deque()
        self._release_now = threading.Event()
        self._closed = threading.Event()
        super().__init__("this host's Unix socket", requests, sock=sock)
        if self._ring_bytes:
            threading.Thread(target=self._release_loop, name="ring-releases", daemon=True).start()

    def _first(self, request: worker_pb2.StreamElementsRequest) -> worker_pb2.StreamElementsRequest:
        # Never compressed: bandwidth between processes of one host is not short.
        first = local.uncompressed(request)
        first.shared_memory_bytes = self._ring_bytes
        return first

    def _receive(self) -> tuple[worker_pb2.StreamElementsResponse, wire.FrameBuffers]:
        response, body, fd = tcp.recv_message(self._sock, receive_fd=self._ring_bytes > 0 and self._ring is None)
        if fd is not None:
            if not response.ring_bytes or self._ring is not None:
                os.close(fd)
            else:
                self._ring = shared_memory.RingView(fd, response.ring_bytes, self._on_release)
        if response.region_size:
            if self._ring is None:
                raise ConnectionError("the worker sent a message in shared memory but no ring")
            region = self._ring.region(response.region_offset, response.region_size)
            return response, wire.FrameBuffers(region, 0, wire.TF_ALIGNMENT)
        return response, wire.FrameBuffers(body, 0, wire.TF_ALIGNMENT)

    def _on_release(self, offset: int) -> None:
        # Runs wherever the last view of the region was freed (a tf.data thread, say): only notes it.
        self._released.append(offset)
        self._release_now.set()

    def _release_loop(self) -> None:
        """Tells the worker which regions are free, a request per batch of them."""
        while not self._closed.is_set():
            self._release_now.wait(0.5)
            self._release_now.clear()
            offsets = []
            while self._released:
                offsets.append(self._released.popleft())
            if offsets:
                try:
                    self.send_request(worker_pb2.StreamElementsRequest(released_regions=offsets))
                except OSError:
                    return

    def close(self) -> None:
        self._closed.set()
        self._release_now.set()
        super().close()
