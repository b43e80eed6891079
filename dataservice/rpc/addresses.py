"""Addresses as users write them: "grpc://host:port", or a (protocol, address) pair."""

from __future__ import annotations

from typing import Tuple, Union


def strip_protocol(address: str) -> str:
    """ "grpc://host:port" -> "host:port"; other protocols are a ValueError."""
    if "://" in address:
        protocol, _, address = address.partition("://")
        if protocol != "grpc":
            raise ValueError(f"only the 'grpc' protocol is supported, got {protocol!r}")
    if not address or ":" not in address:
        raise ValueError(f"expected an address of the form 'host:port', got {address!r}")
    return address


def parse_service(service: Union[str, Tuple[str, str]]) -> str:
    """The dispatcher address of a `service` argument: "grpc://host:port" or (protocol, address)."""
    if isinstance(service, (tuple, list)) and len(service) == 2:
        protocol, address = service
        return strip_protocol(f"{protocol}://{address}")
    if isinstance(service, str):
        return strip_protocol(service)
    raise ValueError(f"service must be 'grpc://host:port' or a (protocol, address) tuple, got {service!r}")
