"""gRPC channels: message limits raised so that any element fits, and channels that a
client process shares between its readers, one per address (and TLS files and token).

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
from collections.abc import Iterator

import grpc

from dataservice.rpc import auth
from dataservice.rpc.tls import TlsFiles

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
# (address, TLS files, the client token the channel's calls carry).
_Key = tuple[str, TlsFiles | None, str | None]


def make_channel(address: str, auth_token: str | None = None, tls: TlsFiles | None = None) -> grpc.Channel:
    """A channel to `address`, over TLS with `tls`; with `auth_token`, every call on it carries the token."""
    if tls is not None:
        channel = grpc.secure_channel(address, tls.channel_credentials(), options=CHANNEL_OPTIONS)
    else:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if auth_token:
        channel = grpc.intercept_channel(channel, auth.ClientAuthInterceptor(auth_token))
    return channel


class SharedChannels:
    """Channels shared by address, TLS files and client token: a channel carries the token it was
    made with, so a process whose token changed (its environment set after an earlier read, or
    a new token file) gets a channel carrying the new one rather than an idle channel without it."""

    def __init__(self, max_idle: int = MAX_IDLE):
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._channels: dict[_Key, grpc.Channel] = {}
        self._users: dict[_Key, int] = collections.Counter()
        # Which key each channel handed out is under (release() takes the channel).
        self._key_of: dict[grpc.Channel, _Key] = {}
        # Channels nobody holds, oldest release first.
        self._idle: collections.OrderedDict[_Key, None] = collections.OrderedDict()

    def acquire(self, address: str, tls: TlsFiles | None = None) -> grpc.Channel:
        """The channel to `address` (over TLS with `tls`; carrying this process's client token,
        if it has one now: see rpc/auth.py); give it back with release(channel)."""
        token = auth.client_token()
        key = (address, tls, token)
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = make_channel(address, token, tls)
                self._key_of[channel] = key
            self._users[key] += 1
            self._idle.pop(key, None)
            return channel

    def release(self, channel: grpc.Channel) -> None:
        """Gives back a channel acquire() handed out; one nobody holds stays open for a while."""
        with self._lock:
            key = self._key_of[channel]
            self._users[key] -= 1
            if self._users[key] > 0:
                return
            del self._users[key]
            self._idle[key] = None
            while len(self._idle) > self._max_idle:
                oldest, _ = self._idle.popitem(last=False)
                closed = self._channels.pop(oldest)
                del self._key_of[closed]
                closed.close()

    @contextlib.contextmanager
    def holding(self, address: str, tls: TlsFiles | None = None) -> Iterator[grpc.Channel]:
        channel = self.acquire(address, tls)
        try:
            yield channel
        finally:
            self.release(channel)


# The process's shared channels.
shared_channels = SharedChannels()
