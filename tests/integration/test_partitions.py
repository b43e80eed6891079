"""Silent failures on real (namespaced) test hosts: a worker host partitioned from everyone, a
worker cut from the trainer only, a frozen worker (SIGSTOP), the dispatcher's host partitioned
from everyone. On loopback a dead peer answers at once with a reset; here nothing comes back,
and only deadlines end the waits.

The cluster: a dispatcher, two workers and a trainer, each a process on a test host of its own
(tests/hosts.py); the trainer reads a `distributed_epoch` with the numpy client and reports
every element and when it came. Each scenario prints its figures: elements read, lost,
duplicated, the longest stall. `--partition-seconds` sets how long a partition or freeze lasts
(CI: 30, the length README's fault-tolerance figures were taken at).
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import tensorflow as tf
from conftest import REPO_ROOT, scrape, total, wait_until
from hosts import TestHosts, freeze, require_test_hosts, thaw

import dataservice as service
from dataservice import tf_internal
from dataservice.client.element_streams import CONNECT_TIMEOUT_S
from dataservice.local_cluster import ServerProcess
from dataservice.reader import NumpyReader

pytestmark = pytest.mark.timeout(600)

# Short, so that the scenarios take seconds: the client breaks a stream silent this long, the
# dispatcher drops a worker silent this long.
STREAM_TIMEOUT_MS = 5_000
WORKER_TIMEOUT_MS = 5_000
# How long the worker pipelines sleep per element: the epoch must outlast the partition.
SLEEP_US = 4_000
# Elements read before the fault is made: mid-epoch.
BEFORE_FAULT = 300

_TRAINER = r"""
import json, logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(created).3f %(name)s %(message)s")
from dataservice.reader import NumpyReader
target, dataset_id, stream_timeout_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = NumpyReader(target, dataset_id, "distributed_epoch", stream_timeout_ms=stream_timeout_ms)
values, times = [], []
for element in reader:
    values.append(int(element))
    times.append(time.time())
    if len(values) % 100 == 0:
        print(f"PROGRESS {len(values)}", flush=True)
print("RESULT " + json.dumps({"values": values, "times": times}), flush=True)
"""


class Cluster:
    """The dispatcher (fault-tolerant, journaling to `work_dir`) and two workers on test hosts of
    their own; a trainer host for the client. Servers restart at their addresses."""

    def __init__(self, hosts: TestHosts, work_dir: str):
        self.hosts = hosts
        self._work_dir = work_dir
        self.dispatcher = self._start_dispatcher(0)
        self.address = f"{hosts['dispatcher'].address}:{self.dispatcher.port}"
        self.target = f"grpc://{self.address}"
        self.workers: dict[str, ServerProcess] = {name: self._start_worker(name, 0) for name in ("worker1", "worker2")}

    def _start_dispatcher(self, port: int) -> ServerProcess:
        return ServerProcess(
            "--role=dispatcher",
            f"--port={port}",
            f"--work_dir={self._work_dir}",
            "--fault_tolerant_mode",
            f"--worker_timeout_ms={WORKER_TIMEOUT_MS}",
            launcher=self.hosts["dispatcher"].launcher(),
        )

    def _start_worker(self, name: str, port: int) -> ServerProcess:
        return ServerProcess(
            "--role=worker",
            f"--port={port}",
            f"--dispatcher_address={self.address}",
            f"--worker_address={self.hosts[name].address}:%port%",
            "--heartbeat_interval_ms=500",
            launcher=self.hosts[name].launcher(),
        )

    def restart(self, name: str) -> None:
        """SIGKILLs the server on host `name` and starts it again at its address."""
        if name == "dispatcher":
            self.dispatcher.kill()
            self.dispatcher = self._start_dispatcher(self.dispatcher.port)
        else:
            self.workers[name].kill()
            self.workers[name] = self._start_worker(name, self.workers[name].port)

    def wait_for_both_workers(self) -> None:
        def both_alive() -> bool:
            status = json.loads(_http_get(self.hosts["dispatcher"].address, self.dispatcher.monitoring_port))
            return sum(1 for w in status["workers"] if w["state"] == "alive") == 2

        wait_until(both_alive, "both workers registered and alive", timeout_s=60)

    def elements_sent(self, worker: str) -> float:
        samples = scrape(self.workers[worker].monitoring_port, host=self.hosts[worker].address)
        return total(samples, "dataservice_worker_elements_sent_total")

    def stop(self) -> None:
        for server in [*self.workers.values(), self.dispatcher]:
            server.kill()


def _http_get(host: str, port: int | None, path: str = "/status.json") -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    require_test_hosts(firewall=True)
    hosts = TestHosts(["dispatcher", "worker1", "worker2", "trainer"])
    made = None
    try:
        made = Cluster(hosts, str(tmp_path_factory.mktemp("dispatcher")))
        yield made
    finally:
        if made is not None:
            made.stop()
        hosts.close()


@pytest.fixture
def partition_s(request) -> float:
    return request.config.getoption("--partition-seconds")


class Trainer:
    """The trainer process on its host, reading one distributed_epoch; its stdout read on a thread."""

    def __init__(self, cluster: Cluster, elements: int):
        dataset = tf.data.Dataset.range(elements).apply(tf_internal.sleep(SLEEP_US))
        dataset_id = service.register_dataset(cluster.target, dataset).numpy().decode()
        self.started = time.time()
        self.proc = subprocess.Popen(
            [
                *cluster.hosts["trainer"].launcher(),
                sys.executable,
                "-c",
                _TRAINER,
                cluster.target,
                dataset_id,
                str(STREAM_TIMEOUT_MS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, prefix: str, timeout_s: float, accept: Callable[[str], bool] = lambda _: True) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait(10)
                pytest.fail(f"the trainer did not print {prefix!r} in time:\n" + "".join(self.stderr[-40:]))
            if line.startswith(prefix) and accept(line):
                return line

    def result(self, timeout_s: float) -> dict:
        line = self.wait_for("RESULT ", timeout_s)
        assert self.proc.wait(30) == 0, "".join(self.stderr[-40:])
        return json.loads(line[len("RESULT ") :])


def _run(
    cluster: Cluster,
    partition_s: float,
    fault: Callable[[], None],
    heal: Callable[[], None],
    name: str,
    report_figures: Callable[[str], None],
    during_fault: Callable[[], None] = lambda: None,
    worker_fault: bool = True,
):
    """Reads an epoch long enough that half of it goes by on one worker during the fault; makes
    the fault mid-epoch, calls `during_fault` and heals it `partition_s` after the fault.
    `worker_fault`: the fault is a worker's, so the other worker serves on meanwhile. Returns
    (figures, fault time, trainer)."""
    cluster.wait_for_both_workers()
    rate = 2 * 1e6 / SLEEP_US  # both workers, elements per second at most
    elements = int(BEFORE_FAULT + rate / 2 * partition_s + rate * 5)
    trainer = Trainer(cluster, elements)
    try:
        trainer.wait_for("PROGRESS ", 120, lambda line: int(line.split()[1]) >= BEFORE_FAULT)
        faulted = time.time()
        fault()
        healed: list[float] = []
        try:
            during_fault()
            time.sleep(max(0.0, faulted + partition_s - time.time()))
        finally:
            heal()
            healed.append(time.time())
        result = trainer.result(partition_s + 240)
    finally:
        if trainer.proc.poll() is None:
            trainer.proc.kill()
            trainer.proc.wait(10)
    counts = Counter(result["values"])
    stalls = _stalls(result["times"], faulted, healed[0])
    figures = {
        "read": len(result["values"]),
        "read_during_fault": sum(1 for t in result["times"] if faulted <= t <= healed[0]),
        "lost": elements - len(counts),
        "duplicated": sum(n - 1 for n in counts.values() if n > 1),
        **stalls,
    }
    resumed = (
        f", reading resumed {stalls['resumed_after_heal']:.1f} s after the heal" if stalls["resumed_after_heal"] else ""
    )
    report_figures(
        f"{name} ({partition_s:.0f} s): {figures['read']:,} of {elements:,} elements read, {figures['lost']} "
        f"lost, {figures['duplicated']} duplicated, longest stall {figures['longest_stall']:.1f} s{resumed}"
    )
    assert all(0 <= v < elements for v in counts)
    if worker_fault:
        # While the fault lasts the trainer reads on from the other worker: it waits on the silent
        # one no longer than the detection time (and the watch's period, a second, with slack).
        assert stalls["longest_during_fault"] < STREAM_TIMEOUT_MS / 1000 + 2, stalls
        # When the other worker ran out of work before the heal, the rest waits for the healed
        # worker: its first connection attempt after the heal, a connect timeout and a backoff later.
        assert stalls["resumed_after_heal"] < CONNECT_TIMEOUT_S + 5, stalls
    return figures, faulted, trainer


def _logs(cluster: Cluster, trainer: Trainer) -> str:
    """The last lines the trainer and the servers logged, for a failure's message."""
    parts = [("trainer", trainer.stderr)]
    parts += [
        (name, server.stderr_lines) for name, server in [("dispatcher", cluster.dispatcher), *cluster.workers.items()]
    ]
    return "\n".join(f"--- {name}:\n" + "".join(lines[-25:]) for name, lines in parts)


def _stalls(times: list[float], faulted: float, healed: float) -> dict:
    """The longest gap between two elements; the longest that began and ended during the fault;
    and, if the fault's end fell in a gap of over a second (everything left was on the faulted
    worker), how long after the heal that gap ended (else 0)."""
    gaps = list(zip(times, times[1:]))
    return {
        "longest_stall": max((b - a for a, b in gaps), default=0.0),
        "longest_during_fault": max((b - a for a, b in gaps if faulted <= a and b <= healed), default=0.0),
        "resumed_after_heal": max((b - healed for a, b in gaps if a < healed < b and b - a > 1.0), default=0.0),
    }


def test_a_worker_partitioned_from_everyone_is_read_around_and_rejoins(cluster, partition_s, report_figures):
    """Scenario 1: the trainer reads on from the other worker; the dispatcher drops the silent
    worker (worker_timeout_ms), whose unsent elements are lost, never read twice; healed, it
    registers again and gets work in the same epoch."""
    sent_before = []

    def fault() -> None:
        cluster.hosts.partition("worker1")

    def heal() -> None:
        cluster.hosts.heal("worker1")
        sent_before.append(cluster.elements_sent("worker1"))

    figures, _, _ = _run(cluster, partition_s, fault, heal, "worker host partitioned from everyone", report_figures)
    assert figures["duplicated"] == 0
    assert cluster.elements_sent("worker1") > sent_before[0], "the healed worker got no work in the epoch"


def test_a_worker_cut_from_the_trainer_only_is_reconnected_and_loses_nothing(cluster, partition_s, report_figures):
    """Scenario 2: the worker still heartbeats the dispatcher, so nothing is lost: the trainer
    breaks the silent stream within stream_timeout_ms, reads on from the other worker, connects
    again after the heal and gets what the worker kept for it."""
    figures, faulted, trainer = _run(
        cluster,
        partition_s,
        lambda: cluster.hosts.cut("trainer", "worker1"),
        lambda: cluster.hosts.mend("trainer", "worker1"),
        "worker cut from the trainer only",
        report_figures,
    )
    assert figures["duplicated"] == 0 and figures["lost"] == 0
    detected = [float(line.split()[0]) for line in trainer.stderr if "stream_timeout_ms" in line]
    assert detected, "the trainer never noticed the silent stream:\n" + "".join(trainer.stderr[-20:])
    # Within the timeout and the watch's period (a second), with some slack for a loaded machine.
    assert detected[0] - faulted < STREAM_TIMEOUT_MS / 1000 + 3


def test_a_frozen_worker_is_read_around_and_rejoins(cluster, partition_s, report_figures):
    """Scenario 4: a worker frozen (SIGSTOP) keeps its connections open, and its kernel still
    answers; only its silence tells. Outcomes as for a partition."""
    worker = cluster.workers["worker1"].proc
    sent_before = []

    def thaw_worker() -> None:
        thaw(worker.pid)
        sent_before.append(cluster.elements_sent("worker1"))

    figures, _, _ = _run(cluster, partition_s, lambda: freeze(worker.pid), thaw_worker, "worker frozen", report_figures)
    assert figures["duplicated"] == 0
    assert cluster.elements_sent("worker1") > sent_before[0], "the thawed worker got no work in the epoch"


def test_a_partitioned_dispatcher_loses_nothing_and_new_reads_wait_for_it(cluster, partition_s, report_figures):
    """Scenario 3: the dispatcher's host partitioned from everyone. Reading existing tasks goes on
    while the workers hold ranges; a read started meanwhile waits and then succeeds; the
    dispatcher, hearing from no one, takes itself for cut off rather than every worker for dead,
    so once healed no task is lost and no element is lost or read twice."""
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(20)).numpy().decode()
    started_during: list[list[int]] = []
    errors: list[BaseException] = []

    def read_new_iteration() -> None:
        try:
            started_during.append(sorted(int(x) for x in NumpyReader(cluster.target, dataset_id)))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    reader = threading.Thread(target=read_new_iteration, daemon=True)
    figures, _, trainer = _run(
        cluster,
        partition_s,
        lambda: cluster.hosts.partition("dispatcher"),
        lambda: cluster.hosts.heal("dispatcher"),
        "dispatcher host partitioned from everyone",
        report_figures,
        during_fault=reader.start,
        worker_fault=False,
    )
    reader.join(120)
    logs = _logs(cluster, trainer)
    assert not errors, f"{errors}\n{logs}"
    # parallel_epochs on both workers: range(20) from each, read once the dispatcher was back.
    assert started_during == [sorted(list(range(20)) * 2)], logs
    assert figures["duplicated"] == 0 and figures["lost"] == 0, logs
    assert figures["read_during_fault"] > 0, "reading stopped with the dispatcher"
    cluster.wait_for_both_workers()


_LOCAL_READER = r"""
import json, sys
from dataservice.reader import NumpyReader
target, dataset_id = sys.argv[1], sys.argv[2]
print(json.dumps(sorted(int(x) for x in NumpyReader(target, dataset_id, target_workers="LOCAL"))), flush=True)
"""


@pytest.mark.parametrize("host", ["worker1", "trainer"])
def test_local_workers_are_those_on_the_readers_host(cluster, host):
    """target_workers="LOCAL" on real distinct hosts: a reader on a worker's host reads that
    worker only (a host's addresses are its interfaces', not what its name resolves to: test
    hosts share the machine's name); on a host without a worker it is refused."""
    cluster.wait_for_both_workers()
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(10)).numpy().decode()
    result = subprocess.run(
        [*cluster.hosts[host].launcher(), sys.executable, "-c", _LOCAL_READER, cluster.target, dataset_id],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    if host == "trainer":
        assert result.returncode != 0
        assert "none of the iteration's workers runs on this host" in result.stderr, result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-2000:]
        assert json.loads(result.stdout.splitlines()[-1]) == list(range(10))  # one worker's, not two


# The seed under CI=true, so that a CI run is the same run each time (a run elsewhere draws one).
CHAOS_CI_SEED = 20261207


def test_chaos_of_partitions_freezes_and_kills(cluster, pytestconfig, report_figures):
    """Scenario 5: every 2-5 s the last fault is undone and another made: a worker or the
    dispatcher SIGKILLed and started again at its address, a worker's or the dispatcher's host
    partitioned, a worker cut from the trainer, a worker frozen. The read completes and reads
    nothing twice; what was lost and the longest stall are reported. `--chaos-seconds` makes it
    longer, `--chaos-seed` replays a run."""
    seconds = pytestconfig.getoption("--chaos-seconds")
    seed = pytestconfig.getoption("--chaos-seed")
    if seed is None:
        seed = CHAOS_CI_SEED if os.environ.get("CI") else random.randrange(2**31)
    rng = random.Random(seed)
    hosts = cluster.hosts
    workers = sorted(cluster.workers)
    undo: list[Callable[[], None]] = []
    faults: Counter[str] = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()

    def frozen(name: str) -> Callable[[], None]:
        pid = cluster.workers[name].proc.pid
        freeze(pid)
        return lambda: thaw(pid)

    def partition(name: str) -> Callable[[], None]:
        hosts.partition(name)
        return lambda: hosts.heal(name)

    def cut(name: str) -> Callable[[], None]:
        hosts.cut("trainer", name)
        return lambda: hosts.mend("trainer", name)

    def restart(name: str) -> Callable[[], None]:
        cluster.restart(name)
        return lambda: None

    choices: list[tuple[str, Callable[[str], Callable[[], None]], list[str]]] = [
        ("kill", restart, [*workers, "dispatcher"]),
        ("partition", partition, [*workers, "dispatcher"]),
        ("cut from the trainer", cut, workers),
        ("freeze", frozen, workers),
    ]

    # Faults are dealt from a shuffled deck of every (fault, host), so that a short run sees most.
    deck: list[tuple[str, Callable[[str], Callable[[], None]], str]] = []

    def deal() -> tuple[str, Callable[[str], Callable[[], None]], str]:
        if not deck:
            deck.extend((kind, make, name) for kind, make, targets in choices for name in targets)
            rng.shuffle(deck)
        return deck.pop()

    def chaos() -> None:
        deadline = time.monotonic() + seconds
        try:
            while not stop.wait(rng.uniform(2.0, 5.0)) and time.monotonic() < deadline:
                while undo:
                    undo.pop()()
                kind, make, name = deal()
                undo.append(make(name))
                faults[f"{kind} {name}"] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            while undo:
                undo.pop()()

    cluster.wait_for_both_workers()
    # The read outlasts the faults: it is 500 elements/s at best, and the faults slow it (a restart
    # on a loaded machine takes seconds, so a read that ended early saw too few faults).
    elements = int(seconds * 500)
    trainer = Trainer(cluster, elements)
    thread = threading.Thread(target=chaos, daemon=True)
    started = time.monotonic()
    try:
        thread.start()
        result = trainer.result(seconds + 300)
    finally:
        stop.set()
        thread.join(60)
        if trainer.proc.poll() is None:
            trainer.proc.kill()
            trainer.proc.wait(10)
    assert not errors, f"making a fault failed (seed {seed}): {errors[0]!r}"
    counts = Counter(result["values"])
    times = result["times"]
    stall = max((b - a for a, b in zip(times, times[1:])), default=0.0)
    lost = elements - len(counts)
    report_figures(
        f"\nchaos on test hosts (seed {seed}, {seconds:.0f} s): "
        + ", ".join(f"{fault} x{n}" for fault, n in sorted(faults.items()))
        + f"; {len(counts):,} of {elements:,} elements read, {lost} lost, "
        f"longest stall {stall:.1f} s, {time.monotonic() - started:.0f} s in all"
    )
    twice = [e for e, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} elements read twice (seed {seed}), e.g. {twice[:5]}\n{_logs(cluster, trainer)}"
    assert all(0 <= v < elements for v in counts)
    assert sum(faults.values()) >= 3, f"too few faults to say anything (seed {seed})"
