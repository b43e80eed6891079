"""The worker's file sandbox: pipelines read files only under `data_roots`, enforced by the kernel.

The dataset policy (pipeline/policy.py) lets pipelines read files, since reading
files is what input pipelines do; it cannot tell a pipeline reading training
shards from one reading the worker's TLS key by a path computed at run time.
Landlock can: a process restricts itself to a set of directories, and every
open it makes afterwards, however the path was computed (symlinks, `..`,
/proc/self/fd), is checked by the kernel against them.

Landlock restricts the thread that asks and the threads it creates later, not
threads already running, so the worker restricts itself while it is the only
thread: before TensorFlow is imported (TensorFlow starts threads on import).
Everything the worker reads by path after that (its TLS files and token,
through rpc/secret_files.py) is read into memory first, and temporary files go
to a directory of the worker's own. Reads are what is
restricted; writes stay the op policy's job (no op that writes files is
allowed), so that distributed_save can write where its dispatcher says.

What stays readable besides the roots is what the Python and TensorFlow
runtime needs to go on working: the interpreter's import paths, the shared
library directories, and a few named files under /etc, /proc, /sys and /dev
(runtime_read_paths lists them). /proc is not readable as a whole (a pipeline
could read the worker's own memory through /proc/self/mem).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import dataclasses
import os
import shutil
import sys
import sysconfig
import tempfile

# linux/landlock.h
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_ACCESS_FS_READ_FILE = 1 << 2
_ACCESS_FS_READ_DIR = 1 << 3
_HANDLED = _ACCESS_FS_READ_FILE | _ACCESS_FS_READ_DIR
_PR_SET_NO_NEW_PRIVS = 38
# x86_64 and aarch64 share these (the generic syscall table numbers).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446

# Files and directories the runtime reads after start-up; missing ones are skipped.
_RUNTIME_FILES = (
    "/etc/ld.so.cache",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/self/stat",
    "/proc/self/status",
    "/proc/self/cgroup",
    "/proc/self/mountinfo",
    "/proc/self/maps",
    "/proc/self/cmdline",
    "/proc/self/exe",
)
_RUNTIME_DIRECTORIES = (
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/usr/share/zoneinfo",
    "/usr/share/locale",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
    "/proc/self/task",
)


class SandboxError(RuntimeError):
    """The sandbox cannot be put in place; the worker must not start without it."""


@dataclasses.dataclass(frozen=True)
class Sandbox:
    """The sandbox this process runs in: the data roots its pipelines may read."""

    data_roots: tuple[str, ...]


_current: Sandbox | None = None


def current() -> Sandbox | None:
    """The sandbox this process put itself in, or None."""
    return _current


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where the kernel has none (or it is disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def runtime_read_paths() -> list[str]:
    """What the Python and TensorFlow runtime reads after start-up, beside the data roots."""
    # Site directories and the package itself, not every sys.path entry: the first is the
    # script's directory or the working directory, which may hold anything.
    paths = {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p) and "-packages" in p}
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dataservice/
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_path(key)
        if path:
            paths.add(os.path.realpath(path))
    paths.add(os.path.realpath(sys.prefix))
    paths.add(os.path.realpath(sys.base_prefix))
    paths.update(p for p in _RUNTIME_DIRECTORIES if os.path.isdir(p))
    keras_home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    files = [*_RUNTIME_FILES, os.path.join(keras_home, "keras.json")]  # TensorFlow's Keras reads it on import
    paths.update(p for p in files if os.path.exists(p))
    # An import path of "/" would open everything: never a rule.
    return sorted(p for p in paths if p != "/")


def _private_temporary_directory() -> str:
    """A temporary directory of this process's own, made TMPDIR: Python's tempfile and TensorFlow
    open temporary files for reading and writing, and the shared /tmp stays outside the sandbox."""
    path = tempfile.mkdtemp(prefix="dataservice-worker-")
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    atexit.register(shutil.rmtree, path, True)
    return path


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        access = _HANDLED if os.path.isdir(path) else _ACCESS_FS_READ_FILE
        rule = _PathBeneath(access, fd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            error = ctypes.get_errno()
            raise SandboxError(f"cannot allow reads under {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


def restrict_reads(data_roots: list[str]) -> Sandbox:
    """Restricts this process, for good, to reading files under `data_roots` (and the runtime's
    own paths). Must run while the process has one thread; SandboxError if it cannot."""
    global _current
    roots = tuple(os.path.realpath(root) for root in data_roots)
    for root in roots:
        if not os.path.isdir(root):
            raise SandboxError(f"the data root {root} is not a directory")
    if _current is not None:
        if _current.data_roots != roots:
            raise SandboxError(f"this process is already sandboxed to {list(_current.data_roots)}")
        return _current
    if abi_version() < 1:
        raise SandboxError(
            "data_roots needs Landlock (Linux 5.13 or later, enabled in the kernel's lsm= list); this kernel has "
            "none, and a worker asked for a sandbox does not run without one"
        )
    threads = _thread_count()
    if threads != 1:
        raise SandboxError(
            f"the sandbox must be put in place before the worker starts threads ({threads} running, which it "
            "would not cover); start the worker as its own process (data-server --role=worker --data_roots=...)"
        )
    libc = _libc()
    private_tmp = _private_temporary_directory()

    class _RulesetAttr(ctypes.Structure):
        _fields_ = (("handled_access_fs", ctypes.c_uint64),)

    attr = _RulesetAttr(_HANDLED)
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0)))
    if ruleset < 0:
        raise SandboxError(f"cannot create a Landlock ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path in sorted({*roots, *runtime_read_paths(), private_tmp}):
            _add_rule(libc, ruleset, path)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"cannot restrict this process: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    _current = Sandbox(roots)
    return _current
