"""A client's membership of one iteration: creating it, heartbeating, releasing it.

The dispatcher learns from the heartbeats that the client is alive (a silent
client is released after client_timeout_ms) and answers with the iteration's
tasks that changed since its last answer (all of them the first time, and after
the dispatcher restarts), whether it is finished and, for coordinated reads,
how far the client may read. Readers (streaming or coordinated) get each answer
through a callback.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

from dataservice import modes, status
from dataservice.rpc.dispatcher_client import DispatcherClient, ReadingTotals, TaskPosition
from dataservice.rpc.tls import TlsFiles
from dataservice.transfer import local
from dataservice.v1 import common_pb2, dispatcher_pb2

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
_NO_WORKERS_WARNING_S = 10.0


class JobSpec:
    """What a client asks the dispatcher for: which job, and how it is read."""

    def __init__(
        self,
        dataset_id: str,
        sharding_policy: common_pb2.ShardingPolicy,
        job_name: str | None,
        num_consumers: int | None,
        target_workers: common_pb2.TargetWorkers,
        trainer_id: str = "",
    ):
        self.dataset_id = dataset_id
        self.sharding_policy = sharding_policy
        self.job_name = job_name or ""
        self.num_consumers = num_consumers or 0
        self.target_workers = target_workers
        # Cross-trainer cache: the trainer this client reads for ("": no cache).
        self.trainer_id = trainer_id

    def request(self) -> dispatcher_pb2.GetOrCreateJobRequest:
        return dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=self.dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=self.sharding_policy),
            job_name=self.job_name,
            num_consumers=self.num_consumers,
            target_workers=self.target_workers,
            use_cross_trainer_cache=bool(self.trainer_id),
        )


# ioctl SIOCGIFADDR: an interface's (first) IPv4 address.
_SIOCGIFADDR = 0x8915


def _interface_addresses() -> set[str]:
    """The addresses of this network namespace's interfaces (IPv4 by ioctl, IPv6 from
    /proc/net/if_inet6): what a worker on this host may advertise. The host name's addresses
    are not enough: containers and network namespaces share a name but not addresses."""
    addresses: set[str] = set()
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return addresses
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
            addresses.add(socket.inet_ntoa(packed[20:24]))
    try:
        with open("/proc/net/if_inet6") as lines:
            for line in lines:
                digits = line.split()[0]
                addresses.add(str(ipaddress.IPv6Address(bytes.fromhex(digits))))
    except (OSError, ValueError, IndexError):
        pass
    return addresses


@functools.lru_cache(maxsize=1)
def _local_hosts() -> frozenset[str]:
    names = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name.lower())
        try:
            names.update(socket.gethostbyname_ex(name)[2])
        except OSError:
            pass
    names.update(_interface_addresses())
    # As an address names them in "host:port": "[v6]:port".
    names.update(f"[{address}]" for address in list(names) if ":" in address and not address.startswith("["))
    return frozenset(names)


def is_local_worker(address: str) -> bool:
    """Whether a worker runs in this process or its address names this host (target_workers='LOCAL')."""
    if local.find(address) is not None:
        return True
    host = address.rsplit(":", 1)[0].lower() if ":" in address else address.lower()
    return host in _local_hosts() or host.startswith("127.")


COLOCATED = "COLOCATED"


def tasks_to_read(
    tasks: Sequence[common_pb2.TaskInfo], target_workers: common_pb2.TargetWorkers
) -> list[common_pb2.TaskInfo]:
    """The tasks a client reads: LOCAL, those on workers of this process or host; AUTO, every
    task except those on another host's COLOCATED workers (as TensorFlow's client); ANY, all."""
    if target_workers == common_pb2.TARGET_WORKERS_LOCAL:
        return [t for t in tasks if is_local_worker(t.worker_address)]
    if target_workers == common_pb2.TARGET_WORKERS_AUTO:
        return [t for t in tasks if COLOCATED not in t.worker_tags or is_local_worker(t.worker_address)]
    return list(tasks)


class IterationSession:
    def __init__(
        self,
        dispatcher_address: str,
        job: JobSpec,
        repetition: int,
        timeout_s: float,
        on_heartbeat: Callable[[dispatcher_pb2.ClientHeartbeatResponse], None],
        on_error: Callable[[BaseException], None],
        current_round: Callable[[], int] = lambda: 0,
        consumed_tasks: Callable[[], Sequence[int]] = lambda: (),
        reading: Callable[[], ReadingTotals] = ReadingTotals,
        tls: TlsFiles | None = None,
        resume_from: Sequence[TaskPosition] | None = None,
    ):
        """`resume_from`: the per-task positions of a saved iterator, which a new
        iteration continues from (ResumeIteration), instead of joining repetition `repetition`."""
        self._address = dispatcher_address
        self.timeout_s = timeout_s
        self._target_workers = modes.reading_target(job.sharding_policy, job.target_workers)
        self._static = job.sharding_policy in modes.STATIC_POLICIES
        # Set once target_workers has left some of the iteration's tasks to other clients.
        self.reads_some_tasks = False
        self._on_heartbeat = on_heartbeat
        self._on_error = on_error
        self._current_round = current_round
        self._consumed_tasks = consumed_tasks
        self._reading = reading
        self._dispatcher = DispatcherClient(dispatcher_address, timeout_s, shared=True, tls=tls)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.repetition = repetition
        # A resumed iteration's tasks at its start.
        self.resumed_tasks: list[int] = []
        # The iteration's tasks as the heartbeats told them, and the version they bring it to.
        self._tasks: dict[int, common_pb2.TaskInfo] = {}
        self._tasks_version = 0
        try:
            if resume_from is not None:
                resumed = self._dispatcher.resume_iteration(job.request(), resume_from)
                self.repetition = resumed.repetition
                self.resumed_tasks = list(resumed.task_ids)
                iteration = resumed
            else:
                job_id = self._dispatcher.get_or_create_job(job.request())
                iteration = self._dispatcher.get_or_create_iteration(job_id, repetition)
        except BaseException:
            self._dispatcher.close()
            raise
        self.client_id = iteration.iteration_client_id
        # The iteration's secret: workers serve its tasks, and the dispatcher answers for this
        # client, only to requests that carry it (read_keys.py).
        self.read_key = iteration.read_key
        self._waiting_since = time.monotonic()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The first heartbeat (here, so that its errors reach the caller), then a thread for the rest."""
        try:
            self._heartbeat()
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="client-heartbeat", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Heartbeats now rather than at the next interval."""
        self._wake.set()

    @property
    def stopped(self) -> threading.Event:
        return self._stop

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(HEARTBEAT_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._heartbeat()
            except status.ServiceError as e:
                self._on_error(e)
                return

    def _heartbeat(self) -> None:
        response = self._dispatcher.client_heartbeat(
            self.client_id,
            self._current_round(),
            self._consumed_tasks(),
            self._reading(),
            read_key=self.read_key,
            tasks_version=self._tasks_version,
        )
        # The answer holds the tasks that changed since the last one (all of them the first
        # time, or after the dispatcher restarted): merged into what this client knows.
        for task in response.tasks:
            self._tasks[task.task_id] = task
        self._tasks_version = response.tasks_version
        known = list(self._tasks.values())
        chosen = tasks_to_read(known, self._target_workers)
        if len(chosen) != len(known):
            # Tasks left to others: this client is done when its own tasks are, not when the
            # iteration is.
            self.reads_some_tasks = True
            if not chosen and self._target_workers == common_pb2.TARGET_WORKERS_LOCAL:
                # InvalidArgument, as TensorFlow's client says it.
                workers = ", ".join(sorted(t.worker_address for t in known))
                if self._static:
                    raise status.InvalidArgumentError(
                        "static sharding reads the workers on this host (each keeps its own shard), but none of "
                        f"the iteration's workers runs on this host ({workers}): start a worker here"
                    )
                raise status.InvalidArgumentError(
                    f"target_workers='LOCAL', but none of the iteration's workers runs on this host ({workers}): "
                    "start a worker here, or read with target_workers='ANY'"
                )
            changed = tasks_to_read(response.tasks, self._target_workers)
            del response.tasks[:]
            response.tasks.extend(changed)
        self._on_heartbeat(response)
        if not known and time.monotonic() - self._waiting_since > _NO_WORKERS_WARNING_S:
            log.warning(
                "no worker has a task for this iteration yet: are workers registered with the dispatcher at %s?",
                self._address,
            )
            self._waiting_since = time.monotonic()

    def close(self) -> None:
        """Stops heartbeating and releases this client at the dispatcher (best effort)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        try:
            self._dispatcher.release_iteration_client(self.client_id, timeout_s=2, read_key=self.read_key)
        except status.ServiceError as e:
            log.debug("releasing iteration client %d failed: %s", self.client_id, e.message)
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._dispatcher.close()
