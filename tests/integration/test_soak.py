"""A soak: four client processes run short jobs back to back (both processing modes, some named,
some checkpointed and resumed) against a fault-tolerant dispatcher and two workers, all
`data-server` processes, while the test measures at intervals the dispatcher's RSS, the size of
a journal snapshot of its state and the time to replay it, the jobs it holds and the workers'
RSS. Over the second half each series must be flat within noise: the slope of a Theil-Sen line,
times the half's duration, stays within a tolerance of the series' level. Without
retention (iteration_retention_ms) the snapshot, its replay and the jobs held grow with every
job. The time to replay the journal as it is (the last snapshot and the segments after it) is
printed too: it rises between snapshots (every 10,000 updates) and falls at each.

CI runs it for --soak-seconds (30); `pytest tests/integration/test_soak.py --soak-seconds=3600
--timeout=4000 -s`
is the hour-long run whose figures README gives."""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time

import psutil

from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState
from dataservice.local_cluster import LocalCluster
from dataservice.rpc.dispatcher_client import DispatcherClient

CLIENTS = 4
SAMPLE_EVERY_S = 2.0

# One client process: jobs until its time is up, each checked element for element; prints how
# many it ran.
_CLIENT = r"""
import os, sys, tempfile, time
import tensorflow as tf
import dataservice as service

target, seconds, index = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + seconds
source = tf.data.Dataset.range(20)
jobs = 0
with tempfile.TemporaryDirectory() as scratch:
    while time.monotonic() < deadline:
        mode = "distributed_epoch" if jobs % 2 else "parallel_epochs"
        named = {"job_name": f"soak-{index}-{jobs}"} if jobs % 3 == 0 else {}
        dataset = source.apply(service.distribute(mode, target, **named))
        expected = list(range(20)) * (1 if mode == "distributed_epoch" else 2)  # two workers
        iterator = iter(dataset)
        if jobs % 5 == 0:  # checkpointed after a few elements, and resumed from the checkpoint
            read = [int(next(iterator)) for _ in range(5)]
            path = tf.train.Checkpoint(iterator=iterator).save(os.path.join(scratch, f"ckpt-{jobs}"))
            # Restored while the saved iterator still holds its iteration: released first, the
            # iteration could be dropped by the soak's 2 s retention before a slow restore.
            restored = iter(source.apply(service.distribute(mode, target, **named)))
            tf.train.Checkpoint(iterator=restored).restore(path)
            read += [int(next(restored))]
            del iterator
            iterator = restored
            read += [int(x) for x in iterator]
        else:
            read = [int(x) for x in iterator]
        assert sorted(read) == sorted(expected), (mode, named, sorted(read))
        del iterator
        jobs += 1
print(jobs, flush=True)
"""


@dataclasses.dataclass
class Sample:
    at_s: float
    dispatcher_rss_mib: float
    workers_rss_mib: float
    state_kib: float  # a journal snapshot taken now: the live state's updates
    state_replay_ms: float  # replaying that snapshot
    journal_replay_ms: float  # replaying the journal as it is (the last snapshot and the segments after it)
    jobs_held: int


def _replay(journal_dir) -> tuple[float, float, float]:
    """Replays the journal as a restarting dispatcher would (retried when the dispatcher
    replaces a snapshot under the read): the time that took, the size of the snapshot of the
    state it gave, and the time to replay that snapshot."""
    for _ in range(5):
        started = time.perf_counter()
        try:
            state = DispatcherState.replay(journal.read(journal_dir).updates)
        except (OSError, journal.JournalCorruptError):
            time.sleep(0.1)
            continue
        journal_ms = (time.perf_counter() - started) * 1000
        snapshot = state.to_updates()
        started = time.perf_counter()
        DispatcherState.replay(snapshot)
        snapshot_ms = (time.perf_counter() - started) * 1000
        return journal_ms, sum(u.ByteSize() for u in snapshot) / 1024, snapshot_ms
    raise AssertionError("the journal could not be read five times running")


def _rise_over_half(series: list[tuple[float, float]]) -> float:
    """How much the Theil-Sen line through (time, value) rises over the span of `series`: its
    slope is the median of the slopes between every two samples, which one slow sample (a
    pause of the machine) does not move as it moves a least-squares line."""
    slopes = [(v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(series) for t2, v2 in series[i + 1 :] if t2 > t1]
    return statistics.median(slopes) * (series[-1][0] - series[0][0])


def test_state_and_memory_stay_flat_over_many_jobs(tmp_path, request):
    seconds = request.config.getoption("--soak-seconds")
    options = {
        "iteration_retention_ms": 2_000,
        "job_gc_timeout_ms": 500,
        "job_gc_check_interval_ms": 200,
    }
    with LocalCluster(
        2, processes=True, fault_tolerant_mode=True, work_dir=str(tmp_path), dispatcher_options=options
    ) as cluster:
        servers = [psutil.Process(cluster.dispatcher.proc.pid)] + [psutil.Process(w.proc.pid) for w in cluster.workers]
        journal_dir = journal.directory_of(str(tmp_path))
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", _CLIENT, cluster.target, str(seconds), str(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(CLIENTS)
        ]
        samples: list[Sample] = []
        started = time.monotonic()
        try:
            with DispatcherClient(cluster.address, 10) as dispatcher:
                while any(c.poll() is None for c in clients):
                    time.sleep(SAMPLE_EVERY_S)
                    journal_ms, state_kib, state_ms = _replay(journal_dir)
                    samples.append(
                        Sample(
                            at_s=time.monotonic() - started,
                            dispatcher_rss_mib=servers[0].memory_info().rss / 2**20,
                            workers_rss_mib=sum(p.memory_info().rss for p in servers[1:]) / 2**20,
                            state_kib=state_kib,
                            state_replay_ms=state_ms,
                            journal_replay_ms=journal_ms,
                            jobs_held=len(dispatcher.get_status()["jobs"]),
                        )
                    )
            outputs = [c.communicate(timeout=60) for c in clients]
        finally:
            for c in clients:
                if c.poll() is None:
                    c.kill()
        for c, (_, err) in zip(clients, outputs):
            assert c.returncode == 0, err[-3000:]
        jobs = sum(int(out.split()[-1]) for out, _ in outputs)

    print(f"\nsoak: {jobs} jobs by {CLIENTS} clients in {seconds:.0f} s")
    for s in samples:
        print(
            f"  t={s.at_s:5.0f}s dispatcher={s.dispatcher_rss_mib:6.1f} MiB workers={s.workers_rss_mib:7.1f} MiB "
            f"state={s.state_kib:6.1f} KiB (replay {s.state_replay_ms:5.1f} ms) "
            f"journal replay={s.journal_replay_ms:6.1f} ms jobs held={s.jobs_held}"
        )
    # The run proper: from the first job the dispatcher held (the clients take seconds to import
    # TensorFlow) to the last; its second half is checked.
    busy = [s for s in samples if s.jobs_held] or samples
    loaded = [s for s in samples if busy[0].at_s <= s.at_s <= busy[-1].at_s]
    second_half = [s for s in loaded if s.at_s >= (loaded[0].at_s + loaded[-1].at_s) / 2]
    assert len(second_half) >= 5, f"too few samples ({len(samples)}): a longer --soak-seconds is needed"
    assert jobs >= 100 * seconds / 60, f"only {jobs} jobs ran: the soak did not load the cluster"
    # (series, tolerance over the half: a share of its level plus an absolute floor for noise)
    checks = {
        "dispatcher RSS (MiB)": ([(s.at_s, s.dispatcher_rss_mib) for s in second_half], 0.005, 8.0),
        # Workers warm up for the first minutes of load (each new pipeline's graph caches,
        # TensorFlow's thread pools, allocator arenas): up to about 35 MiB on 2 cores, which a
        # short run still sees in its second half. The hour-long run gets the 12 MiB floor.
        "workers' RSS (MiB)": (
            [(s.at_s, s.workers_rss_mib) for s in second_half],
            0.005,
            12.0 if seconds >= 300 else 40.0,
        ),
        "snapshot of the state (KiB)": ([(s.at_s, s.state_kib) for s in second_half], 0.25, 4.0),
        "its replay time (ms)": ([(s.at_s, s.state_replay_ms) for s in second_half], 0.5, 10.0),
        "jobs held": ([(s.at_s, float(s.jobs_held)) for s in second_half], 0.5, 10.0),
    }
    for name, (series, share, floor) in checks.items():
        level = statistics.fmean(v for _, v in series)
        rise = _rise_over_half(series)
        print(f"  {name}: level {level:.1f}, rise over the second half {rise:+.1f}")
        assert rise <= share * level + floor, (
            f"{name} grows: {rise:+.1f} over the second half at a level of {level:.1f}"
        )
