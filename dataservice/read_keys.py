"""Read keys: who may read an iteration's tasks and act for one of its clients.

Task ids and client ids are small counters anyone can guess, and a client's
token is the same for every tenant of a cluster. So that one client cannot read
another's tasks (in distributed_epoch the elements it takes are lost to their
owner), heartbeat or release another's client, or pose as clients it is not
(to get around the per-client stream limit), the dispatcher makes a random
secret for each iteration when it creates it and journals it. Clients never
see the secret: each client gets its own key, an HMAC of its client id under
the iteration's secret, from the call that made it (GetOrCreateIteration,
ResumeIteration). Workers get the secret with each task (TaskDef.read_key), so
they can check a client's key for the client id it presents without asking the
dispatcher; the dispatcher checks it on ClientHeartbeat and
ReleaseIterationClient. A client id is thereby one the dispatcher issued, and
only its holder can use it.

The same secret signs receipts: with each message of elements a worker sends
an HMAC of (task id, elements the client has been sent of the task so far).
A client's checkpoint keeps each task's latest receipt beside the position it
saves, and the dispatcher resumes only positions a receipt covers: a client
cannot have a worker skip more elements than the task delivered (2^62 of an
infinite pipeline would keep it busy for ever).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

# 128-bit secrets, as hex.
SECRET_BYTES = 16
# Client keys: the first 128 bits of the HMAC-SHA256, as hex.
_KEY_CHARS = 32


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def client_key(secret: str, client_id: int) -> str:
    """The key of client `client_id` of the iteration whose secret is `secret`."""
    return hmac.new(secret.encode(), str(client_id).encode(), hashlib.sha256).hexdigest()[:_KEY_CHARS]


def matches(provided: str, secret: str, client_id: int) -> bool:
    """Whether `provided` is client `client_id`'s key, in time that does not depend on where they
    differ. An iteration without a secret (journaled before read keys existed) asks for none."""
    if not secret:
        return True
    return hmac.compare_digest(provided.encode(), client_key(secret, client_id).encode())


def receipt(secret: str, task_id: int, elements: int) -> str:
    """The receipt of task `task_id` for `elements` elements sent to one of its clients."""
    message = f"receipt:{task_id}:{elements}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:_KEY_CHARS]


def receipt_matches(provided: str, secret: str, task_id: int, elements: int) -> bool:
    """Whether `provided` is the task's receipt for `elements`, in time that does not depend on
    where they differ. An iteration without a secret (journaled before read keys) signs none."""
    if not secret:
        return True
    return hmac.compare_digest(provided.encode(), receipt(secret, task_id, elements).encode())
