"""Starting and stopping a gRPC server the same way for the dispatcher and the workers."""

from __future__ import annotations

import concurrent.futures
import logging

import grpc

from dataservice import rpc

log = logging.getLogger(__name__)


def bind(server: grpc.Server, port: int) -> int:
    """Binds all interfaces (IPv6 and IPv4 where the host has both) and returns the bound port."""
    for host in ("[::]", "0.0.0.0"):
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            bound = 0
        if bound:
            return bound
    raise RuntimeError(f"could not bind port {port}: it is in use or not permitted")


def new_server(max_workers: int) -> grpc.Server:
    return grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=rpc.SERVER_OPTIONS,
    )
