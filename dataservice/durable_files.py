"""Files that exist only whole, and survive a crash once written.

A file is written under a temporary name in its directory, fsynced, renamed
over its final name, and the directory fsynced, so that after a crash (power
loss, kill -9) either the old content or the whole new content is there, and
the rename itself is on disk before the caller acknowledges anything that
depends on it. The dispatcher's dataset store and journal snapshots use it.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

Data = bytes | Iterable[bytes]


def fsync_directory(directory: str | os.PathLike) -> None:
    """Makes the directory's entries (files created, renamed or deleted in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str | os.PathLike, data: Data) -> None:
    """Writes `data` (bytes, or chunks of bytes) to `path` atomically and durably.

    The temporary file is `path` with a `.tmp` suffix; one left by a crash is
    overwritten by the next write. On an error the temporary file is removed
    and `path` keeps its old content."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
