"""A chaos run: servers SIGKILLed and restarted at random while a client reads a distributed_epoch job.

A fault-tolerant dispatcher process and three worker processes at fixed addresses (as StatefulSet
pods keep theirs); every 2-5 s a random one of them is SIGKILLed and started again at the same
address. The read must complete with no element twice; what may be lost is what killed workers
had started (their current ranges and buffers). The seed is printed; `--chaos-seed` replays a run
and `--chaos-seconds` makes it longer.
"""

import collections
import os
import random
import threading
import time

import pytest
import tensorflow as tf

import dataservice as service
from dataservice import tf_internal
from dataservice.local_cluster import LocalCluster, ServerProcess

pytestmark = pytest.mark.timeout(900)


# The seed under CI=true, so that a CI run is the same run each time (a run elsewhere draws one).
CI_SEED = 20261205


def test_chaos_distributed_epoch(pytestconfig, capsys):
    seconds = pytestconfig.getoption("--chaos-seconds")
    # As many elements as the read, about 375 elements/s, takes through the faults.
    elements = int(seconds * 250)
    seed = pytestconfig.getoption("--chaos-seed")
    if seed is None:
        seed = CI_SEED if os.environ.get("CI") else random.randrange(2**31)
    with capsys.disabled():
        print(f"\nchaos run: seed {seed} (replay with --chaos-seed={seed}), {seconds:.0f} s of faults")
    rng = random.Random(seed)
    cluster = LocalCluster(
        num_workers=0,
        fault_tolerant_mode=True,
        dispatcher_options={"worker_timeout_ms": 3000, "client_timeout_ms": 60_000},
    )
    workers = {}

    def start_worker(port: int = 0) -> ServerProcess:
        """A worker at `port`, or (0) at a port it binds and reports (its address is
        localhost:<port>, the same when it is restarted there)."""
        return ServerProcess(
            "--role=worker",
            f"--port={port}",
            f"--dispatcher_address={cluster.address}",
            "--heartbeat_interval_ms=300",
        )

    stop = threading.Event()
    kills = collections.Counter()
    errors = []

    def chaos() -> None:
        deadline = time.monotonic() + seconds
        try:
            while not stop.wait(rng.uniform(2.0, 5.0)) and time.monotonic() < deadline:
                victim = rng.choice(["dispatcher", *sorted(workers)])
                if victim == "dispatcher":
                    cluster.restart_dispatcher()
                else:
                    workers[victim].kill()
                    workers[victim] = start_worker(victim)
                kills["dispatcher" if victim == "dispatcher" else "worker"] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    try:
        for _ in range(3):
            worker = start_worker()
            workers[worker.port] = worker
        # Slow enough per element that the read spans the faults (about 3 x 125 elements/s).
        dataset = tf.data.Dataset.range(elements).apply(tf_internal.sleep(8000))
        dataset = dataset.apply(service.distribute("distributed_epoch", cluster.target, dispatcher_timeout_ms=120_000))
        thread = threading.Thread(target=chaos, daemon=True)
        got, last, stall = [], time.monotonic(), 0.0
        started = last
        thread.start()
        for element in dataset:
            now = time.monotonic()
            stall, last = max(stall, now - last), now
            got.append(int(element))
        stop.set()
        thread.join(30)
        elapsed = time.monotonic() - started
        assert not errors, f"restarting a server failed (seed {seed}): {errors[0]}"
        counts = collections.Counter(got)
        twice = [e for e, c in counts.items() if c > 1]
        assert not twice, f"{len(twice)} elements delivered twice (seed {seed}), e.g. {twice[:5]}"
        assert all(0 <= e < elements for e in counts)
        lost = elements - len(counts)
        with capsys.disabled():
            print(
                f"chaos run (seed {seed}): {kills['worker']} worker and {kills['dispatcher']} dispatcher kills, "
                f"{len(counts):,} of {elements:,} elements delivered, {lost} lost, longest stall {stall:.1f} s, "
                f"{elapsed:.0f} s in all"
            )
        assert sum(kills.values()) >= 3, f"too few faults to say anything (seed {seed})"
        # Only what killed workers had started may be lost: a few ranges per kill.
        assert lost <= kills["worker"] * 1000 + 100, f"{lost} lost for {kills['worker']} worker kills"
    finally:
        stop.set()
        for process in workers.values():
            process.kill()
        cluster.stop()
