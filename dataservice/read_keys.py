"""Iteration read keys: who may read an iteration's tasks and act for its clients.

Task ids and client ids are small counters anyone can guess, and a client's
token is the same for every tenant of a cluster. So that one client cannot read
another's tasks (in distributed_epoch the elements it takes are lost to their
owner) or heartbeat and release another's iteration client, the dispatcher
makes a random key for each iteration when it creates it, journals it, and hands
it only to the clients that create or join the iteration (and, in each TaskDef,
to the workers that run its tasks). Workers serve a task's elements, and the
dispatcher answers ClientHeartbeat and ReleaseIterationClient, only to
requests that carry it. Clients of one iteration share its key: they read the
same data already.
"""

from __future__ import annotations

import hmac
import secrets

# 128 bits, as hex.
KEY_BYTES = 16


def new_key() -> str:
    return secrets.token_hex(KEY_BYTES)


def matches(provided: str, expected: str) -> bool:
    """Whether `provided` is the iteration's key, in time that does not depend on where they differ.
    An iteration without a key (journaled before keys existed) asks for none."""
    if not expected:
        return True
    return hmac.compare_digest(provided.encode(), expected.encode())
