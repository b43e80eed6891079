"""Keeps freed heap memory in a server process for reuse instead of returning it at once.

glibc's defaults suit programs that allocate little: memory freed at the top
of the heap goes back to the OS once 128 KiB are free, and allocations above
an adaptive threshold get fresh mmaps. A worker moving MiB-sized elements
allocates and frees several buffers of that size per element, so with the
defaults it spends most of its time faulting fresh pages in (README,
"Figures behind the defaults"). A worker's memory is bounded by its buffers anyway;
keeping up to TRIM_THRESHOLD_BYTES of it free for reuse is the price.

`data-server` workers call it at start, with cap_arenas(). A client process calls it once,
when it first reads elements of a quarter MiB or more, unless
DATASERVICE_KEEP_FREED_MEMORY=0 is set: tf.data's generator op (the client's
entry into tf.data) itself lowers glibc's trim threshold to 128 KiB on first
use, and with that every MiB-sized tensor the client hands to tf.data is
faulted in afresh. The top pad and mmap threshold keep working after
TensorFlow's change of the trim threshold, whichever comes first.

What is kept is kept per arena, and glibc gives threads up to eight arenas a
core. A worker starts threads as tasks and streams come and go, and each new
thread's allocations settle in whichever arena it was given, so over many jobs
freed memory piles up in more and more of them: a worker's RSS rose with every
job run (README, "Long runs"). cap_arenas() limits the arenas to the cores the
process may use, as many as can allocate at once, so freed memory is found
again by the next thread instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# glibc's own setting, which cap_arenas() leaves in force where it is set.
ARENA_MAX_ENV = "MALLOC_ARENA_MAX"

TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
TOP_PAD_BYTES = 64 * 1024 * 1024
# glibc's largest mmap threshold on 64-bit hosts: larger allocations still get their own mmap.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# A client process keeps freed memory unless this is "0".
CLIENT_OPT_OUT_ENV = "DATASERVICE_KEEP_FREED_MEMORY"

_client_lock = threading.Lock()
_client_done = False


@functools.cache
def _mallopt():
    """glibc's mallopt, or None where the C library is not glibc. Looked up once a process:
    find_library runs ldconfig, and a worker sets its arenas and thresholds one after the other."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name or "libc.so.6").mallopt
    except (OSError, AttributeError):
        log.info("not glibc: malloc left at its defaults")
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


def keep_freed_memory() -> bool:
    """Sets glibc's trim, top-pad and mmap thresholds; False where the C library is not glibc."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (_M_TOP_PAD, TOP_PAD_BYTES),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)


def cap_arenas() -> int | None:
    """Limits glibc's arenas to the cores this process may use (at least two), unless
    MALLOC_ARENA_MAX is set; to be called before the process starts its threads. Returns the
    limit set, or None where none was (not glibc, or the variable set)."""
    if os.environ.get(ARENA_MAX_ENV):
        return None
    mallopt = _mallopt()
    if mallopt is None:
        return None
    arenas = max(2, len(os.sched_getaffinity(0)))
    return arenas if mallopt(_M_ARENA_MAX, arenas) == 1 else None


def keep_freed_memory_in_client() -> None:
    """Once a process: keep_freed_memory() for a client about to read large elements,
    unless CLIENT_OPT_OUT_ENV is "0"."""
    global _client_done
    with _client_lock:
        if _client_done:
            return
        _client_done = True
        if os.environ.get(CLIENT_OPT_OUT_ENV, "1") == "0":
            log.info("%s=0: malloc left as it is", CLIENT_OPT_OUT_ENV)
            return
        keep_freed_memory()
