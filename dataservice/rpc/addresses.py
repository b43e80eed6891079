"""Addresses as users write them: "grpc://host:port", "grpc+tls://host:port", or a
(protocol, address) pair."""

from __future__ import annotations

import dataclasses

from dataservice.rpc import tls as tls_lib


@dataclasses.dataclass(frozen=True)
class Target:
    """A dispatcher as a client reaches it: "host:port", and the client's TLS files when the
    cluster is addressed with "grpc+tls" (None: plaintext)."""

    address: str
    tls: tls_lib.TlsFiles | None = None

    def __str__(self) -> str:
        return f"{tls_lib.TLS if self.tls else tls_lib.PLAINTEXT}://{self.address}"


def split_protocol(address: str) -> tuple[str, str]:
    """("grpc" or "grpc+tls", "host:port") of an address; no protocol means "grpc". Other
    protocols, and addresses that are not host:port, are a ValueError."""
    protocol = tls_lib.PLAINTEXT
    if address.count("://") > 1:
        raise ValueError(f"malformed address {address!r}: more than one '://'")
    if "://" in address:
        protocol, _, address = address.partition("://")
        if protocol not in tls_lib.PROTOCOLS:
            raise ValueError(f"the protocol must be one of {', '.join(tls_lib.PROTOCOLS)}, got {protocol!r}")
    if not address or ":" not in address:
        raise ValueError(f"expected an address of the form 'host:port', got {address!r}")
    return protocol, address


def strip_protocol(address: str) -> str:
    """ "grpc://host:port" or "grpc+tls://host:port" -> "host:port"."""
    return split_protocol(address)[1]


def parse_service(service: str | tuple[str, str]) -> Target:
    """The dispatcher of a `service` argument: "grpc[+tls]://host:port" or (protocol, address).
    With "grpc+tls" the client's TLS files come from the environment (rpc/tls.py)."""
    if isinstance(service, (tuple, list)) and len(service) == 2:
        protocol, address = service
        service = f"{protocol}://{address}"
    if not isinstance(service, str):
        raise ValueError(f"service must be 'grpc://host:port' or a (protocol, address) tuple, got {service!r}")
    if not service:
        raise ValueError("service must not be empty: give the dispatcher as 'grpc://host:port'")
    protocol, address = split_protocol(service)
    if protocol != tls_lib.TLS:
        return Target(address)
    files = tls_lib.TlsFiles.from_environment()
    files.check()
    return Target(address, files)
