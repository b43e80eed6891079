"""Shared jobs, coordinated reads, job garbage collection, target_workers, compression
and flow control, with clients in threads and in separate processes."""

import collections
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO_ROOT, in_process_cluster, scrape, total, wait_for_workers

import dataservice as service
import dataservice.errors
from dataservice import tf_internal
from dataservice.client.reader import IterationReader
from dataservice.client.session import IterationSession, JobSpec
from dataservice.local_cluster import LocalCluster
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import compression, wire
from dataservice.transfer.chunk import element_columns
from dataservice.transfer.element_codec import ElementCodec
from dataservice.v1 import common_pb2, dispatcher_pb2

pytestmark = pytest.mark.timeout(240)

# A client in its own process: reads a dataset from the service and prints its elements as JSON.
_CLIENT = r"""
import faulthandler, json, sys
# Every thread's stack on stderr if the process is still running when the test gives up on it.
faulthandler.dump_traceback_later(100, exit=True)
import tensorflow as tf
from dataservice import tf_internal
import dataservice as service
args = json.loads(sys.argv[1])
ds = tf.data.Dataset.range(args["n"]).apply(tf_internal.sleep(args.get("sleep_us", 0)))
if args.get("repeat"):
    ds = ds.repeat()
ds = ds.apply(service.distribute("parallel_epochs", args["target"], **args["kwargs"]))
if args.get("barrier"):  # start reading only when the test says so (all processes have imported TF)
    print("READY", flush=True)
    sys.stdin.readline()
out = []
for x in ds:
    out.append(int(x))
    if len(out) == args.get("limit", -1):
        break
print("ELEMENTS " + json.dumps(out), flush=True)
"""


def _client_process(**args) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", _CLIENT, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _start_together(clients: list[subprocess.Popen]) -> None:
    """Releases clients started with barrier=True once every one of them is ready to read, so that a
    slow interpreter start cannot let one process drain a shared job before the other joins it."""
    for proc in clients:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()[-3000:]
    for proc in clients:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _elements(proc: subprocess.Popen, timeout_s: float = 120) -> list:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"stdout: {out[-2000:]}\nstderr: {err[-6000:]}"
    line = [text for text in out.splitlines() if text.startswith("ELEMENTS ")][-1]
    return json.loads(line[len("ELEMENTS ") :])


def _in_threads(count, target):
    results, errors = [None] * count, []

    def run(i):
        try:
            results[i] = target(i)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 180
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not errors, errors
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"consumers {stuck} still reading after 180 s"
    return results


# ---- shared jobs ---------------------------------------------------------------


def test_shared_job_divides_elements_between_client_processes(cluster):
    cluster.add_worker()
    clients = [
        _client_process(n=300, sleep_us=5000, barrier=True, target=cluster.target, kwargs={"job_name": "shared"})
        for _ in range(2)
    ]
    _start_together(clients)
    parts = [_elements(p) for p in clients]
    assert all(parts), "both processes got elements"
    # Two workers each produce range(300) once (parallel_epochs); each element goes to one consumer.
    assert collections.Counter(parts[0] + parts[1]) == {i: 2 for i in range(300)}


def test_shared_job_divides_elements_between_threads(cluster):
    source = tf.data.Dataset.range(400).apply(tf_internal.sleep(3000))

    def read(_):
        return [int(x) for x in source.apply(service.distribute("parallel_epochs", cluster.target, job_name="threads"))]

    parts = _in_threads(3, read)
    assert sum(1 for p in parts if p) >= 2
    assert sorted(sum(parts, [])) == list(range(400))


def test_each_repeat_epoch_of_a_named_job_is_its_own_iteration(cluster):
    ds = tf.data.Dataset.range(20).apply(service.distribute("parallel_epochs", cluster.target, job_name="epochs"))
    assert sorted(int(x) for x in ds.repeat(3)) == sorted(list(range(20)) * 3)


def test_reusing_the_name_of_a_finished_job_gives_an_empty_dataset(cluster):
    make = lambda: tf.data.Dataset.range(10).apply(  # noqa: E731
        service.distribute("parallel_epochs", cluster.target, job_name="done")
    )
    assert [int(x) for x in make()] == list(range(10))
    assert [int(x) for x in make()] == [], "the job's first iteration is over: a new reader of it gets nothing"


@pytest.mark.parametrize(
    "first, second, named",
    [
        (dict(processing_mode="distributed_epoch"), dict(processing_mode="parallel_epochs"), "processing mode"),
        (dict(target_workers="AUTO"), dict(target_workers="LOCAL"), "target_workers"),
    ],
)
def test_shared_job_with_other_arguments_names_the_mismatch(cluster, first, second, named):
    def make(kwargs):
        kwargs = dict(kwargs)
        mode = kwargs.pop("processing_mode", "parallel_epochs")
        return tf.data.Dataset.range(10**6).apply(service.distribute(mode, cluster.target, job_name="m", **kwargs))

    iterator = iter(make(first))
    next(iterator)
    with pytest.raises(tf.errors.OpError, match=f"InvalidArgumentError.*job 'm' already exists.*{named}"):
        next(iter(make(second)))


# ---- coordinated reads -----------------------------------------------------------


def _coordinated(cluster_target, index, count=2, job_name="coord", rounds=40, sleep_us=0, event=None, stop_at=None):
    """Consumer `index` of `count` reads `rounds` rounds, or (`stop_at`) until an element of at
    least that value; consumer 0 calls event[1]() after event[0] of them (a worker joins or dies
    mid-job)."""
    ds = (
        tf.data.Dataset.range(10**9)
        .apply(tf_internal.sleep(sleep_us))
        .repeat()
        .apply(
            service.distribute(
                "parallel_epochs", cluster_target, job_name=job_name, consumer_index=index, num_consumers=count
            )
        )
    )
    out = []
    for x in ds if stop_at is not None else ds.take(rounds):
        out.append(int(x))
        if event is not None and index == 0 and len(out) == event[0]:
            event[1]()
        if stop_at is not None and out[-1] >= stop_at:
            break
    return out


def _assert_rounds_from_one_stream(parts, count):
    """In each round every consumer reads from the same worker's stream: round r gives
    consumer c element c of `count` consecutive elements of that stream."""
    rounds = min(len(p) for p in parts)
    for r in range(rounds):
        first = parts[0][r]
        assert first % count == 0, (r, [p[r] for p in parts])
        assert [p[r] for p in parts] == [first + c for c in range(count)], (r, [p[r] for p in parts])


def test_coordinated_reads_in_threads_read_each_round_from_one_worker(cluster2):
    parts = _in_threads(3, lambda i: _coordinated(cluster2.target, i, count=3))
    _assert_rounds_from_one_stream(parts, 3)
    # Two workers take turns: rounds 0 and 1 both start their streams at element 0.
    assert parts[0][:4] == [0, 0, 3, 3]


def test_coordinated_reads_in_processes(cluster2):
    # Started together, so that neither drains rounds before the other joins. Each process reads
    # ahead (tf.data injects a prefetch): this test found that a process whose partner had read
    # its 30 and left hung in `break`, its iterator's deletion waiting on a round nobody would ask
    # for (test_a_consumer_whose_partner_stopped_reading_ends_its_iterator_at_once).
    clients = [
        _client_process(
            n=10**9,
            repeat=True,
            limit=30,
            barrier=True,
            target=cluster2.target,
            kwargs={"job_name": "procs", "consumer_index": i, "num_consumers": 2},
        )
        for i in range(2)
    ]
    _start_together(clients)
    _assert_rounds_from_one_stream([_elements(p) for p in clients], 2)


def test_a_consumer_whose_partner_stopped_reading_ends_its_iterator_at_once(cluster2):
    # Each consumer reads ahead (a prefetch, as trainers write and as tf.data injects): once
    # consumer 1 has stopped at round 3, consumer 0's prefetch waits on rounds nobody else will
    # ask for. Its iterator, deleted, must not wait for them: a CI run's consumer process hung in
    # `break` until killed.
    def consumer(index):
        ds = (
            tf.data.Dataset.range(10**9)
            .repeat()
            .apply(
                service.distribute(
                    "parallel_epochs", cluster2.target, job_name="stops", consumer_index=index, num_consumers=2
                )
            )
            .prefetch(4)
        )
        it = iter(ds)
        out = [int(next(it)) for _ in range(6 if index == 0 else 3)]
        return it, out

    # Garbage of earlier tests in this process (iterators of stopped clusters, each releasing
    # its client at a dispatcher that is gone, for up to seconds) is collected first: the wait
    # timed below is for these two iterators only.
    gc.collect()
    results = _in_threads(2, consumer)
    _assert_rounds_from_one_stream([out for _, out in results], 2)
    time.sleep(1)  # both prefetches have asked for every round they will
    # Deleted on a thread of its own: an iterator whose deletion hangs does so in TensorFlow's
    # C++, where no timeout reaches the test's thread.
    deleter = threading.Thread(target=lambda: (results.clear(), gc.collect()), daemon=True)
    started = time.monotonic()
    deleter.start()
    # A wait for a round comes back every ROUND_WAIT_S (2 s): the iterators end after about one
    # (1.3 s here when idle). A hang is forever; one CI run under load took over 15 s, so the
    # bound leaves room for a slow machine.
    deleter.join(30)
    assert not deleter.is_alive(), f"deleting the iterators did not end in {time.monotonic() - started:.0f} s"


def test_coordinated_reads_survive_a_worker_joining(cluster):
    added = threading.Event()

    def add():
        cluster.add_worker()
        added.set()

    parts = _in_threads(
        2, lambda i: _coordinated(cluster.target, i, job_name="join", rounds=200, sleep_us=2000, event=(30, add))
    )
    assert added.is_set()
    _assert_rounds_from_one_stream(parts, 2)
    # The new worker's stream starts again at 0: its rounds show up after it joined.
    restarts = [r for r in range(1, len(parts[0])) if parts[0][r] < parts[0][r - 1]]
    assert restarts, "the joining worker never served a round"


STOP_AT = 120


def test_coordinated_reads_survive_a_worker_dying():
    with LocalCluster(
        num_workers=2, dispatcher_options={"worker_timeout_ms": 2000}, worker_options={"heartbeat_interval_ms": 300}
    ) as cluster:
        wait_for_workers(cluster.address, 2)
        killed = threading.Event()

        def kill():
            cluster.workers[1].kill()
            killed.set()

        # A round the dying worker cut may reach one consumer and not the other, so the consumers
        # may hold different counts: reading a number of elements each, the one a round behind
        # would wait for a round its partner, done, never asks for (as with TensorFlow's service).
        # Both stop instead in the same round of the surviving worker, the first to reach element
        # STOP_AT of its stream: far past anything the workers had served when one was killed.
        start = time.monotonic()
        parts = _in_threads(
            2,
            lambda i: _coordinated(
                cluster.target, i, job_name="die", sleep_us=2000, event=(20, kill), stop_at=STOP_AT + i
            ),
        )
        assert killed.is_set()
        assert all(len(p) >= STOP_AT // 2 for p in parts), "both consumers read on after the worker died"
        assert time.monotonic() - start < 120
        # After the loss only the surviving worker serves, so the later rounds pair up again.
        _assert_rounds_from_one_stream([p[-20:] for p in parts], 2)


def test_coordinated_reads_need_an_infinite_dataset(cluster):
    with pytest.raises(tf.errors.FailedPreconditionError, match="infinite dataset"):
        tf.data.Dataset.range(10).apply(
            service.distribute("parallel_epochs", cluster.target, job_name="finite", consumer_index=0, num_consumers=2)
        )
    # Through from_dataset_id with an element_spec: the registered cardinality tells.
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(10))
    with pytest.raises(tf.errors.FailedPreconditionError, match="infinite dataset"):
        service.from_dataset_id(
            "parallel_epochs",
            cluster.target,
            dataset_id,
            tf.TensorSpec([], tf.int64),
            job_name="finite",
            consumer_index=0,
            num_consumers=2,
        )
    # A client that does not check (or lies): the dispatcher refuses the job itself.
    request = dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset_id.numpy().decode(), job_name="finite", num_consumers=2
    )
    with DispatcherClient(cluster.address, 10) as dispatcher:
        with pytest.raises(service.errors.FailedPreconditionError, match="infinite dataset"):
            dispatcher.get_or_create_job(request)


# ---- job garbage collection ----------------------------------------------------


def _wait_until(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_named_iteration_without_clients_is_released_after_job_gc_timeout():
    cluster = in_process_cluster(1, job_gc_timeout_ms=1500, job_gc_check_interval_ms=200)
    try:
        worker = cluster.workers[0]
        iterator = iter(
            tf.data.Dataset.range(10**9).apply(service.distribute("parallel_epochs", cluster.target, job_name="gc"))
        )
        next(iterator)
        assert len(worker.running_tasks()) == 1
        del iterator
        time.sleep(0.8)
        assert len(worker.running_tasks()) == 1, "a named job waits job_gc_timeout_ms for another client"
        _wait_until(lambda: not worker.running_tasks(), 20, "the idle named iteration kept its task")
    finally:
        cluster.stop()


def test_vanished_client_is_released_after_client_timeout():
    cluster = in_process_cluster(1, client_timeout_ms=2000, job_gc_check_interval_ms=200)
    try:
        worker = cluster.workers[0]
        client = _client_process(n=10**9, sleep_us=1000, target=cluster.target, kwargs={})
        _wait_until(lambda: worker.running_tasks(), 60, "the client process never started its job")
        time.sleep(1.0)
        client.send_signal(signal.SIGKILL)
        client.wait(10)
        _wait_until(lambda: not worker.running_tasks(), 20, "the task of a SIGKILLed client kept running")
    finally:
        cluster.stop()


# ---- target_workers ------------------------------------------------------------


def test_unknown_target_workers_is_a_value_error(cluster):
    with pytest.raises(ValueError, match="target_workers"):
        service.distribute("parallel_epochs", cluster.target, target_workers="NEARBY")


# ---- compression ---------------------------------------------------------------


def test_auto_compression_compresses_only_what_shrinks():
    zeros = np.zeros(1 << 20, np.float32).tobytes()
    codec, payload = compression.compress(zeros)
    assert codec == common_pb2.COMPRESSION_LZ4 and len(payload) < len(zeros) // 50
    assert compression.decompress(codec, payload, len(zeros)) == zeros
    noise = np.random.default_rng(0).random(1 << 18, np.float32).tobytes()
    assert compression.compress(noise) == (common_pb2.COMPRESSION_NONE, noise)
    codec = ElementCodec(tf.TensorSpec([1024], tf.float32))
    elements = [element_columns(codec.kinds, [np.zeros(1024, np.float32)])] * 8
    chunk, (buffer,) = codec.encode(elements, compression.StreamCompressor(common_pb2.COMPRESSION_AUTO))
    assert chunk.components[0].compression == common_pb2.COMPRESSION_LZ4 and len(buffer) < 1024
    decoded = codec.decode(chunk, wire.FrameBuffers(bytes(buffer), 0, 8)).columns[0].values
    np.testing.assert_array_equal(decoded, np.zeros((8, 1024), np.float32))


def test_consumers_of_a_shared_job_may_use_any_compression(cluster):
    source = tf.data.Dataset.range(200).map(lambda i: tf.fill([4096], i)).apply(tf_internal.sleep(2000))
    kinds = ["AUTO", None, "SNAPPY"]

    def read(i):
        ds = source.apply(service.distribute("parallel_epochs", cluster.target, job_name="z", compression=kinds[i]))
        return [(int(x[0]), bool(np.all(x.numpy() == x[0].numpy()))) for x in ds]

    parts = _in_threads(3, read)
    assert all(parts)
    assert sorted(v for part in parts for v, _ in part) == list(range(200))
    assert all(ok for part in parts for _, ok in part)


def test_snappy_registered_datasets_are_read_through_from_dataset_id(cluster):
    source = tf.data.Dataset.range(50).map(lambda i: tf.strings.as_string(tf.fill([300], i)))
    dataset_id = service.register_dataset(cluster.target, source, compression="SNAPPY")
    ds = service.from_dataset_id("parallel_epochs", cluster.target, dataset_id)
    assert [int(x[0]) for x in ds.as_numpy_iterator()] == list(range(50))


# ---- flow control and memory -----------------------------------------------------


def test_max_outstanding_requests_bounds_what_a_client_holds(cluster2):
    dataset_id = service.register_dataset(cluster2.target, tf.data.Dataset.range(10**9)).numpy().decode()
    codec = ElementCodec(tf.TensorSpec([], tf.int64))
    job = JobSpec(dataset_id, common_pb2.SHARDING_POLICY_OFF, None, None, common_pb2.TARGET_WORKERS_AUTO)
    reader = IterationReader(
        cluster2.address, job, 0, codec, max_outstanding=10, timeout_s=30, compression=common_pb2.COMPRESSION_AUTO
    )
    try:
        _wait_until(lambda: reader.stream_count() == 2 and reader.queued_elements() > 0, 30, "no element arrived")
        time.sleep(1.5)  # a consumer that does not read: workers must stop sending
        held = reader.queued_elements()
        assert 0 < held <= 10
        assert held <= reader.credits.outstanding() <= 10
        got = []
        for chunk in reader:
            got.extend(chunk.columns[0].values.tolist())
            if len(got) >= 500:
                break
        assert len(got) >= 500, "reading on grants new credits"
    finally:
        reader.close()


def test_client_heartbeats_after_the_first_carry_only_changed_tasks(cluster2):
    """A client's first heartbeat learns every task of its iteration; later ones send the
    version of their last answer, which the dispatcher answers with the tasks that changed since
    (none here): a heartbeat's cost does not grow with the workers (dispatcher/task_changes.py)."""
    dataset_id = service.register_dataset(cluster2.target, tf.data.Dataset.range(10**9)).numpy().decode()
    job = JobSpec(dataset_id, common_pb2.SHARDING_POLICY_OFF, None, None, common_pb2.TARGET_WORKERS_AUTO)
    answers: list[int] = []
    session = IterationSession(
        cluster2.address,
        job,
        0,
        30,
        on_heartbeat=lambda r: answers.append(len(r.tasks)),
        on_error=lambda e: answers.append(-1),
    )
    session.start()
    try:
        for _ in range(4):
            session.wake()
            time.sleep(0.3)
        _wait_until(lambda: len(answers) >= 4, 30, "too few heartbeats")
        assert answers[0] == 2 and set(answers[1:]) == {0}, answers
    finally:
        session.close()


def _rss_mib(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def test_slow_client_of_large_elements_keeps_worker_and_client_memory_flat(report_figures):
    with LocalCluster(num_workers=1) as cluster:
        wait_for_workers(cluster.address, 1)
        payload = tf.random.stateless_uniform([1 << 18], seed=[3, 4])  # 1 MiB of float32
        ds = (
            tf.data.Dataset.from_tensors(payload)
            .repeat()
            .apply(service.distribute("parallel_epochs", cluster.target, max_outstanding_requests=8))
        )
        worker_pid, client_pid = cluster.workers[0].proc.pid, os.getpid()
        samples = []
        start = time.monotonic()
        read = 0
        for _ in ds:
            read += 1
            time.sleep(0.05)  # a slow trainer: 20 MiB/s
            elapsed = time.monotonic() - start
            if not samples or elapsed - samples[-1][0] >= 4 or elapsed >= 12:
                samples.append((elapsed, _rss_mib(worker_pid), _rss_mib(client_pid)))
            if elapsed >= 12:
                break
        report_figures(
            f"\n  RSS over 12 s of slow 1 MiB reads ({read} elements): "
            + ", ".join(f"t={t:.0f}s worker={w:.0f} MiB client={c:.0f} MiB" for t, w, c in samples)
        )
        _, worker_early, client_early = samples[1]
        _, worker_late, client_late = samples[-1]
        # The worker buffers at most 64 MiB, the client 8 elements: neither grows with time (a
        # client keeping what it read would grow 20 MiB/s, 160 MiB between the two samples).
        assert worker_late - worker_early < 48, samples
        assert client_late - client_early < 48, samples


def test_a_workers_memory_budget_bounds_the_buffers_of_many_tasks(report_figures):
    """Eight jobs of 1 MiB elements on one worker whose memory_budget_bytes is 48 MiB, their
    clients reading nothing after the first element: the worker's task buffers and what its
    clients hold unacknowledged stay within the budget (plus a chunk and a message per task),
    where each task's own 64 MiB would allow 512 MiB; every client then reads on in order."""
    budget = 48 << 20
    options = {"memory_budget_bytes": budget, "monitoring_port": 0}
    with LocalCluster(num_workers=1, worker_options=options) as cluster:
        wait_for_workers(cluster.address, 1)
        ds = tf.data.Dataset.range(10**6).map(lambda i: tf.fill([1 << 18], tf.cast(i, tf.float32)))
        iterators = [iter(ds.apply(service.distribute("parallel_epochs", cluster.target))) for _ in range(8)]
        assert [float(next(it)[0]) for it in iterators] == [0.0] * 8
        port = cluster.workers[0].monitoring_port
        held = []
        for _ in range(6):  # the buffers fill within a few seconds; then they stay
            time.sleep(0.5)
            samples = scrape(port)
            held.append(
                total(samples, "dataservice_worker_buffered_bytes")
                + total(samples, "dataservice_worker_unacknowledged_bytes")
            )
        assert total(samples, "dataservice_worker_memory_budget_bytes") == budget
        assert total(samples, "dataservice_worker_running_tasks") == 8
        report_figures(f"\n  8 idle 1 MiB tasks under a 48 MiB budget hold (MiB): {[round(h / 2**20) for h in held]}")
        assert max(held) <= budget + 8 * 2 * (1 << 20), held
        assert max(held) >= 8 << 20, "the tasks did not fill their shares: the test measured nothing"
        for it in iterators:
            assert [float(next(it)[0]) for _ in range(8)] == [float(i) for i in range(1, 9)]
