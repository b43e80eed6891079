"""gRPC channels: message limits raised so that any element fits, and channels that a
client process shares between its readers, one per address.

A new channel pays a TCP and HTTP/2 handshake on its first call (several ms
on loopback, more across hosts), and a training loop opens an iteration per
epoch with a stream per worker: so channels are kept and reused rather than
opened per iteration. A channel that no reader holds stays open for the next
one; beyond MAX_IDLE such channels the longest idle is closed.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Dict, Iterator, Optional

import grpc

from dataservice.rpc import auth

# Elements and dataset graphs can be far larger than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC's reconnect backoff grows to 120 s by default: a dispatcher back after a
    # restart of a few seconds would then time its workers out before they retried.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
MAX_IDLE = 64


def make_channel(address: str, auth_token: Optional[str] = None) -> grpc.Channel:
    """A channel to `address`; with `auth_token`, every call on it carries the token."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if auth_token:
        channel = grpc.intercept_channel(channel, auth.ClientAuthInterceptor(auth_token))
    return channel


class SharedChannels:
    def __init__(self, max_idle: int = MAX_IDLE):
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._channels: Dict[str, grpc.Channel] = {}
        self._users: Dict[str, int] = collections.Counter()
        # Addresses whose channel nobody holds, oldest release first.
        self._idle: "collections.OrderedDict[str, None]" = collections.OrderedDict()

    def acquire(self, address: str) -> grpc.Channel:
        """The channel to `address` (carrying this process's client token, if it has one: see
        rpc/auth.py); give it back with release(address)."""
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = make_channel(address, auth.client_token())
            self._users[address] += 1
            self._idle.pop(address, None)
            return channel

    def release(self, address: str) -> None:
        with self._lock:
            self._users[address] -= 1
            if self._users[address] > 0:
                return
            del self._users[address]
            self._idle[address] = None
            while len(self._idle) > self._max_idle:
                oldest, _ = self._idle.popitem(last=False)
                self._channels.pop(oldest).close()

    @contextlib.contextmanager
    def holding(self, address: str) -> Iterator[grpc.Channel]:
        channel = self.acquire(address)
        try:
            yield channel
        finally:
            self.release(address)


# The process's shared channels.
shared_channels = SharedChannels()
