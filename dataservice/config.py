"""Server configurations, field for field those of tf.data.experimental.service.

Both are frozen dataclasses: a value is checked once, when it is built, so a
server never starts on a configuration it cannot honour.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TypeVar

from dataservice.rpc import auth, tls
from dataservice.rpc.addresses import strip_protocol

_Value = TypeVar("_Value")


def resolved(value: _Value | None) -> _Value:
    """A config field that __post_init__ resolved: None there means the default, which it puts in
    the field's place, so a server reads a value (typed as one) rather than checking for None."""
    if value is None:
        raise ValueError("a config field was read before the config resolved it (made without __post_init__?)")
    return value


DEFAULT_JOB_GC_CHECK_INTERVAL_MS = 60_000
DEFAULT_JOB_GC_TIMEOUT_MS = 300_000
# Long enough for a trainer to resume from a checkpoint taken before its iteration ended.
DEFAULT_ITERATION_RETENTION_MS = 24 * 3600 * 1000
DEFAULT_WORKER_TIMEOUT_MS = 10_000
DEFAULT_CLIENT_TIMEOUT_MS = 60_000
# A client's data stream from which nothing arrives for this long (a worker sends a keepalive
# every wire.STREAM_KEEPALIVE_S) is taken for broken, and connected again.
DEFAULT_STREAM_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 1_000
DEFAULT_DISPATCHER_TIMEOUT_MS = 600_000
DEFAULT_MAX_GRAPH_BYTES = 1024 * 1024 * 1024
# What registered dataset graphs may hold of the dispatcher's memory (dispatcher/dataset_store.py).
DEFAULT_GRAPH_MEMORY_BYTES = 2 * 1024**3
# As TensorFlow's: the window of one task's elements that trainers share.
DEFAULT_CROSS_TRAINER_CACHE_BYTES = 10 * 1024**3
# A worker's default memory budget (WorkerConfig.memory_budget_bytes): this share of the memory it
# may use (the rest: TensorFlow, the pipelines' own buffers such as shuffle's, the process itself).
DEFAULT_MEMORY_BUDGET_SHARE = 0.5
# cgroup v2 writes "max" for no limit, cgroup v1 a number near 2**63.
_NO_CGROUP_LIMIT = 2**60


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535] (0 picks a free port), got {port!r}")


def _check_monitoring_port(port: int | None) -> None:
    if port is not None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(
                f"monitoring_port must be None (off) or an integer in [0, 65535] (0 picks a free port), got {port!r}"
            )


def _check_monitoring_security(config) -> None:
    _check_bool("monitoring_tls", config.monitoring_tls)
    if config.monitoring_tls and not (config.tls_cert_file and config.tls_key_file):
        raise ValueError(
            "monitoring_tls serves the monitoring port with the server's certificate: it needs "
            "protocol='grpc+tls' with tls_cert_file and tls_key_file"
        )
    _check_token_file(config.monitoring_token_file, "monitoring_token_file")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_token_file(path: str | None, name: str = "auth_token_file") -> str | None:
    """The token in the file `path` names (None for None); ValueError naming the field `name`."""
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise ValueError(f"{name} must be a path, got {path!r}")
    return auth.read_token_file(path)


def _absolute_paths(name: str, paths: Sequence[str]) -> tuple[str, ...]:
    """`paths` checked: a non-empty list of absolute directory paths (None is handled by the caller)."""
    if isinstance(paths, str) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise ValueError(f"{name} must be a list of absolute directory paths, got {paths!r}")
    if not paths:
        raise ValueError(f"{name} must name at least one directory (None: no restriction)")
    return tuple(paths)


def _check_worker_token_file(config) -> None:
    worker_token = _check_token_file(config.worker_token_file, "worker_token_file")
    if worker_token is None:
        return
    if config.auth_token_file and auth.matches(worker_token, auth.read_token_file(config.auth_token_file)):
        raise ValueError(
            "worker_token_file holds the same token as auth_token_file: the worker token must be a secret of the "
            "cluster's servers that clients do not have"
        )


def _protocol(protocol: str | None) -> str:
    """The protocol checked; None is the default, "grpc" (as TensorFlow's)."""
    if protocol is None:
        return tls.PLAINTEXT
    if protocol not in tls.PROTOCOLS:
        raise ValueError(f"protocol must be None, 'grpc' or 'grpc+tls', got {protocol!r}")
    return protocol


def _check_tls(config) -> None:
    """protocol='grpc+tls' needs a certificate and its key; the TLS files need it; all must be readable."""
    files = (config.tls_cert_file, config.tls_key_file, config.tls_ca_file)
    if config.protocol == tls.TLS:
        if not config.tls_cert_file or not config.tls_key_file:
            raise ValueError("protocol='grpc+tls' needs tls_cert_file and tls_key_file (the server's PEM files)")
        tls.TlsFiles(config.tls_ca_file, config.tls_cert_file, config.tls_key_file).check()
    elif any(files):
        raise ValueError("tls_cert_file, tls_key_file and tls_ca_file need protocol='grpc+tls'")


# How elements can travel from workers to clients ("grpc": gRPC only; "tcp": TCP, gRPC beside it;
# "local", TensorFlow's name for reading in-process workers through memory, which every client
# does anyway: otherwise as "tcp"). None, in a worker's or a client's config, means "tcp".
DATA_TRANSFER_PROTOCOLS = ("grpc", "tcp", "local", "unix")


# A timeout of -1 means "never" where allowed: job_gc_timeout_ms (as TensorFlow's), never ending
# named iterations without clients, and iteration_retention_ms, never dropping iterations.
NEVER = -1


# What 0 means for a time: as in TensorFlow's Python API (None leaves the value to the server),
# "a very small number", which TensorFlow makes 1 ms.
SHORTEST_MS = 1


def _milliseconds(name: str, value: int | None, default: int, never: bool = False) -> int:
    """`value` checked: `default` for None, SHORTEST_MS for 0. `never`: -1 is accepted too,
    meaning "never"."""
    if value is None:
        return default
    valid_int = isinstance(value, int) and not isinstance(value, bool)
    if never and valid_int and value == NEVER:
        return value
    if not valid_int or value < 0:
        also = ", or -1 for never" if never else ""
        raise ValueError(
            f"{name} must be a non-negative number of milliseconds{also} (None: the default), got {value!r}"
        )
    return value or SHORTEST_MS


@dataclasses.dataclass(frozen=True)
class DispatcherConfig:
    """Configuration of a DispatchServer.

    port: the port to bind; 0 picks a free one.
    protocol: "grpc" (also for None), or "grpc+tls" (clients then use "grpc+tls://host:port").
    tls_cert_file / tls_key_file: the server's PEM certificate and key (grpc+tls).
    tls_ca_file: require client certificates signed by this CA (mutual TLS).
    work_dir: where the dispatcher keeps dataset graphs and, in
      fault_tolerant_mode, its journal.
    fault_tolerant_mode: journal every state change to work_dir so that a
      restarted dispatcher loses nothing. Needs work_dir.
    worker_addresses: the fixed list of workers, for static sharding.
    job_gc_check_interval_ms / job_gc_timeout_ms: how often to look for, and
      how long to keep, iterations that no client reads; job_gc_timeout_ms=-1
      keeps them for good (as in TensorFlow).
    iteration_retention_ms: how long a finished iteration without clients is kept (a
      checkpoint taken while reading it can be resumed until then) before it is dropped,
      with its tasks, split ranges and, if it was its job's last, its job; -1 keeps
      every iteration for good.
    worker_timeout_ms: a worker silent for this long is considered gone.
    client_timeout_ms: a client silent for this long is released.
    For every time in milliseconds, None means the default and 0 the shortest (1 ms), as in
    TensorFlow's Python API.
    monitoring_port: the HTTP port of /metrics (Prometheus), the status page (/) and
      /status.json; 0 picks a free port; None (the default) serves none.
    monitoring_token_file: a file holding the token every monitoring page but /healthz and
      /readyz needs (monitoring/http_server.py); None: open.
    monitoring_tls: serve the monitoring port over HTTPS with tls_cert_file and tls_key_file.
    allow_unsafe_ops: register datasets whose graphs write files or act outside
      producing elements (pipeline/policy.py); off by default.
    auth_token_file: a file holding the token every RPC must carry (rpc/auth.py);
      None (the default): no token is required.
    worker_token_file: a file holding the token of the cluster's own servers: workers'
      calls of the dispatcher (heartbeats, splits, dataset definitions, snapshot commits)
      must carry it and no other, and the dispatcher sends it to its workers; None: they
      use auth_token_file's token, shared with clients.
    max_graph_bytes: the largest dataset graph the dispatcher registers (a pipeline
      that embeds its data, from_tensor_slices of an array, is that large).
    graph_memory_bytes: what registered graphs may hold of the dispatcher's memory: with a
      work_dir, graphs live there and this is the size of the cache of them in memory;
      without one, registering a graph past it is RESOURCE_EXHAUSTED.
    worker_max_concurrent_snapshots: how many distributed_save snapshots one worker
      writes chunks of at once (one chunk of each); 0 (the default): all of them.
    snapshot_roots: directories distributed_save may write under (a save elsewhere is
      PERMISSION_DENIED); None (the default): anywhere the servers can write, as in TensorFlow.
    """

    port: int = 0
    protocol: str | None = "grpc"
    work_dir: str | None = None
    fault_tolerant_mode: bool = False
    worker_addresses: Sequence[str] | None = None
    job_gc_check_interval_ms: int | None = None
    job_gc_timeout_ms: int | None = None
    iteration_retention_ms: int | None = None
    worker_timeout_ms: int | None = None
    client_timeout_ms: int | None = None
    monitoring_port: int | None = None
    monitoring_token_file: str | None = None
    monitoring_tls: bool = False
    allow_unsafe_ops: bool = False
    auth_token_file: str | None = None
    worker_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES
    graph_memory_bytes: int = DEFAULT_GRAPH_MEMORY_BYTES
    worker_max_concurrent_snapshots: int = 0
    snapshot_roots: Sequence[str] | None = None

    def __post_init__(self) -> None:
        _check_port(self.port)
        object.__setattr__(self, "protocol", _protocol(self.protocol))
        _check_tls(self)
        if not isinstance(self.max_graph_bytes, int) or not 0 < self.max_graph_bytes < 2**31 - 2**20:
            raise ValueError(f"max_graph_bytes must be in (0, 2 GiB - 1 MiB), got {self.max_graph_bytes!r}")
        if not isinstance(self.graph_memory_bytes, int) or self.graph_memory_bytes <= 0:
            raise ValueError(f"graph_memory_bytes must be a positive integer, got {self.graph_memory_bytes!r}")
        _check_monitoring_port(self.monitoring_port)
        _check_monitoring_security(self)
        _check_bool("allow_unsafe_ops", self.allow_unsafe_ops)
        _check_token_file(self.auth_token_file)
        _check_worker_token_file(self)
        if self.snapshot_roots is not None:
            object.__setattr__(self, "snapshot_roots", _absolute_paths("snapshot_roots", self.snapshot_roots))
        limit = self.worker_max_concurrent_snapshots
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(
                f"worker_max_concurrent_snapshots must be a non-negative integer (0: no limit), got {limit!r}"
            )
        if self.fault_tolerant_mode and not self.work_dir:
            raise ValueError("fault_tolerant_mode=True needs a work_dir: the dispatcher journals its state there")
        if self.worker_addresses is not None:
            addresses = tuple(self.worker_addresses)
            if isinstance(self.worker_addresses, str) or not all(isinstance(a, str) and a for a in addresses):
                raise ValueError(
                    f"worker_addresses must be a list of 'host:port' strings, got {self.worker_addresses!r}"
                )
            object.__setattr__(self, "worker_addresses", addresses)
        for name, default in (
            ("job_gc_check_interval_ms", DEFAULT_JOB_GC_CHECK_INTERVAL_MS),
            ("job_gc_timeout_ms", DEFAULT_JOB_GC_TIMEOUT_MS),
            ("iteration_retention_ms", DEFAULT_ITERATION_RETENTION_MS),
            ("worker_timeout_ms", DEFAULT_WORKER_TIMEOUT_MS),
            ("client_timeout_ms", DEFAULT_CLIENT_TIMEOUT_MS),
        ):
            never = name in ("job_gc_timeout_ms", "iteration_retention_ms")
            object.__setattr__(self, name, _milliseconds(name, getattr(self, name), default, never))


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Configuration of a WorkerServer.

    dispatcher_address: "host:port" of the dispatcher (a "grpc://" or "grpc+tls://" prefix is accepted).
    protocol: "grpc" (also for None), or "grpc+tls": serve over TLS and reach the dispatcher over TLS,
      presenting tls_cert_file and trusting tls_ca_file (else DATASERVICE_TLS_CA_FILE,
      else the system's roots).
    tls_cert_file / tls_key_file / tls_ca_file: as for DispatcherConfig.
    worker_address: the address clients use to reach this worker;
      "%port%" is replaced by the bound port. Default: "localhost:%port%".
    port: the port to bind; 0 picks a free one.
    heartbeat_interval_ms: how often the worker reports to the dispatcher.
    dispatcher_timeout_ms: how long the worker keeps retrying an unreachable dispatcher.
      For both, None means the default and 0 the shortest (1 ms), as in TensorFlow's Python API.
    data_transfer_protocol: how clients read elements: "tcp" (the default, also
      for None, "local" and "unix") offers a plain TCP stream next to gRPC, without gRPC's
      copies, and a Unix socket with rings of shared memory to clients on the worker's host
      (transfer/tcp.py, transfer/shared_memory.py); "grpc" serves elements over gRPC only.
      Clients in the worker's own process always read through memory (transfer/local.py).
    data_transfer_address: the address clients on other hosts reach the TCP transfer at;
      "%dts_port%" is replaced by its bound port. Default: worker_address's
      host with ":%dts_port%".
    data_transfer_port: the port the TCP transfer binds; 0 picks a free one.
    monitoring_port: the HTTP port of /metrics (Prometheus); 0 picks a free port;
      None (the default) serves none.
    monitoring_token_file / monitoring_tls: as for DispatcherConfig.
    allow_unsafe_ops: run pipelines whose graphs write files or act outside
      producing elements (pipeline/policy.py); off by default.
    auth_token_file: a file holding the token clients' RPCs and data streams must carry
      (rpc/auth.py); None: none.
    worker_token_file: the cluster servers' own token (as DispatcherConfig's): the worker
      sends it to its dispatcher and requires it of the dispatcher's task pushes; None: the
      worker uses auth_token_file's token for those too.
    cross_trainer_cache_size_bytes: the window of each task read with cross_trainer_cache
      (worker/cross_trainer_cache.py); None: 10 GiB, as TensorFlow's.
    memory_budget_bytes: what the tasks' buffers, cross-trainer cache windows and the messages
      clients have not acknowledged may hold together (worker/memory_budget.py): each running
      task gets an equal share, so buffers shrink as tasks are added, and no task is refused.
      None: half the memory the worker may use (its container's limit, else the machine's).
    data_roots: directories the worker's pipelines may read files under, and nothing else
      (worker/sandbox.py: the kernel's Landlock, set up before the worker starts threads, so
      a worker with data_roots runs as its own process); None: reads are unrestricted, as in
      TensorFlow.
    worker_tags: tags the worker reports to the dispatcher. "COLOCATED" (as TensorFlow's): the
      worker runs beside a trainer, and target_workers="AUTO" clients read it only from its
      own host (each trainer its local worker, plus every worker without the tag).
    """

    dispatcher_address: str
    worker_address: str | None = None
    port: int = 0
    protocol: str | None = "grpc"
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    data_transfer_protocol: str | None = None
    data_transfer_address: str | None = None
    data_transfer_port: int = 0
    monitoring_port: int | None = None
    monitoring_token_file: str | None = None
    monitoring_tls: bool = False
    allow_unsafe_ops: bool = False
    auth_token_file: str | None = None
    worker_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    cross_trainer_cache_size_bytes: int | None = None
    memory_budget_bytes: int | None = None
    worker_tags: Sequence[str] | None = None
    data_roots: Sequence[str] | None = None

    def __post_init__(self) -> None:
        _check_bool("allow_unsafe_ops", self.allow_unsafe_ops)
        if self.data_roots is not None:
            object.__setattr__(self, "data_roots", _absolute_paths("data_roots", self.data_roots))
        budget = self.memory_budget_bytes
        if budget is None:
            object.__setattr__(self, "memory_budget_bytes", default_memory_budget_bytes())
        elif not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
            raise ValueError(f"memory_budget_bytes must be a positive integer or None, got {budget!r}")
        cache = self.cross_trainer_cache_size_bytes
        if cache is None:
            object.__setattr__(self, "cross_trainer_cache_size_bytes", DEFAULT_CROSS_TRAINER_CACHE_BYTES)
        elif not isinstance(cache, int) or isinstance(cache, bool) or cache <= 0:
            raise ValueError(f"cross_trainer_cache_size_bytes must be a positive integer or None, got {cache!r}")
        _check_token_file(self.auth_token_file)
        _check_worker_token_file(self)
        if not isinstance(self.dispatcher_address, str) or not self.dispatcher_address:
            raise ValueError(f"dispatcher_address must be 'host:port', got {self.dispatcher_address!r}")
        object.__setattr__(self, "dispatcher_address", strip_protocol(self.dispatcher_address))
        _check_port(self.port)
        object.__setattr__(self, "protocol", _protocol(self.protocol))
        _check_tls(self)
        if self.worker_address is None:
            object.__setattr__(self, "worker_address", "localhost:%port%")
        elif not isinstance(self.worker_address, str) or not self.worker_address:
            raise ValueError(f"worker_address must be 'host:port', got {self.worker_address!r}")
        if self.data_transfer_protocol in (None, "local", "unix"):
            object.__setattr__(self, "data_transfer_protocol", "tcp")
        elif self.data_transfer_protocol not in DATA_TRANSFER_PROTOCOLS:
            raise ValueError(
                "data_transfer_protocol must be None, 'grpc', 'tcp', 'unix' or 'local', "
                f"got {self.data_transfer_protocol!r}"
            )
        tags = self.worker_tags
        if tags is None:
            tags = ()
        if isinstance(tags, str) or not all(isinstance(t, str) and t for t in tags):
            raise ValueError(f"worker_tags must be a list of non-empty strings, got {self.worker_tags!r}")
        object.__setattr__(self, "worker_tags", tuple(tags))
        _check_port(self.data_transfer_port)
        _check_monitoring_port(self.monitoring_port)
        _check_monitoring_security(self)
        if self.data_transfer_address is None:
            host = self.worker_address.rpartition(":")[0] if ":" in self.worker_address else self.worker_address
            object.__setattr__(self, "data_transfer_address", f"{host}:%dts_port%")
        elif not isinstance(self.data_transfer_address, str) or ":" not in self.data_transfer_address:
            raise ValueError(f"data_transfer_address must be 'host:port', got {self.data_transfer_address!r}")
        object.__setattr__(
            self,
            "heartbeat_interval_ms",
            _milliseconds("heartbeat_interval_ms", self.heartbeat_interval_ms, DEFAULT_HEARTBEAT_INTERVAL_MS),
        )
        object.__setattr__(
            self,
            "dispatcher_timeout_ms",
            _milliseconds("dispatcher_timeout_ms", self.dispatcher_timeout_ms, DEFAULT_DISPATCHER_TIMEOUT_MS),
        )


def memory_limit_bytes() -> int:
    """The memory this process may use: its cgroup's limit (a container's memory limit) where it
    has one, else the machine's physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < _NO_CGROUP_LIMIT:
            return min(int(value), physical)
    return physical


def default_memory_budget_bytes() -> int:
    return int(memory_limit_bytes() * DEFAULT_MEMORY_BUDGET_SHARE)
