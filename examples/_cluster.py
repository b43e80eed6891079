"""The examples' service: the one given with --service, or a dispatcher and workers in this process."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator

import dataservice


def add_service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", help="grpc://host:port of a running dispatcher (default: start one here)")
    parser.add_argument("--workers", type=int, default=2, help="in-process workers when --service is not given")


@contextlib.contextmanager
def service_target(args: argparse.Namespace) -> Iterator[str]:
    """Yields the dispatcher target, starting an in-process cluster (as the tf.data
    service documentation does) unless --service names one."""
    if args.service:
        yield args.service
        return
    dispatcher = dataservice.DispatchServer()
    workers = [dataservice.WorkerServer(dataservice.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
               for _ in range(args.workers)]
    try:
        yield dispatcher.target
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()
