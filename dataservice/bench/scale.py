"""The dispatcher at scale, simulated: its core driven in one process by many workers and clients.

The transport-free DispatcherCore makes this possible without sockets: N
simulated workers register and heartbeat, 200 clients (20 named
distributed_epoch jobs, 10 clients each; `clients_per_job` changes it)
heartbeat, and the jobs' tasks ask for split ranges, round after round,
exactly as the gRPC servicer would call the core. For each N the CPU time per
worker heartbeat, per client heartbeat and per split request is measured
(time.process_time: what the dispatcher's Python spends, the quantity that
caps how many peers one dispatcher serves), with and without a journal; with
a journal, appends per second (each append is fsynced: the disk's latency,
not the CPU, bounds it). Client heartbeats are measured twice: as clients
send them, with the tasks_version of their last answer (the answer holds only
the tasks that changed: none, between rounds), and with none (every task of
the iteration, as a client's first heartbeat and every heartbeat before
deltas), with p50 and p99 of each call's wall time.

    python -m dataservice.bench --workloads 7
    python -m dataservice.bench.scale 1000 10000 --clients-per-job 50   # 1,000 clients
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
import tempfile
import threading
import time
from collections.abc import Callable

import tensorflow as tf

from dataservice.config import DispatcherConfig
from dataservice.dispatcher import journal
from dataservice.dispatcher.core import DispatcherCore
from dataservice.pipeline import graph as graph_lib
from dataservice.v1 import common_pb2, dispatcher_pb2

NUM_JOBS = 20
CLIENTS_PER_JOB = 10
# Splits of the simulated source: enough that no job runs out while it is measured.
NUM_SPLITS = 10**9
# The snapshot-stall measurement's heartbeats: 100 a second (100 workers at the default interval).
HEARTBEAT_PERIOD_S = 0.01


class _Clock:
    """Simulated time: each round advances it, so that nobody times out between rounds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class ScaleResult:
    workers: int
    clients: int
    journal: bool
    tasks: int
    worker_heartbeat_us: float
    # CPU per client heartbeat with the last answer's tasks_version, and with none (every task).
    client_heartbeat_us: float
    client_full_heartbeat_us: float
    # Wall time per client heartbeat call (ms): p50 and p99, with and without the version.
    client_heartbeat_ms: tuple[float, float]
    client_full_heartbeat_ms: tuple[float, float]
    split_request_us: float
    # Journal appends (fsynced) per second of wall time while split requests ran; 0 without a journal.
    journal_appends_per_s: float


def _cpu_us(calls: list[Callable[[], object]]) -> float:
    """CPU microseconds per call, over all of `calls`."""
    start = time.process_time()
    for call in calls:
        call()
    return (time.process_time() - start) / max(1, len(calls)) * 1e6


def _percentiles_ms(calls: list[Callable[[], object]]) -> tuple[float, float]:
    """p50 and p99 of each call's wall time, in milliseconds."""
    times = []
    for call in calls:
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def simulate(
    num_workers: int,
    rounds: int = 3,
    split_requests_per_round: int = 2000,
    journal_dir: pathlib.Path | None = None,
    clients_per_job: int = CLIENTS_PER_JOB,
) -> ScaleResult:
    """One run at `num_workers` workers; see the module docstring."""
    clock = _Clock()
    writer = journal.JournalWriter(journal_dir, 0) if journal_dir is not None else None
    config = DispatcherConfig(worker_timeout_ms=10**9, client_timeout_ms=10**9, job_gc_timeout_ms=10**9)
    core = DispatcherCore(config, "simulated:0", journal=writer, clock=clock, compact_every=10**9)
    try:
        workers = [f"worker-{i}:5000" for i in range(num_workers)]
        for address in workers:
            core.worker_heartbeat(dispatcher_pb2.WorkerHeartbeatRequest(worker_address=address))
        source = tf.data.Dataset.range(NUM_SPLITS)
        metadata = common_pb2.DatasetMetadata(
            element_spec=graph_lib.encode_element_spec(source.element_spec), cardinality=NUM_SPLITS
        )
        dataset_id = core.register_dataset(
            dispatcher_pb2.RegisterDatasetRequest(graph_def=graph_lib.serialize_dataset(source), metadata=metadata)
        ).dataset_id
        clients: list[int] = []
        keys: dict[int, str] = {}  # each client's iteration read key

        versions: dict[int, int] = {}  # each client's last answer's tasks_version

        def client_request(client: int, version: int = 0) -> dispatcher_pb2.ClientHeartbeatRequest:
            return dispatcher_pb2.ClientHeartbeatRequest(
                iteration_client_id=client, read_key=keys[client], tasks_version=version
            )

        iterations: list[int] = []
        for job in range(NUM_JOBS):
            job_id = core.get_or_create_job(
                dispatcher_pb2.GetOrCreateJobRequest(
                    dataset_id=dataset_id,
                    processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_DYNAMIC),
                    job_name=f"job-{job}",
                )
            ).job_id
            for _ in range(clients_per_job):
                response = core.get_or_create_iteration(
                    dispatcher_pb2.GetOrCreateIterationRequest(job_id=job_id, repetition=0)
                )
                clients.append(response.iteration_client_id)
                keys[response.iteration_client_id] = response.read_key
            iterations.append(response.iteration_id)
        # Each worker runs one task of every job; a task asks for ranges 0, 1, 2, ... in turn.
        tasks_of: dict[str, list[int]] = {address: [] for address in workers}
        task_iteration: dict[int, int] = {}
        for client in clients[::clients_per_job]:
            for info in core.client_heartbeat(client_request(client)).tasks:
                tasks_of[info.worker_address].append(info.task_id)
        for client in clients:
            versions[client] = core.client_heartbeat(client_request(client)).tasks_version
        for iteration_id, client in zip(iterations, clients[::clients_per_job]):
            heartbeat = core.client_heartbeat(client_request(client))
            for info in heartbeat.tasks:
                task_iteration[info.task_id] = iteration_id
        next_index = dict.fromkeys(task_iteration, 0)
        rng = random.Random(num_workers)
        all_tasks = sorted(task_iteration)

        def worker_heartbeat(address: str) -> Callable[[], object]:
            request = dispatcher_pb2.WorkerHeartbeatRequest(worker_address=address, current_tasks=tasks_of[address])
            return lambda: core.worker_heartbeat(request)

        def client_heartbeat(client: int, full: bool = False) -> Callable[[], object]:
            request = client_request(client, 0 if full else versions[client])

            def call() -> None:
                response = core.client_heartbeat(request)
                if not full:
                    versions[client] = response.tasks_version

            return call

        def split_request(task: int) -> Callable[[], object]:
            index = next_index[task]
            next_index[task] += 1
            request = dispatcher_pb2.GetSplitsRequest(
                iteration_id=task_iteration[task], task_id=task, split_group=0, repetition=0, index=index
            )
            return lambda: core.get_splits(request)

        worker_us, client_us, full_us, split_us, appends_per_s = [], [], [], [], []
        for _ in range(rounds):
            clock.now += 1.0
            worker_us.append(_cpu_us([worker_heartbeat(a) for a in workers]))
            client_us.append(_cpu_us([client_heartbeat(c) for c in clients]))
            full_us.append(_cpu_us([client_heartbeat(c, full=True) for c in clients]))
            requests = [split_request(rng.choice(all_tasks)) for _ in range(split_requests_per_round)]
            appended, wall_start = writer.appended if writer else 0, time.perf_counter()
            split_us.append(_cpu_us(requests))
            if writer is not None:
                # A split request journals the range it hands out and, after the first, that the last one started.
                appends_per_s.append((writer.appended - appended) / (time.perf_counter() - wall_start))
        client_ms = _percentiles_ms([client_heartbeat(c) for c in clients])
        full_ms = _percentiles_ms([client_heartbeat(c, full=True) for c in clients])
        core.validate()
        return ScaleResult(
            workers=num_workers,
            clients=len(clients),
            journal=writer is not None,
            tasks=len(all_tasks),
            worker_heartbeat_us=sorted(worker_us)[len(worker_us) // 2],
            client_heartbeat_us=sorted(client_us)[len(client_us) // 2],
            client_full_heartbeat_us=sorted(full_us)[len(full_us) // 2],
            client_heartbeat_ms=client_ms,
            client_full_heartbeat_ms=full_ms,
            split_request_us=sorted(split_us)[len(split_us) // 2],
            journal_appends_per_s=sorted(appends_per_s)[len(appends_per_s) // 2] if appends_per_s else 0.0,
        )
    finally:
        if writer is not None:
            writer.close()


def run(worker_counts=(10, 100, 1000), quick: bool = False) -> list[ScaleResult]:
    """simulate() at each worker count, without and with a journal (in a temporary directory)."""
    results = []
    for num_workers in worker_counts:
        results.append(simulate(num_workers, rounds=1 if quick else 3, split_requests_per_round=200 if quick else 2000))
        with tempfile.TemporaryDirectory(prefix="dataservice-scale-") as tmp:
            results.append(
                simulate(
                    num_workers,
                    rounds=1 if quick else 3,
                    split_requests_per_round=100 if quick else 500,
                    journal_dir=pathlib.Path(tmp),
                )
            )
    return results


@dataclasses.dataclass
class SnapshotStall:
    updates: int
    snapshot_s: float
    heartbeat_p50_ms: float
    heartbeat_p99_ms: float
    heartbeat_max_ms: float
    heartbeats: int


def snapshot_stall(target_updates: int = 100_000, journal_dir: pathlib.Path | None = None) -> SnapshotStall:
    """Worker heartbeat latency while the dispatcher snapshots a state of about `target_updates`
    updates: heartbeats scheduled every HEARTBEAT_PERIOD_S from a request that triggers the
    snapshot until the snapshot is on disk."""
    with tempfile.TemporaryDirectory(prefix="dataservice-snapshot-") as tmp:
        directory = journal_dir or pathlib.Path(tmp)
        writer = journal.JournalWriter(directory, 0, sync=False)
        config = DispatcherConfig(worker_timeout_ms=10**9, client_timeout_ms=10**9, job_gc_timeout_ms=10**9)
        core = DispatcherCore(config, "simulated:0", journal=writer, clock=_Clock(), compact_every=10**9)
        workers = [f"worker-{i}:5000" for i in range(500)]
        for address in workers:
            core.worker_heartbeat(dispatcher_pb2.WorkerHeartbeatRequest(worker_address=address))
        source = tf.data.Dataset.range(10)
        metadata = common_pb2.DatasetMetadata(element_spec=graph_lib.encode_element_spec(source.element_spec))
        dataset_id = core.register_dataset(
            dispatcher_pb2.RegisterDatasetRequest(graph_def=graph_lib.serialize_dataset(source), metadata=metadata)
        ).dataset_id
        jobs = 0
        while writer.appended < target_updates:
            job_id = core.get_or_create_job(
                dispatcher_pb2.GetOrCreateJobRequest(dataset_id=dataset_id, job_name=f"job-{jobs}")
            ).job_id
            core.get_or_create_iteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=job_id))
            jobs += 1
        updates = writer.appended
        # (intended time, latency) of heartbeats scheduled every HEARTBEAT_PERIOD_S. Latency counts from
        # the intended time, so that a heartbeat held up by a stall also delays, and is charged to,
        # the ones scheduled behind it (as heartbeats from many workers would be).
        samples: list[tuple[float, float]] = []
        done = threading.Event()

        def heartbeats() -> None:
            request = dispatcher_pb2.WorkerHeartbeatRequest(worker_address=workers[0])
            start, period, i = time.perf_counter(), HEARTBEAT_PERIOD_S, 0
            while not done.is_set():
                intended = start + i * period
                wait = intended - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                core.worker_heartbeat(request)
                samples.append((intended, time.perf_counter() - intended))
                i += 1

        thread = threading.Thread(target=heartbeats)
        thread.start()
        time.sleep(0.2)
        began = time.perf_counter()
        core.compact_journal_soon()
        core.get_or_create_job(dispatcher_pb2.GetOrCreateJobRequest(dataset_id=dataset_id, job_name="trigger"))
        core.wait_for_journal_compaction(timeout_s=120)
        snapshot_s = time.perf_counter() - began
        time.sleep(0.2)
        done.set()
        thread.join()
        writer.close()
        latencies = [latency for intended, latency in samples if began <= intended <= began + snapshot_s]
        ordered = sorted(latencies)
        return SnapshotStall(
            updates=updates,
            snapshot_s=snapshot_s,
            heartbeat_p50_ms=ordered[len(ordered) // 2] * 1000,
            heartbeat_p99_ms=ordered[int(len(ordered) * 0.99)] * 1000,
            heartbeat_max_ms=ordered[-1] * 1000,
            heartbeats=len(ordered),
        )


def main(argv: list[str] | None = None) -> None:
    """Prints simulate() at the worker counts given, without a journal (the CPU the core spends)."""
    import argparse

    parser = argparse.ArgumentParser(description="the dispatcher core at scale, simulated")
    parser.add_argument("workers", type=int, nargs="+", help="simulated worker counts")
    parser.add_argument("--clients-per-job", type=int, default=CLIENTS_PER_JOB, help=f"{NUM_JOBS} jobs")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--split-requests", type=int, default=200, help="per round")
    args = parser.parse_args(argv)
    for num_workers in args.workers:
        r = simulate(num_workers, args.rounds, args.split_requests, clients_per_job=args.clients_per_job)
        print(
            f"{r.workers:>6,} workers {r.clients:>5,} clients {r.tasks:>7,} tasks | worker heartbeat "
            f"{r.worker_heartbeat_us:7.1f} us | client heartbeat: deltas {r.client_heartbeat_us:7.1f} us CPU, "
            f"p50/p99 {r.client_heartbeat_ms[0]:.3f}/{r.client_heartbeat_ms[1]:.3f} ms; every task "
            f"{r.client_full_heartbeat_us:8.1f} us CPU, p50/p99 {r.client_full_heartbeat_ms[0]:.3f}/"
            f"{r.client_full_heartbeat_ms[1]:.3f} ms | split request {r.split_request_us:6.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
