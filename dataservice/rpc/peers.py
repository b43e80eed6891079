"""Shares of a server's capacity per peer, so that one host, hostile or gone wrong, cannot take
every thread or connection slot a server has from the others.

A peer is the host a connection comes from: its IP address (an IPv4 address mapped into IPv6
counts as itself), or, for Unix sockets, this host. Clients behind one NAT address share a
share. gRPC's sync servers run each StreamElements call on a thread of their own for as long as
it lasts, so PeerShareInterceptor lets one peer hold at most a share of those threads; the
worker's TCP data port keeps its own per-peer counts of connections (worker/tcp_server.py).
Unary calls are not counted: they hold a thread only for the call, and maximum_concurrent_rpcs
bounds them all together.
"""

from __future__ import annotations

import ipaddress
import threading
import urllib.parse
from collections.abc import Callable, Hashable
from typing import Any

import grpc

from dataservice.rpc import handlers

# The peer of every Unix-socket connection: this host.
LOCAL_PEER = "this host"


class KeyedLimiter:
    """Counts what each key holds (streams, connections), up to `limit` per key."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[Hashable, int] = {}

    def acquire(self, key: Hashable, limit: int | None = None) -> bool:
        """One more for `key`, unless it holds `limit` (default: the limiter's) already."""
        with self._lock:
            held = self._held.get(key, 0)
            if held >= (self.limit if limit is None else limit):
                return False
            self._held[key] = held + 1
            return True

    def release(self, key: Hashable) -> None:
        with self._lock:
            left = self._held.get(key, 0) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

    def held(self, key: Hashable) -> int:
        with self._lock:
            return self._held.get(key, 0)


def _normalized(host: str) -> str:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def host_of_grpc_peer(peer: str) -> str:
    """The host of a gRPC peer string ("ipv4:10.0.0.1:5000", "ipv6:%5B::1%5D:5000" as gRPC
    percent-encodes it, "unix:...")."""
    scheme, _, rest = urllib.parse.unquote(peer).partition(":")
    if scheme == "ipv4":
        return _normalized(rest.rpartition(":")[0])
    if scheme == "ipv6":
        return _normalized(rest.rpartition(":")[0].strip("[]"))
    if scheme.startswith("unix"):
        return LOCAL_PEER
    return peer


def host_of_socket_address(address: Any) -> str:
    """The host of an address socket.accept() returned: (host, port[, flow, scope]) for TCP,
    a path (or nothing) for a Unix socket."""
    if isinstance(address, tuple) and address and isinstance(address[0], str):
        return _normalized(address[0])
    return LOCAL_PEER


class PeerShareInterceptor(grpc.ServerInterceptor):
    """Refuses a response-streaming call with UNAVAILABLE (clients retry) while its peer holds
    `limit` such calls already. Non-blocking handlers (the health service's Watch) hold no
    thread and are left alone (handlers.rewrap)."""

    def __init__(self, limit: int) -> None:
        self._limiter = KeyedLimiter(limit)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler.response_streaming:
            return handler
        method = handler_call_details.method
        limiter = self._limiter

        def shared(behavior: Callable, client_streaming: bool, server_streaming: bool) -> Callable:
            def within_share(request, context):
                peer = host_of_grpc_peer(context.peer())
                if not limiter.acquire(peer):
                    context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"this server runs {limiter.limit} {method} calls for {peer} already, the most one "
                        "host may hold of its threads: retry later",
                    )
                try:
                    yield from behavior(request, context)
                finally:
                    limiter.release(peer)

            return within_share

        return handlers.rewrap(handler, shared)
