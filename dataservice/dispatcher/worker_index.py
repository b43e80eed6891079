"""Which entry of the dispatcher's `worker_addresses` a worker is, for static sharding.

An entry is "host:port" (that worker exactly), "host:%port%" (any port on that host; any
"%...%" port, as TensorFlow's named ports) or "host" alone (the same). Workers take entries in
the order they first registered: a worker at an exact entry takes it; otherwise the first
entry with its host and an open port that no earlier worker took (TensorFlow's
WorkerIndexResolver). The resolution is a pure function of the list and the registration
order, which the journal keeps, so a restarted dispatcher gives every worker its index again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _split(address: str) -> tuple[str, str | None]:
    """(host, port or None); an IPv6 host in brackets keeps them."""
    if address.startswith("["):
        host, _, rest = address.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else None
    host, colon, port = address.rpartition(":")
    return (host, port) if colon else (address, None)


def _open_port(entry: str) -> bool:
    port = _split(entry)[1]
    return port is None or (port.startswith("%port") and port.endswith("%"))


def _takes(entry: str, worker_address: str) -> bool:
    """Whether a worker at `worker_address` may take the (not yet taken) `entry`."""
    if entry == worker_address:
        return True
    host, port = _split(worker_address)
    return port is not None and _open_port(entry) and _split(entry)[0] == host


def resolve(entries: Sequence[str], registered: Iterable[str]) -> dict[str, int]:
    """The index of each worker in `registered` (addresses, in registration order) that has an
    entry; the others have none and may not serve static sharding."""
    taken: dict[str, int] = {}
    free = list(range(len(entries)))
    for address in registered:
        if address in taken:
            continue
        exact = next((i for i in free if entries[i] == address), None)
        index = exact if exact is not None else next((i for i in free if _takes(entries[i], address)), None)
        if index is not None:
            taken[address] = index
            free.remove(index)
    return taken


def refusal(entries: Sequence[str], address: str) -> str:
    """The message for a worker that has no entry."""
    return (
        f"worker {address} is not in the dispatcher's worker_addresses {list(entries)}, or other workers "
        "already run at the entries for its host: start it with one of those addresses (--worker_address; "
        "a restarted worker must keep its address and port), or restart the dispatcher with a list naming it"
    )
