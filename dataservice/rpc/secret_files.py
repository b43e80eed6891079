"""Credential files (TLS PEM files, token files), readable after the worker's sandbox is up.

A sandboxed worker (worker/sandbox.py) cannot open its own TLS key or token
file once it restricts itself, which is the point: neither can its pipelines.
So it reads them into memory first (`preload`), and every reader of a
credential file goes through `read`, which answers from memory for a preloaded
path. OpenSSL's loaders that only take paths are given a memfd's
/proc/self/fd path (`as_path`): an anonymous in-memory file, which the
sandbox does not restrict and nothing else can open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_preloaded: dict[str, bytes] = {}


def preload(paths: list[str | None]) -> None:
    """Reads each of `paths` into memory, where `read` finds it from now on; OSError as open raises."""
    for path in paths:
        if path:
            with open(path, "rb") as f:
                _preloaded[path] = f.read()


def read(path: str) -> bytes:
    """The contents of the credential file `path`: from memory if preloaded, else from disk."""
    data = _preloaded.get(path)
    if data is not None:
        return data
    with open(path, "rb") as f:
        return f.read()


@contextlib.contextmanager
def as_path(path: str | None) -> Iterator[str | None]:
    """A path that opens to the contents of `path` (None for None) while the block runs: the path
    itself unless it was preloaded, else an in-memory copy's."""
    if path is None or path not in _preloaded:
        yield path
        return
    fd = os.memfd_create("dataservice-credential", os.MFD_CLOEXEC)
    try:
        os.write(fd, _preloaded[path])
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
