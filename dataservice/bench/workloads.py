"""Benchmarks: the same workloads through a local pipeline, TensorFlow's own
tf.data service and dataservice, in one process run, reported as ratios.

    python -m dataservice.bench [--quick] [--json FILE] [--workloads 1,2,...,10]

1. scalar int64 elements, 1 worker, parallel_epochs (elements/s)
2. 1 MiB float32 elements, 1 worker, compression None and AUTO (MB/s)
3. distributed_epoch over range(N), 2 workers (elements/s; each element is one split)
4. a latency-bound pipeline (a sleep in every element), 1/2/4 workers (scaling efficiency)
5. time to first element (s)
6. dispatcher recovery: replaying a journal of 100,000 updates (s), raw and with snapshots
7. the dispatcher core at 10 / 100 / 1,000 simulated workers and 200 clients (bench/scale.py)
8. worker heartbeat latency while a 100,000-update state is snapshotted (bench/scale.py)
9. the cost of TLS: workload 2 (compression None) through dataservice with TLS off and on,
   over the TCP transfer and over gRPC (MB/s; certificates made for the run)
10. cross-trainer cache: 1, 2 and 4 trainers reading one job of range(...).repeat() at once,
   1 worker: elements produced per element consumed (the largest element any trainer saw + 1,
   over all elements the trainers took; 1/trainers is perfect sharing), and elements/s read
11. workload 2 (compression None) with the worker on the trainer's host: ours through the
   same-host transport (a Unix socket and a ring of shared memory), TensorFlow's over gRPC
12. 1 MiB float32 elements from an expensive pipeline (random numbers), 1 worker, ours over
   TCP and through the same-host transport (MB/s)
13. images of varying size (uint8, 100-300 KB each), 1 worker, ours over TCP (MB/s)
14. short strings (tf.strings.as_string of the index), 1 worker, ours over TCP (elements/s)
15. 4 clients (threads) each reading range(N) from 4 workers at once, ours over TCP
   (elements/s, all clients together)
16. the numpy client (dataservice.reader.NumpyReader, no TensorFlow bridge) against local
   tf.data's as_numpy_iterator() of the same pipeline: scalars batched by 256 on the worker
   (elements/s) and 1 MiB float32 elements (MB/s) over TCP, and 1 MiB on the trainer's host

--quick stops at 2 workers (workload 4 at 1 and 2, workload 15 from 2): starting two more
worker processes per system takes longer than all its workloads.

TensorFlow's workers run as processes of their own, as ours do (`data-server`
processes), as they would in production; its dispatcher runs in this process
(it is not on the data path). The client of each runs in this process, with
the allocator settings a dataservice client applies when it reads large
elements (`dataservice/transfer/allocator.py`) set from the start, so that both
services' clients run under the same ones. Every server runs on this host:
our client would pick the same-host transport for all of them, so the
workloads that stand for a worker on another host ask ours for TCP.
Nothing here asserts a speed: `--quick` runs each workload in seconds, for a
smoke run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

import dataservice
from dataservice import tf_internal
from dataservice.bench import scale as scale_simulation
from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState
from dataservice.local_cluster import LocalCluster
from dataservice.transfer import allocator
from dataservice.v1 import journal_pb2

tf_service = tf.data.experimental.service
ALL_WORKLOADS = list(range(1, 17))
# The workloads that read two workers and more per service (a second worker is started for them).
TWO_WORKER_WORKLOADS = frozenset({3, 4, 15})
# What a measurement gives: one value, or values by metric name.
Measured = float | dict[str, float]


# A TensorFlow worker process: serves until killed, or until its stdin closes (the benchmark's
# process died, however it died: the kernel closes the pipe's write end).
_TF_WORKER = """
import os, sys, tensorflow as tf
service = tf.data.experimental.service
worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=sys.argv[1]))
print("started", flush=True)
sys.stdin.read()
os._exit(0)
"""


class _TFCluster:
    """TensorFlow's own dispatcher (in this process) and workers (processes of their own)."""

    def __init__(self) -> None:
        self.dispatcher = tf_service.DispatchServer()
        self.workers: list[subprocess.Popen] = []

    @property
    def target(self) -> str:
        return self.dispatcher.target

    def add_workers(self, count: int) -> None:
        """Starts `count` worker processes side by side and waits until all have registered."""
        address = self.dispatcher.target.split("://")[1]
        started = [
            subprocess.Popen(
                [sys.executable, "-c", _TF_WORKER, address],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
            for _ in range(count)
        ]
        self.workers += started
        for worker in started:
            if worker.stdout.readline().strip() != "started":
                raise RuntimeError("a TensorFlow worker process did not start")
        deadline = time.monotonic() + 60
        while self.dispatcher._num_workers() < len(self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError("a TensorFlow worker process did not register")
            time.sleep(0.05)

    def stop(self) -> None:
        for worker in self.workers:
            worker.kill()
            worker.wait(30)
            worker.stdin.close()
        self.dispatcher._stop()


class _OurCluster:
    def __init__(self) -> None:
        self.local = LocalCluster(num_workers=0)

    @property
    def target(self) -> str:
        return self.local.target

    def add_workers(self, count: int) -> None:
        self.local.add_workers(count)

    def stop(self) -> None:
        self.local.stop()


_SYSTEMS = {"tf.data service": _TFCluster, "dataservice": _OurCluster}


def _side_by_side(factories: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """What each factory makes, made at once (each starts processes, mostly importing TensorFlow)."""
    if not factories:
        return {}
    with concurrent.futures.ThreadPoolExecutor(len(factories)) as pool:
        futures = {name: pool.submit(factory) for name, factory in factories.items()}
    return {name: future.result() for name, future in futures.items()}


def _add_workers(clusters: dict[str, Any], count: int) -> None:
    """`count` more workers for every cluster, all started at once."""
    _side_by_side({name: functools.partial(cluster.add_workers, count) for name, cluster in clusters.items()})


# The consumer batches elements so that its Python loop is not the bottleneck: up to
# 256 a batch, and up to BATCH_BYTES. Larger batches of large elements would time the
# consumer: a 256 MiB batch of 1 MiB elements is a fresh mmap that the kernel faults in
# page by page (1.4-2.1 s of system time in a 2-3 s run, with either service).
MAX_BATCH = 256
BATCH_BYTES = 4 * 1024 * 1024


def _count(dataset: tf.data.Dataset, bytes_per_element: int = 0, ragged: bool = False) -> dict[str, float]:
    """Iterates in batches (so the Python loop is not the bottleneck) and times it
    up to the end of sequence (`ragged`: in ragged batches, for elements of varying shapes).
    The iterator is destroyed after the clock stops:
    with autotune on, TensorFlow's iterator destruction can block for a second or
    more whatever the source (seen with local pipelines too), which says nothing
    about the data path.

    "steady_mb_per_s" leaves out the start and the end: the bytes after the first
    batch over the time from the first batch to the last. TensorFlow's client,
    for one, learns that an iteration has ended up to a second after its last
    element, which the time to the end of sequence includes."""
    batch_size = max(1, min(MAX_BATCH, BATCH_BYTES // max(1, bytes_per_element)))
    # Elements of varying shapes go into ragged batches, as a trainer batching them would.
    iterator = iter(dataset.ragged_batch(batch_size) if ragged else dataset.batch(batch_size))
    start = time.perf_counter()
    elements = first_elements = 0
    first_s = last_s = 0.0
    for batch in iterator:
        elements += int(tf.nest.flatten(batch)[0].shape[0])
        last_s = time.perf_counter() - start
        if not first_elements:
            first_elements, first_s = elements, last_s
    seconds = time.perf_counter() - start
    del iterator
    steady_s = last_s - first_s
    return {
        "elements": elements,
        "seconds": seconds,
        "elements_per_s": elements / seconds,
        "mb_per_s": elements * bytes_per_element / seconds / 1e6,
        "steady_mb_per_s": (elements - first_elements) * bytes_per_element / steady_s / 1e6 if steady_s else 0.0,
    }


def _big_rates(counted: dict[str, float]) -> dict[str, float]:
    return {"throughput": counted["mb_per_s"], "steady state": counted["steady_mb_per_s"]}


def _first_element_s(dataset: tf.data.Dataset) -> float:
    start = time.perf_counter()
    iterator = iter(dataset)
    next(iterator)
    elapsed = time.perf_counter() - start
    del iterator
    return elapsed


class Bench:
    def __init__(self, quick: bool):
        self.quick = quick
        self.rows: list[dict] = []

    def record(
        self, workload: str, metric: str, unit: str, values: dict[str, float], higher_is_better: bool = True
    ) -> None:
        ours, theirs = values.get("dataservice"), values.get("tf.data service")
        ratio = None
        if ours and theirs:
            ratio = ours / theirs if higher_is_better else theirs / ours
        row = {"workload": workload, "metric": metric, "unit": unit, "values": values, "ratio_vs_tf_service": ratio}
        self.rows.append(row)
        cells = "  ".join(f"{k}={v:,.3f}" if v < 100 else f"{k}={v:,.0f}" for k, v in values.items())
        print(
            f"{workload:<44} {metric:<22} {cells}  ratio={ratio:.2f}x"
            if ratio
            else f"{workload:<44} {metric:<22} {cells}",
            flush=True,
        )

    def distribute(self, system, cluster, mode: str = "parallel_epochs", **kwargs) -> Callable:
        if system == "dataservice":
            return dataservice.distribute(mode, cluster.target, **kwargs)
        return tf_service.distribute(mode, cluster.target, **kwargs)

    def warm_up(self, clusters: dict[str, object]) -> None:
        """Reads a small dataset through each service, so that workers just started have run a
        first task (imports, first graph optimizations) before anything is timed."""
        for system, cluster in clusters.items():
            for _ in tf.data.Dataset.range(64).apply(self.distribute(system, cluster)):
                pass

    def compare(
        self,
        workload: str,
        metric: str,
        unit: str,
        make: Callable[[int, str], tf.data.Dataset],
        clusters: dict[str, object],
        measure: Callable[[tf.data.Dataset], Measured],
        local: bool = True,
        higher_is_better: bool = True,
        repeats: int = 1,
        pause_s: float = 0.0,
        ours: dict[str, object] | None = None,
        **distribute_kwargs,
    ) -> dict[str, float]:
        """Measures `make(trial, system)` locally and through each service, `repeats` times in
        turn (so that a passing disturbance hits every system alike); the median counts.
        `measure` gives the metric's value, or several metrics' values by name (the first
        is `metric`'s, whose values are returned). `pause_s` between measurements lets
        the previous one's clean-up (iterators, jobs) finish before the next is timed.
        `ours`: distribute() arguments for dataservice alone (a transfer protocol, say)."""
        samples: dict[str, dict[str, list[float]]] = {}

        def add(system: str, measured: Measured) -> None:
            for name, value in (measured if isinstance(measured, dict) else {metric: measured}).items():
                samples.setdefault(name, {}).setdefault(system, []).append(value)

        for trial in range(repeats):
            if local:
                add("local", measure(make(trial, "local")))
            for system, cluster in clusters.items():
                time.sleep(pause_s)
                kwargs = {**distribute_kwargs, **(ours or {})} if system == "dataservice" else distribute_kwargs
                add(system, measure(make(trial, system).apply(self.distribute(system, cluster, **kwargs))))
        medians = {
            name: {system: statistics.median(runs) for system, runs in by_system.items()}
            for name, by_system in samples.items()
        }
        for name, values in medians.items():
            self.record(workload, name, unit, values, higher_is_better)
        return next(iter(medians.values()))


def _job_lifecycle_updates(count: int) -> list[journal_pb2.Update]:
    """`count` updates of a busy dispatcher: distributed_epoch jobs on 4 workers, each
    created, split, read by one client and finished."""
    U = journal_pb2.Update
    updates = [U(register_dataset=journal_pb2.RegisterDatasetUpdate(dataset_id="1", fingerprint="f"))]
    workers = [f"worker-{w}:5051" for w in range(4)]
    updates += [
        U(register_worker=journal_pb2.RegisterWorkerUpdate(worker_address=w, transfer_address=w)) for w in workers
    ]
    job = task = 0
    while len(updates) < count:
        job += 1
        updates.append(
            U(
                create_job=journal_pb2.CreateJobUpdate(
                    job_id=job, dataset_id="1", processing_mode={"sharding_policy": 1}, split_group_sizes=[4096]
                )
            )
        )
        updates.append(U(create_iteration=journal_pb2.CreateIterationUpdate(iteration_id=job, job_id=job)))
        tasks = []
        for w in workers:
            task += 1
            tasks.append(task)
            updates.append(
                U(create_task=journal_pb2.CreateTaskUpdate(task_id=task, iteration_id=job, worker_address=w))
            )
        updates.append(
            U(
                acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(
                    iteration_client_id=job, iteration_id=job
                )
            )
        )
        for index in range(4):
            for t in tasks:
                begin = (index * 4 + t % 4) * 256
                updates.append(
                    U(
                        produce_splits=journal_pb2.ProduceSplitsUpdate(
                            iteration_id=job, split_group=0, begin=begin, end=begin + 256, task_id=t, index=index
                        )
                    )
                )
                if index:
                    updates.append(
                        U(
                            start_splits=journal_pb2.StartSplitsUpdate(
                                iteration_id=job, task_id=t, split_group=0, index=index - 1
                            )
                        )
                    )
        updates += [U(finish_task=journal_pb2.FinishTaskUpdate(task_id=t)) for t in tasks]
        updates.append(U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=job)))
    return updates[:count]


def _recovery_s(updates: list[journal_pb2.Update], snapshot_every: int | None) -> float:
    """Writes `updates` as the dispatcher would (snapshots every `snapshot_every`), then times read + replay."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        # Records are written without a per-record fsync here: the write speed is not what is measured.
        writer = journal.JournalWriter(directory, 0, sync=False)
        state = DispatcherState()
        for i, update in enumerate(updates, 1):
            writer.append(update)
            state.apply(update)
            if snapshot_every and i % snapshot_every == 0:
                writer.snapshot(state.to_updates())
        writer.close()
        start = time.perf_counter()
        DispatcherState.replay(journal.read(directory).updates)
        return time.perf_counter() - start


def run(quick: bool, workloads: list[int], json_path: str | None) -> list[dict]:
    bench = Bench(quick)
    scale = 1 if not quick else 0.05
    # Short measurements vary most: they are repeated and their median reported.
    repeats = 3 if not quick else 1
    latency_repeats = 9 if not quick else 3
    clusters = _side_by_side(_SYSTEMS) if set(workloads) - {6, 7, 8, 9} else {}
    try:
        _add_workers(clusters, 1)
        bench.warm_up(clusters)
        # Element counts by system: TensorFlow's service reads small elements a thousand times slower
        # than the others, and a count that takes it seconds would time our start-up, not our rate.
        n_scalars = {"tf.data service": int(100_000 * scale) or 2000, "other": int(2_000_000 * scale) or 20_000}
        if 1 in workloads:
            bench.compare(
                "1. scalar int64, 1 worker, parallel_epochs",
                "throughput",
                "elements/s",
                lambda trial, system: tf.data.Dataset.range(_sized(n_scalars, system)),
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                repeats=repeats,
                ours=OVER_TCP,
            )
        mib = 1024 * 1024
        n_big = max(20, int(2000 * scale))
        # Workload 2 stands for a worker on another host (ours over TCP), 11 for one on the trainer's.
        filled_runs = []
        if 2 in workloads:
            filled_runs += [
                (f"2. 1 MiB float32 (tf.fill), 1 worker, compression={c}", c, OVER_TCP) for c in (None, "AUTO")
            ]
        if 11 in workloads:
            filled_runs.append(("11. 1 MiB float32 (tf.fill), 1 worker on the trainer's host", None, None))
        for label, compression, ours in filled_runs:
            bench.compare(
                label,
                "throughput",
                "MB/s",
                lambda trial, system: _filled(n_big),
                clusters,
                lambda ds: _big_rates(_count(ds, mib)),
                repeats=repeats,
                compression=compression,
                ours=ours,
            )
        if 12 in workloads:
            n_random = max(20, int(1000 * scale))
            for label, ours in (("over TCP", OVER_TCP), ("on the trainer's host", None)):
                bench.compare(
                    f"12. 1 MiB float32 (random numbers), 1 worker, {label}",
                    "throughput",
                    "MB/s",
                    lambda trial, system: tf.data.Dataset.range(n_random).map(
                        lambda i: tf.random.stateless_uniform([mib // 4], seed=tf.stack([i, 7]))
                    ),
                    clusters,
                    lambda ds: _big_rates(_count(ds, mib)),
                    local=ours is None,
                    repeats=repeats,
                    compression=None,
                    ours=ours,
                )
        if 13 in workloads:
            n_images = max(40, int(4000 * scale))
            bench.compare(
                "13. images of varying size (uint8, 100-300 KB), 1 worker",
                "throughput",
                "MB/s",
                lambda trial, system: _images(n_images),
                clusters,
                lambda ds: _count(ds, _IMAGE_MEAN_BYTES, ragged=True)["mb_per_s"],
                repeats=repeats,
                compression=None,
                ours=OVER_TCP,
            )
        if 14 in workloads:
            n_strings = {"tf.data service": int(50_000 * scale) or 1000, "other": int(500_000 * scale) or 10_000}
            bench.compare(
                "14. short strings, 1 worker",
                "throughput",
                "elements/s",
                lambda trial, system: tf.data.Dataset.range(_sized(n_strings, system)).map(
                    lambda i: tf.strings.join(["token-", tf.strings.as_string(i)])
                ),
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                repeats=repeats,
                ours=OVER_TCP,
            )
        if 16 in workloads:
            _numpy_client(bench, clusters["dataservice"], n_scalars["other"], n_big, repeats)
        if 10 in workloads:
            _cross_trainer_cache(bench, clusters, scale)
        if 5 in workloads:
            # A new pipeline each trial: the first element of a new job, not of a cached one.
            bench.compare(
                "5. time to first element, 1 worker",
                "latency",
                "s",
                lambda trial, system: tf.data.Dataset.range(10**9).map(lambda x: x + trial),
                clusters,
                _first_element_s,
                higher_is_better=False,
                repeats=latency_repeats,
                pause_s=0.5,
            )
        sleep_us = 2000
        n_sleep = int(3000 * scale) or 100
        make_slow = lambda trial, system: tf.data.Dataset.range(n_sleep).apply(tf_internal.sleep(sleep_us))  # noqa: E731
        rates: dict[int, dict[str, float]] = {}
        if 4 in workloads:
            rates[1] = bench.compare(
                "4. sleep 2 ms/element, 1 worker",
                "throughput",
                "elements/s",
                make_slow,
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                repeats=repeats,
            )
        if TWO_WORKER_WORKLOADS & set(workloads):
            _add_workers(clusters, 1)
            bench.warm_up(clusters)
        if 3 in workloads:
            n_split = {"tf.data service": int(200_000 * scale) or 5000, "other": int(2_000_000 * scale) or 50_000}
            bench.compare(
                "3. distributed_epoch range(N), 2 workers",
                "throughput",
                "elements/s",
                lambda trial, system: tf.data.Dataset.range(_sized(n_split, system)),
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                mode="distributed_epoch",
                ours=OVER_TCP,
                repeats=repeats,
            )
        if 4 in workloads:
            rates[2] = bench.compare(
                "4. sleep 2 ms/element, 2 workers",
                "throughput",
                "elements/s",
                make_slow,
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                local=False,
                repeats=repeats,
            )
        # A smoke run (--quick) stops at 2 workers: starting two more worker processes per system
        # takes longer than all its workloads.
        if {4, 15} & set(workloads) and not quick:
            _add_workers(clusters, 2)
            bench.warm_up(clusters)
        if 15 in workloads:
            _four_clients(
                bench,
                clusters,
                {"tf.data service": int(20_000 * scale) or 500, "other": int(500_000 * scale) or 5000},
                workers=2 if quick else 4,
            )
        if 4 in workloads and not quick:
            rates[4] = bench.compare(
                "4. sleep 2 ms/element, 4 workers",
                "throughput",
                "elements/s",
                make_slow,
                clusters,
                lambda ds: _count(ds)["elements_per_s"],
                local=False,
                repeats=repeats,
            )
        if 4 in workloads:
            for k in sorted(rates.keys() - {1}):
                bench.record(
                    f"4. scaling efficiency, {k} workers",
                    "efficiency",
                    "rate_k/(k*rate_1)",
                    {s: rates[k][s] / (k * rates[1][s]) for s in clusters},
                )
    finally:
        for cluster in clusters.values():
            cluster.stop()
    if 6 in workloads:
        updates = _job_lifecycle_updates(100_000 if not quick else 10_000)
        bench.record(
            f"6. recovery, journal of {len(updates):,} updates",
            "replay time",
            "s",
            {"raw journal": _recovery_s(updates, None), "snapshot every 10,000": _recovery_s(updates, 10_000)},
            higher_is_better=False,
        )
    if 7 in workloads:
        for result in scale_simulation.run(worker_counts=(10, 100) if quick else (10, 100, 1000), quick=quick):
            values = {
                "worker heartbeat": result.worker_heartbeat_us,
                "client heartbeat": result.client_heartbeat_us,
                "client heartbeat, every task": result.client_full_heartbeat_us,
                "split request": result.split_request_us,
            }
            if result.journal:
                values["journal appends/s"] = result.journal_appends_per_s
            bench.record(
                f"7. dispatcher core, {result.workers:,} workers, {'' if result.journal else 'no '}journal",
                "CPU per call",
                "us",
                values,
                higher_is_better=False,
            )
    if 8 in workloads:
        # As data-server does once started: what exists now is never collected.
        gc.freeze()
        stall = scale_simulation.snapshot_stall(100_000 if not quick else 10_000)
        bench.record(
            f"8. heartbeats during a snapshot of {stall.updates:,} updates",
            "latency",
            "ms",
            {"p50": stall.heartbeat_p50_ms, "p99": stall.heartbeat_p99_ms, "max": stall.heartbeat_max_ms},
            higher_is_better=False,
        )
    if 9 in workloads:
        _tls_cost(bench, scale, repeats)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"quick": quick, "rows": bench.rows}, f, indent=2)
        print(f"wrote {json_path}")
    return bench.rows


# Workloads that stand for a worker on another host: ours over TCP (every server here is on this host).
OVER_TCP = {"data_transfer_protocol": "tcp"}
# Images of 100-300 KB: 256 pixels wide, 3 channels, 130 to 390 rows.
_IMAGE_ROWS = (130, 391)
_IMAGE_MEAN_BYTES = (_IMAGE_ROWS[0] + _IMAGE_ROWS[1] - 1) // 2 * 256 * 3


def _sized(sizes: dict[str, int], system: str) -> int:
    return sizes.get(system, sizes["other"])


def _filled(count: int) -> tf.data.Dataset:
    """1 MiB float32 elements from a cheap pipeline: each is made, not repeated, but making it costs a fill."""
    return tf.data.Dataset.range(count).map(lambda i: tf.fill([262144], tf.cast(i, tf.float32)))


def _images(count: int) -> tf.data.Dataset:
    """uint8 images of varying height (100-300 KB each), cheap to make."""
    low, high = _IMAGE_ROWS
    return tf.data.Dataset.range(count).map(
        lambda i: tf.fill(tf.stack([low + (i * 7919) % (high - low), 256, 3]), tf.cast(i % 251, tf.uint8))
    )


def _four_clients(bench: Bench, clusters: dict[str, object], sizes: dict[str, int], workers: int) -> None:
    """Four trainers (threads of this process) each read range(N) in parallel_epochs from the
    `workers` workers at once (each gets every worker's N elements); all elements read over the wall time."""
    values: dict[str, float] = {}
    for system, cluster in clusters.items():
        count = _sized(sizes, system)
        kwargs = OVER_TCP if system == "dataservice" else {}
        # One pipeline, read by four clients: four anonymous jobs.
        datasets = [tf.data.Dataset.range(count).apply(bench.distribute(system, cluster, **kwargs)) for _ in range(4)]
        read = [0] * 4
        threads = [threading.Thread(target=_consume, args=(d, read, k)) for k, d in enumerate(datasets)]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        values[system] = sum(read) / (time.perf_counter() - began)
    bench.record(f"15. 4 clients reading {workers} workers at once", "throughput", "elements/s, all clients", values)


def _numpy_rate(elements: Any, element_bytes: int) -> dict[str, float]:
    """Elements (rows of the batches) per second and MB/s of iterating `elements` to the end."""
    start = time.perf_counter()
    count = 0
    for element in elements:
        count += len(element) if element_bytes == 8 else 1
    seconds = time.perf_counter() - start
    return {"elements_per_s": count / seconds, "mb_per_s": count * element_bytes / seconds / 1e6}


def _numpy_client(bench: Bench, cluster: Any, n_scalars: int, n_big: int, repeats: int) -> None:
    """16: NumpyReader (a trainer without TensorFlow, no numpy_function bridge) against local
    tf.data's as_numpy_iterator() of the same pipeline, both iterated element by element."""
    from dataservice.reader import NumpyReader

    mib = 1024 * 1024
    rows = (
        (
            "16. numpy client: scalars batched by 256, over TCP",
            tf.data.Dataset.range(n_scalars).batch(256),
            8,
            OVER_TCP,
        ),
        ("16. numpy client: 1 MiB float32 (tf.fill), over TCP", _filled(n_big), mib, OVER_TCP),
        ("16. numpy client: 1 MiB float32 (tf.fill), on the trainer's host", _filled(n_big), mib, {}),
    )
    for label, dataset, element_bytes, transfer in rows:
        dataset_id = dataservice.register_dataset(cluster.target, dataset, compression=None).numpy().decode()
        samples: dict[str, list[float]] = {"local": [], "dataservice": []}
        metric = "elements_per_s" if element_bytes == 8 else "mb_per_s"
        for _ in range(repeats):
            samples["local"].append(_numpy_rate(dataset.as_numpy_iterator(), element_bytes)[metric])
            with NumpyReader(cluster.target, dataset_id, **transfer) as reader:
                samples["dataservice"].append(_numpy_rate(reader, element_bytes)[metric])
        values = {system: statistics.median(runs) for system, runs in samples.items()}
        bench.record(label, "throughput", "elements/s" if element_bytes == 8 else "MB/s", values)


def _consume(dataset: tf.data.Dataset, read: list[int], index: int) -> None:
    for batch in dataset.batch(MAX_BATCH):
        read[index] += int(batch.shape[0])


def _cross_trainer_cache(bench: Bench, clusters: dict[str, Any], scale: float) -> None:
    """Trainers in threads, each with its own trainer_id, read one named job of an infinite range
    at the same time (from the clusters' one worker). The elements are the source's indices in
    order, so the largest one any trainer saw bounds from below what the worker produced, the
    same way for both services."""
    per_trainer = int(20_000 * scale) or 1000
    for trainers in (1, 2, 4):
        ratios: dict[str, float] = {}
        rates: dict[str, float] = {}
        for system, cluster in clusters.items():
            cache_class = tf_service.CrossTrainerCache if system == "tf.data service" else dataservice.CrossTrainerCache
            seen: list[int] = []
            job_name = f"cache-{trainers}"
            threads = [
                threading.Thread(
                    target=_read_as_trainer,
                    args=(
                        bench.distribute(
                            system, cluster, job_name=job_name, cross_trainer_cache=cache_class(trainer_id=f"t{i}")
                        ),
                        per_trainer,
                        seen,
                    ),
                )
                for i in range(trainers)
            ]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rates[system] = trainers * per_trainer / (time.perf_counter() - began)
            ratios[system] = (max(seen) + 1) / (trainers * per_trainer)
        bench.record(
            f"10. cross-trainer cache, {trainers} trainer{'s' if trainers > 1 else ''}",
            "produced/consumed",
            "elements",
            ratios,
            higher_is_better=False,
        )
        bench.record(
            f"10. cross-trainer cache, {trainers} trainer{'s' if trainers > 1 else ''}",
            "throughput",
            "elements/s, all trainers",
            rates,
        )


def _read_as_trainer(distribute: Callable, count: int, seen: list[int]) -> None:
    """Reads `count` elements of an infinite range through `distribute`; appends the largest."""
    largest = 0
    for batch in tf.data.Dataset.range(10**12).repeat().apply(distribute).take(count).batch(MAX_BATCH):
        largest = max(largest, int(tf.reduce_max(batch)))
    seen.append(largest)


def _tls_cost(bench: Bench, scale: float, repeats: int) -> None:
    """Workload 2 through a plaintext and a TLS cluster of ours (data-server processes that trust
    a CA made for the run), over the TCP transfer and over gRPC."""
    from dataservice.bench.certificates import make_certificates
    from dataservice.rpc import tls

    mib = 1024 * 1024
    n_big = max(20, int(1000 * scale))
    payload = tf.random.stateless_uniform([mib // 4], seed=[1, 2])
    make_big = lambda trial: tf.data.Dataset.from_tensors(payload).repeat(n_big)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="dataservice-bench-certs-") as directory:
        certs = make_certificates(directory)
        previous = os.environ.get(tls.CA_ENV)
        os.environ[tls.CA_ENV] = certs.ca_file  # for the worker processes and this client
        options = {
            "protocol": "grpc+tls",
            "tls_cert_file": certs.server_cert_file,
            "tls_key_file": certs.server_key_file,
        }
        clusters = _side_by_side(
            {
                "plaintext": lambda: LocalCluster(num_workers=1),
                "tls": lambda: LocalCluster(num_workers=1, dispatcher_options=options, worker_options=options),
            }
        )
        try:
            for transfer in ("tcp", "grpc"):
                samples: dict[str, list[float]] = {}
                for _ in range(repeats):
                    for name, cluster in clusters.items():
                        dataset = make_big(0).apply(
                            dataservice.distribute(
                                "parallel_epochs", cluster.target, compression=None, data_transfer_protocol=transfer
                            )
                        )
                        samples.setdefault(name, []).append(_big_rates(_count(dataset, mib))["throughput"])
                values = {name: statistics.median(runs) for name, runs in samples.items()}
                values["tls/plaintext"] = values["tls"] / values["plaintext"]
                bench.record(f"9. 1 MiB float32, TLS off/on, {transfer} transfer", "throughput", "MB/s", values)
        finally:
            for cluster in clusters.values():
                cluster.stop()
            if previous is None:
                os.environ.pop(tls.CA_ENV, None)
            else:
                os.environ[tls.CA_ENV] = previous


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="dataservice vs TensorFlow's tf.data service")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds per workload")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument(
        "--workloads", default=",".join(map(str, ALL_WORKLOADS)), help="comma-separated workload numbers"
    )
    args = parser.parse_args(argv)
    try:
        workloads = sorted({int(w) for w in args.workloads.split(",")})
    except ValueError:
        parser.error(f"--workloads must be numbers 1-{ALL_WORKLOADS[-1]}, got {args.workloads!r}")
    if not set(workloads) <= set(ALL_WORKLOADS):
        parser.error(f"--workloads must be numbers 1-{ALL_WORKLOADS[-1]}, got {args.workloads!r}")
    allocator.keep_freed_memory_in_client()
    run(args.quick, workloads, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
