"""A task's StreamElements call: through memory from a worker in this process
(transfer/local.py), over the worker's TCP data transfer, or over gRPC.

All yield (StreamElementsResponse, buffers to decode) and fail with a grpc.RpcError
(errors.RemoteError for TCP and local), so the reader handles them alike.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Iterator, Optional, Protocol, Tuple

import grpc

from dataservice import status
from dataservice.rpc import auth, errors
from dataservice.rpc.channels import shared_channels
from dataservice.rpc.tls import TlsFiles, diagnose
from dataservice.transfer import grpc_service, local, tcp, wire
from dataservice.v1 import common_pb2, worker_pb2

Requests = Iterator[worker_pb2.StreamElementsRequest]
Response = Tuple[worker_pb2.StreamElementsResponse, wire.FrameBuffers]
# How long a TCP connection to a worker may take to open before it counts as a transient failure.
CONNECT_TIMEOUT_S = 10.0


def open_stream(
    task: common_pb2.TaskInfo, protocol: Optional[str], requests: Requests, tls: Optional[TlsFiles] = None
) -> "ElementStream":
    """The stream of `task`: through memory when its worker runs in this process (whatever
    `protocol`, as TensorFlow's client does), else over TCP where its worker offers it and
    `protocol` allows (None, "tcp" or "local"), else over gRPC at the worker's address; over
    TLS with `tls`."""
    serve = local.find(task.worker_address)
    if serve is not None:
        return LocalElementStream(serve, requests)
    address = tcp.transfer_address(task.transfer_address)
    if address is not None and protocol != "grpc":
        return TcpElementStream(address, requests, tls)
    return GrpcElementStream(task.worker_address, requests, tls)


class ElementStream(Protocol):
    def __iter__(self) -> Iterator[Response]: ...

    def cancel(self) -> None:
        """Ends the stream from another thread: iteration stops with an error."""

    def close(self) -> None:
        """Releases what the stream holds, once it is over."""


class GrpcElementStream:
    def __init__(self, address: str, requests: Requests, tls: Optional[TlsFiles] = None):
        self._address = address
        self._tls = tls
        self._call = grpc_service.WorkerDataStub(shared_channels.acquire(address, tls)).StreamElements(requests)

    def __iter__(self) -> Iterator[Response]:
        for data in self._call:
            yield wire.unframe(data, worker_pb2.StreamElementsResponse)

    def cancel(self) -> None:
        self._call.cancel()

    def close(self) -> None:
        self._call.cancel()
        shared_channels.release(self._address, self._tls)


class LocalElementStream:
    """A worker in this process serves the stream on the calling thread; credits go to it on a
    thread of its own (as over TCP)."""

    def __init__(self, serve: local.Serve, requests: Requests):
        self._requests = iter(requests)
        self._cancelled = threading.Event()
        first = local.uncompressed(next(self._requests))
        self._responses = serve(first, self._requests, lambda: not self._cancelled.is_set())

    def __iter__(self) -> Iterator[Tuple[worker_pb2.StreamElementsResponse, local.BufferList]]:
        try:
            for response, buffers in self._responses:
                yield response, local.BufferList(buffers)
        except status.ServiceError as e:
            raise errors.RemoteError(errors.grpc_code(e.code), e.message) from None
        if self._cancelled.is_set():
            raise errors.RemoteError(grpc.StatusCode.CANCELLED, "the local stream was cancelled")

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        self._cancelled.set()
        self._responses.close()


class TcpElementStream:
    """One TCP connection: requests go out on a thread of their own, responses are read by the iterating one."""

    def __init__(self, address: str, requests: Requests, tls: Optional[TlsFiles] = None):
        self._address = address
        token = auth.client_token()
        try:
            self._sock = tcp.connect(address, CONNECT_TIMEOUT_S, tls)
        except ssl.SSLError as e:
            reason = diagnose(address, tls) or f"the TLS handshake failed: {e}"
            raise errors.RemoteError(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {address}: {reason}") from None
        except OSError as e:
            raise errors.RemoteError(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {address}: {e}") from None
        self._sender = threading.Thread(
            target=self._send, args=(requests, token), name=f"credits-to-{address}", daemon=True
        )
        self._sender.start()

    def _send(self, requests: Requests, token: Optional[str]) -> None:
        try:
            for request in requests:
                if token:  # the first request authenticates the stream (rpc/auth.py)
                    first = worker_pb2.StreamElementsRequest()
                    first.CopyFrom(request)
                    first.auth_token, request, token = token, first, None
                tcp.send_request(self._sock, request)
        except OSError:
            pass  # the connection broke: the reading side reports it

    def __iter__(self) -> Iterator[Response]:
        while True:
            try:
                response, buffers = tcp.recv_response(self._sock)
            except OSError as e:
                raise errors.RemoteError(
                    grpc.StatusCode.UNAVAILABLE, f"the data connection to {self._address} broke: {e}"
                ) from None
            if response.error_code:
                raise errors.RemoteError(errors.status_code(response.error_code), response.error_message)
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
