"""TensorFlow's scenarios of local and remote workers (local_workers_test.py, worker_tags_test.py,
auto_shard_test.py), run against ours and against TensorFlow's service, eagerly and in graph mode
(conformance.py).

"Local" differs between the two on purpose. TensorFlow's client reads as local only the workers
in its own process; so its remote workers here are processes on this machine, its local ones
servers in the test's process. Ours reads as local every worker on the client's host (it reaches
them through shared memory, README "Data path"), so its remote workers run on another host: a
test host in a network namespace (tests/hosts.py), where they advertise that host's address and
are reached over its link, as on a cluster; its local workers are servers in the test's process.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import tensorflow as tf
from conformance import (
    MODES,
    SERVICES,
    LineProcess,
    TensorFlowService,
    distribute_of,
    eager_only,
    raises_at_read,
    read_dataset,
    same_items,
    unique_name,
    write_record_files,
)
from hosts import TestHosts, require_test_hosts

import dataservice as service

pytestmark = pytest.mark.timeout(300)

COLOCATED = "COLOCATED"

# Our workers on the test host: one process holds every cluster's (one TensorFlow import for
# all). It prints "ready"; each command line (JSON: a dispatcher's address and tags) starts a
# worker advertising the host's address and answers with its address, or {"error": ...}. Keras is
# left out, as data-server leaves it out.
_OUR_REMOTE_HOST = """
import json, os, sys
sys.modules["keras"] = None
import dataservice

host = sys.argv[1]
workers = []
print("ready", flush=True)
for line in sys.stdin:
    command = json.loads(line)
    try:
        config = dataservice.WorkerConfig(
            dispatcher_address=command["dispatcher"],
            worker_address=host + ":%port%",
            worker_tags=command["tags"],
            heartbeat_interval_ms=300,
        )
        workers.append(dataservice.WorkerServer(config))
        answer = workers[-1].address
    except Exception as e:
        answer = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
os._exit(0)
"""


class _RemoteHost:
    """Our workers on the test host (_OUR_REMOTE_HOST)."""

    def __init__(self, hosts: TestHosts):
        self.here = hosts.here
        self.address = hosts["remote"].address
        self._process = LineProcess(
            _OUR_REMOTE_HOST, [self.address], "the test host's workers", launcher=hosts["remote"].launcher()
        )

    def add_worker(self, dispatcher_port: int, tags: Sequence[str]) -> str:
        answer = json.loads(
            self._process.ask(json.dumps({"dispatcher": f"{self.here}:{dispatcher_port}", "tags": list(tags)}))
        )
        if isinstance(answer, dict):
            raise RuntimeError(answer["error"])
        return answer

    def stop(self) -> None:
        self._process.stop()


# A cluster's workers in the order they start: ("local" | "remote", tags).
Spec = tuple[tuple[str, tuple[str, ...]], ...]


def spec(*workers: tuple[str, Sequence[str]]) -> Spec:
    return tuple((where, tuple(tags)) for where, tags in workers)


def local(count: int = 1, tags: Sequence[str] = ()) -> list[tuple[str, Sequence[str]]]:
    return [("local", tags)] * count


def remote(count: int = 1, tags: Sequence[str] = ()) -> list[tuple[str, Sequence[str]]]:
    return [("remote", tags)] * count


def _entries(style: str, hosts: Sequence[str]) -> list[str]:
    """The dispatcher's static sharding list for workers on `hosts`, in the style of one of
    TensorFlow's auto-shard tests: "host" alone, "port" (host:%port%), "named-port"
    (host:%port_worker%), "bad-port" (host:worker), "other-hosts" (hosts that run no worker),
    "one-entry" (host:%port% for the first worker only), "empty" (no entry)."""
    if style == "empty":
        return []
    if style == "one-entry":
        return [f"{hosts[0]}:%port%"]
    if style == "other-hosts":
        return [f"fake_worker_{i}" for i in range(len(hosts))]
    suffix = {"host": "", "port": ":%port%", "named-port": ":%port_worker%", "bad-port": ":worker"}[style]
    return [host + suffix for host in hosts]


class _OurCluster:
    """Our dispatcher and local workers in this process, remote workers on the test host."""

    def __init__(
        self, remote_host: Callable[[], _RemoteHost], workers: Spec, static: str | None, fault_tolerant: bool = False
    ):
        self._remote_host = remote_host
        addresses = None
        if static is not None:
            # Each worker's entry names its host; workers of one host take its entries in turn.
            names = {"local": "localhost", "remote": remote_host().address}
            addresses = _entries(static, [names[where] for where, _ in workers])
        self._dispatcher_config = service.DispatcherConfig(
            port=0,
            worker_addresses=addresses,
            work_dir=tempfile.mkdtemp(prefix="conformance-") if fault_tolerant else None,
            fault_tolerant_mode=fault_tolerant,
        )
        self.dispatcher = service.DispatchServer(self._dispatcher_config)
        self._dispatcher_config = dataclasses.replace(self._dispatcher_config, port=self.dispatcher.port)
        self.target = f"grpc://localhost:{self.dispatcher.port}"
        self.local_workers: list[service.WorkerServer] = []
        try:
            for where, tags in workers:
                self.add_worker(where, tags)
        except BaseException:
            self.stop()
            raise

    def add_worker(self, where: str, tags: Sequence[str] = (), port: int = 0) -> None:
        if where == "local":
            config = service.WorkerConfig(
                dispatcher_address=f"localhost:{self.dispatcher.port}",
                port=port,
                worker_tags=list(tags),
                heartbeat_interval_ms=200,
            )
            self.local_workers.append(service.WorkerServer(config))
            return
        self._remote_host().add_worker(self.dispatcher.port, tags)

    def restart_local_workers(self) -> None:
        """Each local worker stopped and started again at its port (its tasks gone)."""
        restarted, self.local_workers = self.local_workers, []
        for worker in restarted:
            port = worker.port
            worker.stop(grace_s=0)
            self.add_worker("local", port=port)

    def restart_dispatcher(self) -> None:
        """The dispatcher stopped and started again at its port, from its work_dir (a cluster
        made with fault_tolerant=True)."""
        self.dispatcher.stop(grace_s=0)
        self.dispatcher = service.DispatchServer(self._dispatcher_config)

    def stop(self) -> list[threading.Thread]:
        """Stops the local workers and the dispatcher on a thread, for the caller to wait for a
        while (a worker stopping joins its tasks' threads, some blocked in a pipeline that reads
        a stopped cluster). (Its remote workers stop with the test host's process, after every
        cluster.) No grace for streams in flight: the scenarios are over."""

        def stop() -> None:
            for worker in self.local_workers:
                worker.stop(grace_s=0)
            self.dispatcher.stop(grace_s=0)
            if self._dispatcher_config.work_dir:
                shutil.rmtree(self._dispatcher_config.work_dir, ignore_errors=True)

        thread = threading.Thread(target=stop, daemon=True)
        thread.start()
        return [thread]


class _TheirCluster:
    """TensorFlow's dispatcher and remote workers in its service's process (conformance.py), its
    local workers servers in this process."""

    def __init__(self, tensorflow: TensorFlowService, workers: Spec, static: str | None, fault_tolerant: bool = False):
        # TensorFlow's tests name every worker "localhost": entries taken in registration order.
        addresses = _entries(static, ["localhost"] * len(workers)) if static is not None else None
        leading = 0
        while leading < len(workers) and workers[leading][0] == "remote":
            leading += 1
        self._cluster = tensorflow.cluster(
            worker_tags=[t for _, t in workers[:leading]], worker_addresses=addresses, fault_tolerant=fault_tolerant
        )
        self.target = self._cluster.target
        self._num_workers = len(workers)
        self.local_workers: list = []
        self._stopped: list = []
        try:
            for where, tags in workers[leading:]:
                self.add_worker(where, tags)
        except BaseException:
            self.stop()
            raise

    def add_worker(self, where: str, tags: Sequence[str] = (), port: int = 0) -> None:
        if where == "remote":
            self._cluster.add_worker(tags)
            return
        from tensorflow.core.protobuf import service_config_pb2

        config = service_config_pb2.WorkerConfig(
            dispatcher_address=self._cluster.address,
            worker_address="localhost:%port%",
            port=port,
            protocol="grpc",
            heartbeat_interval_ms=100,
            dispatcher_timeout_ms=1000,
            worker_tags=list(tags),
        )
        self.local_workers.append(tf.data.experimental.service.WorkerServer(config))

    def restart_local_workers(self) -> None:
        # TensorFlow's worker stops once the reads of its iterators end: a deleted iterator still
        # in a reference cycle ends only when collected.
        gc.collect()
        restarted, self.local_workers = self.local_workers, []
        for worker in restarted:
            port = int(worker._address.split(":")[-1])
            worker._stop()
            self.add_worker("local", port=port)
        # A stopped worker's server, when destroyed, takes its address out of TensorFlow's registry
        # of the process's workers, and so the new one at that address (its client then finds no
        # local worker): the stopped ones are kept as long as the cluster.
        self._stopped.extend(restarted)
        # Its dispatcher (worker_timeout_ms 200) dropped the stopped workers: wait for the new ones.
        time.sleep(0.5)
        deadline = time.monotonic() + 30
        while self._cluster.num_workers() < self._num_workers:
            assert time.monotonic() < deadline, "TensorFlow's restarted workers did not register"
            time.sleep(0.1)

    def restart_dispatcher(self) -> None:
        self._cluster.restart_dispatcher()

    def stop(self) -> list[threading.Thread]:
        """Stops the local workers, each on a thread (a worker stopped waits for reads in flight):
        the threads, for the caller to wait for a while."""
        stops = [threading.Thread(target=w._stop, daemon=True) for w in self.local_workers]
        for thread in stops:
            thread.start()
        return stops


@pytest.fixture(scope="module")
def test_hosts():
    require_test_hosts()
    hosts = TestHosts(["remote"])
    yield hosts
    hosts.close()


@pytest.fixture(scope="module")
def clusters(test_hosts):
    """(service, workers in start order, static sharding) -> a cluster shared by the module's
    scenarios, made when one first asks; `fresh=True` makes one for the scenario alone,
    `fault_tolerant=True` one whose dispatcher journals to a work_dir (and can restart)."""
    made: list = []
    shared: dict = {}
    processes: dict = {}

    def remote_host() -> _RemoteHost:
        if "ours" not in processes:
            processes["ours"] = _RemoteHost(test_hosts)
        return processes["ours"]

    def tensorflow() -> TensorFlowService:
        if "tensorflow" not in processes:
            processes["tensorflow"] = TensorFlowService()
        return processes["tensorflow"]

    def get(which: str, workers: Spec, static: str | None = None, fresh: bool = False, fault_tolerant: bool = False):
        key = (which, workers, static, fault_tolerant)
        if fresh or key not in shared:
            if which == "ours":
                cluster = _OurCluster(remote_host, workers, static, fault_tolerant)
            else:
                cluster = _TheirCluster(tensorflow(), workers, static, fault_tolerant)
            made.append(cluster)
            if fresh:
                return cluster
            shared[key] = cluster
        return shared[key]

    yield get
    stopping = [thread for cluster in made for thread in cluster.stop() or ()]
    deadline = time.monotonic() + 10
    for thread in stopping:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes.values():
        process.stop()


@pytest.fixture(params=[(s, m) for s in SERVICES for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, clusters):
    """A scenario's reader: run(pipeline, cluster, limit=None, **distribute_kwargs) -> elements
    (processing_mode "parallel_epochs" unless given, as TensorFlow's test base)."""
    which, mode = request.param

    def read(pipeline: Callable[[], tf.data.Dataset], cluster, limit: int | None = None, **kwargs) -> list:
        kwargs.setdefault("processing_mode", "parallel_epochs")
        if getattr(cluster, "reads_locally", False):
            kwargs.setdefault("target_workers", "LOCAL")

        def make() -> tf.data.Dataset:
            return pipeline().apply(distribute_of(which)(service=cluster.target, **kwargs))

        return read_dataset(make, mode, limit)

    def tensorflow_differs(reason: str) -> None:
        """Marks TensorFlow's run of the scenario as failing, for `reason` (strict: should it pass,
        the scenario fails, and the mark goes)."""
        if which == "tensorflow":
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    read.service, read.mode = which, mode
    read.cluster = lambda *workers, **options: clusters(which, spec(*workers), **options)
    read.tensorflow_differs = tensorflow_differs
    return read


def _range(n: int) -> Callable[[], tf.data.Dataset]:
    return lambda: tf.data.Dataset.range(n)


def _policy(run, name: str):
    policies = service.ShardingPolicy if run.service == "ours" else tf.data.experimental.service.ShardingPolicy
    return getattr(policies, name)


# A TensorFlow client in a process with no worker of TensorFlow's in it: its client counts as
# local every worker in its process, of any cluster, and this module's process has some.
_TENSORFLOW_READ_ALONE = """
import json, sys
import tensorflow as tf
settings = json.loads(sys.argv[1])
if settings["files"]:
    dataset = tf.data.Dataset.list_files(settings["files"], shuffle=False).flat_map(tf.data.TFRecordDataset)
else:
    dataset = tf.data.Dataset.range(10)
S = tf.data.experimental.service
mode = settings["mode"]
mode = mode if mode == "parallel_epochs" else getattr(S.ShardingPolicy, mode)
dataset = dataset.apply(
    S.distribute(processing_mode=mode, service=settings["target"], target_workers=settings["target_workers"])
)
try:
    print("read", len(list(dataset)))
except tf.errors.OpError as e:
    print(type(e).__name__, e.message.replace("\\n", " "))
"""


def _read_in_a_process_without_workers(target: str, mode: str, target_workers: str, files=()) -> str:
    """What TensorFlow's client reads (or raises: class and message) in a process of its own."""
    settings = {"target": target, "mode": mode, "target_workers": target_workers, "files": list(files)}
    done = subprocess.run(
        [sys.executable, "-c", _TENSORFLOW_READ_ALONE, json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]


# ---- local_workers_test.py ----------------------------------------------------------------------

ONE_AND_THREE = [(1, 0), (1, 3), (3, 0), (3, 3)]


def test_one_local_worker(run):
    """testOneLocalWorker: LOCAL reads the one local worker's elements, none of the remote ones'."""
    cluster = run.cluster(*local(1), *remote(3))
    assert run(_range(10), cluster, target_workers="LOCAL") == list(range(10))


@pytest.mark.parametrize("num_local, num_remote", ONE_AND_THREE)
def test_local_workers(run, num_local, num_remote):
    """testLocalWorkers: LOCAL reads every local worker's elements."""
    cluster = run.cluster(*local(num_local), *remote(num_remote))
    same_items(run(_range(10), cluster, target_workers="LOCAL"), num_local * list(range(10)))


def test_repeated_and_prefetched_local_reads(run):
    """testRepeatedDataset and testPrefetchingDataset: a LOCAL read repeated 5 times, and one
    with prefetch(10) after it."""
    cluster = run.cluster(*local(3), *remote(3))
    distribute = distribute_of(run.service)(
        processing_mode="parallel_epochs", service=cluster.target, target_workers="LOCAL"
    )
    repeated = read_dataset(lambda: tf.data.Dataset.range(10).apply(distribute).repeat(5), run.mode)
    same_items(repeated, 3 * 5 * list(range(10)))
    prefetched = read_dataset(lambda: tf.data.Dataset.range(10).apply(distribute).prefetch(10), run.mode)
    same_items(prefetched, 3 * list(range(10)))


def test_multiple_epochs_of_local_reads(run):
    """testMultipleEpochs: ten iterations of one LOCAL dataset, each a job of its own."""
    cluster = run.cluster(*local(1), *remote(3))
    for _ in range(10):
        same_items(run(_range(10), cluster, target_workers="LOCAL"), list(range(10)))


@pytest.mark.parametrize("num_local, num_remote", ONE_AND_THREE)
def test_local_reads_in_distributed_epoch(run, num_local, num_remote):
    """testDynamicSharding: distributed_epoch read with LOCAL gives each element once."""
    cluster = run.cluster(*local(num_local), *remote(num_remote))
    got = run(_range(100), cluster, processing_mode=_policy(run, "DYNAMIC"), target_workers="LOCAL")
    same_items(got, list(range(100)))


def test_multiple_consumers_of_a_shared_job(run):
    """testMultipleConsumers: 8 readers of one named job, read in turns, share every worker's
    elements: each once among them."""
    cluster = run.cluster(*local(1), *remote(3))
    name = unique_name(run, "shared_job")
    results: list = []

    def make(index: int) -> tf.data.Dataset:
        read = distribute_of(run.service)(processing_mode="parallel_epochs", service=cluster.target, job_name=name)
        return tf.data.Dataset.range(300).apply(read)

    if run.mode == "eager":
        iterators = [iter(make(i)) for i in range(8)]
        for _ in range(10):
            results.extend(int(next(it)) for it in iterators)
        for it in iterators:
            results.extend(int(e) for e in it)
    else:
        with tf.Graph().as_default():
            nexts = [tf.compat.v1.data.make_one_shot_iterator(make(i)).get_next() for i in range(8)]
            with tf.compat.v1.Session() as session:
                for _ in range(10):
                    results.extend(int(session.run(n)) for n in nexts)
                for n in nexts:
                    while True:
                        try:
                            results.append(int(session.run(n)))
                        except tf.errors.OutOfRangeError:
                            break
    same_items(results, 4 * list(range(300)))


@pytest.mark.parametrize("num_local, num_remote", ONE_AND_THREE)
def test_empty_dataset_read_locally(run, num_local, num_remote):
    """testEmptyDataset: LOCAL reads of range(0) end at once."""
    cluster = run.cluster(*local(num_local), *remote(num_remote))
    assert run(_range(0), cluster, target_workers="LOCAL") == []


@pytest.mark.parametrize("num_local, num_remote", [(0, 3), (3, 3)])
def test_remote_workers_are_read_by_default(run, num_local, num_remote):
    """testNonLocalRead: AUTO reads the remote workers too."""
    cluster = run.cluster(*local(num_local), *remote(num_remote))
    same_items(run(_range(10), cluster), (num_local + num_remote) * list(range(10)))


def test_local_reads_without_a_local_worker(run):
    """testNoLocalWorker: LOCAL with only remote workers is an InvalidArgumentError."""
    cluster = run.cluster(*remote(3))
    if run.service == "tensorflow":
        got = _read_in_a_process_without_workers(cluster.target, "parallel_epochs", "LOCAL")
        assert got.startswith("InvalidArgumentError") and "no local worker is found" in got, got
        return
    with raises_at_read(run.service, tf.errors.InvalidArgumentError, "none of the iteration's workers runs on"):
        run(_range(10), cluster, target_workers="LOCAL")


def test_one_job_name_with_other_target_workers(run):
    """testInconsistentTargetWorkers: a named job read with AUTO, then with ANY, is refused."""
    cluster = run.cluster(*local(3), *remote(3))
    name = unique_name(run, "test_job")
    run(_range(10), cluster, job_name=name, target_workers="AUTO")
    if run.service == "tensorflow":
        message = "existing job with different parameters: Existing target workers: <AUTO>; got <ANY>"
        expected = pytest.raises(tf.errors.InvalidArgumentError, match=message)
    else:
        expected = raises_at_read(
            run.service, tf.errors.InvalidArgumentError, "already exists.*target_workers AUTO vs ANY"
        )
    with expected:
        run(_range(10), cluster, job_name=name, target_workers="ANY")


def test_anonymous_jobs_with_each_target_workers(run):
    """testAnonymousJobWithDifferentTargetWorkers: AUTO and ANY read all six workers, LOCAL the
    three local ones."""
    cluster = run.cluster(*local(3), *remote(3))
    for target, count in (("AUTO", 6), ("ANY", 6), ("LOCAL", 3)):
        same_items(run(_range(10), cluster, target_workers=target), count * list(range(10)))


def test_coordinated_reads_of_local_workers_are_refused(run):
    """testCoordinatedRead: coordinated reads with LOCAL are an InvalidArgumentError."""
    cluster = run.cluster(*local(3), *remote(3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Coordinated reads require non-local workers"):
        run(
            lambda: tf.data.Dataset.range(10).repeat(),
            cluster,
            job_name=unique_name(run, "test_job"),
            consumer_index=0,
            num_consumers=3,
            target_workers="LOCAL",
        )


def _infinite_local(run, cluster, job_name: str | None = None) -> tf.data.Dataset:
    read = distribute_of(run.service)(
        processing_mode="parallel_epochs", service=cluster.target, job_name=job_name, target_workers="LOCAL"
    )
    return tf.data.Dataset.range(1000000).repeat().apply(read)


@pytest.mark.parametrize("num_remote", [0, 3])
def test_each_epoch_of_an_infinite_local_read_starts_over(run, num_remote):
    """LocalTaskGarbageCollectTest.testMultipleEpochs: five iterators in turn over one infinite
    LOCAL dataset each read 0, 1, 2, 3, 4 (each a new job; the last one's task is let go)."""
    cluster = run.cluster(*local(1), *remote(num_remote))
    for _ in range(5):
        assert read_dataset(lambda: _infinite_local(run, cluster), run.mode, limit=5) == list(range(5))


@eager_only
@pytest.mark.parametrize("num_remote", [0, 3])
def test_each_epoch_of_a_shared_infinite_local_read_starts_over(run, num_remote):
    """LocalTaskGarbageCollectTest.testMultipleEpochsSharedJob: five iterators in turn over one
    infinite LOCAL dataset of a named job each read 0, 1, 2, 3, 4 (each iterator is the job's next
    repetition)."""
    cluster = run.cluster(*local(1), *remote(num_remote))
    dataset = _infinite_local(run, cluster, unique_name(run, "shared_job_name"))
    for _ in range(5):
        iterator = iter(dataset)
        assert [int(next(iterator)) for _ in range(5)] == list(range(5))
        del iterator


@pytest.mark.parametrize("job_name", [None, "shared_job_name"])
def test_a_local_read_repeated(run, job_name):
    """LocalTaskGarbageCollectTest.testRepeatDistributedDataset: LOCAL range(10) repeated 3
    times, in order, with and without a job name."""
    cluster = run.cluster(*local(1), *remote(3))
    name = unique_name(run, job_name) if job_name else None
    read = distribute_of(run.service)(
        processing_mode="parallel_epochs", service=cluster.target, job_name=name, target_workers="LOCAL"
    )
    got = read_dataset(lambda: tf.data.Dataset.range(10).apply(read).repeat(3), run.mode)
    assert got == list(range(10)) * 3


@pytest.mark.parametrize("num_remote", [0, 3])
def test_a_new_dataset_of_a_shared_local_job_after_its_iterator_went(run, num_remote):
    """LocalTaskGarbageCollectTest.testReadFromDeletedTask (and its _GraphMode): an iterator of a
    named, infinite LOCAL job reads 10 and is deleted; a dataset made again with the job's name
    starts at the job's first repetition. TensorFlow's client then reads the task its first
    iterator's deletion deleted (FailedPreconditionError "... which has been deleted"); ours
    joins that repetition as a second reader of a shared job and reads on where the job is."""
    cluster = run.cluster(*local(1), *remote(num_remote), fresh=True)
    name = unique_name(run, "shared_job_name")
    assert read_dataset(lambda: _infinite_local(run, cluster, name), run.mode, limit=10) == list(range(10))
    if run.service == "tensorflow":
        with pytest.raises(tf.errors.FailedPreconditionError, match="which has been deleted"):
            read_dataset(lambda: _infinite_local(run, cluster, name), run.mode, limit=1)
        return
    later = read_dataset(lambda: _infinite_local(run, cluster, name), run.mode, limit=10)
    assert later == list(range(later[0], later[0] + 10)) and later[0] >= 10, later


@eager_only
@pytest.mark.parametrize("num_remote", [0, 3])
@pytest.mark.parametrize("restart", ["worker", "dispatcher"])
def test_the_next_epoch_of_a_shared_local_job_after_a_restart(run, num_remote, restart):
    """LocalTaskGarbageCollectTest.testMultipleEpochs_WorkerRestart and _DispatcherRestart: an
    iterator of a named, infinite LOCAL job reads 0..9 and is deleted; the local worker (or the
    fault-tolerant dispatcher) restarts at its address; the dataset's next iterator, the job's
    next repetition, reads 0..9 from the local worker again."""
    cluster = run.cluster(*local(1), *remote(num_remote), fresh=True, fault_tolerant=restart == "dispatcher")
    dataset = _infinite_local(run, cluster, unique_name(run, "shared_job_name"))
    iterator = iter(dataset)
    assert [int(next(iterator)) for _ in range(10)] == list(range(10))
    del iterator
    if restart == "worker":
        cluster.restart_local_workers()
    else:
        cluster.restart_dispatcher()
    iterator = iter(dataset)
    assert [int(next(iterator)) for _ in range(10)] == list(range(10))
    del iterator


# ---- worker_tags_test.py ------------------------------------------------------------------------


@pytest.mark.parametrize("num_remote", [0, 3])
def test_auto_reads_the_colocated_local_worker_only(run, num_remote):
    """testReadFromLocalWorker: with every worker COLOCATED, AUTO reads the local one only."""
    cluster = run.cluster(*local(1, [COLOCATED]), *remote(num_remote, [COLOCATED]))
    assert run(_range(100), cluster) == list(range(100))


@pytest.mark.parametrize("num_local, num_remote", ONE_AND_THREE)
def test_auto_reads_local_and_untagged_workers(run, num_local, num_remote):
    """testReadFromLocalAndNonTpuWorkers: AUTO reads the local workers and an untagged remote
    one, not the COLOCATED remote ones."""
    cluster = run.cluster(*local(num_local, [COLOCATED]), *remote(num_remote, [COLOCATED]), *remote(1))
    same_items(run(_range(100), cluster), (num_local + 1) * list(range(100)))


@pytest.mark.parametrize("num_remote", [0, 3])
def test_an_untagged_local_worker_is_read(run, num_remote):
    """testLocalWorkerHasNoTag: an untagged local worker beside COLOCATED remote ones: AUTO reads
    the local one only."""
    cluster = run.cluster(*remote(num_remote, [COLOCATED]), *local(1))
    assert run(_range(100), cluster) == list(range(100))


@pytest.mark.parametrize("num_local", [1, 3])
def test_tags_in_distributed_epoch(run, num_local):
    """testReadFromLocalAndNonTpuWorkers_DynamicSharding: distributed_epoch with COLOCATED
    workers on both sides and an untagged remote one gives each element once."""
    cluster = run.cluster(*local(num_local, [COLOCATED]), *remote(3, [COLOCATED]), *remote(1))
    same_items(run(_range(100), cluster, processing_mode=_policy(run, "DYNAMIC")), list(range(100)))


def test_static_sharding_reads_the_local_worker(run):
    """testReadFromLocalWorker_StaticSharding: FILE_OR_DATA over five listed workers, read with
    AUTO: the local (first) worker's shard only."""
    run.tensorflow_differs("TensorFlow's 2.21 client reads every worker under static sharding with AUTO")
    cluster = run.cluster(*local(1, [COLOCATED]), *remote(3, [COLOCATED]), *remote(1), static="port")
    assert run(_range(100), cluster, processing_mode=_policy(run, "FILE_OR_DATA")) == list(range(0, 100, 5))


@pytest.mark.parametrize("num_local, num_remote", [(1, 1), (3, 3)])
def test_coordinated_reads_with_tags(run, num_local, num_remote):
    """testCoordinatedRead: 4 coordinated consumers over COLOCATED local and remote workers: each
    round from one worker (coordinated reads read every worker)."""
    cluster = run.cluster(*local(num_local, [COLOCATED]), *remote(num_remote, [COLOCATED]))
    name, num_consumers = unique_name(run, "coordinated"), 4

    def make() -> tf.data.Dataset:
        starts = tf.data.Dataset.from_tensors(np.int64(0)).concatenate(tf.data.Dataset.random())
        groups = starts.flat_map(
            lambda x: tf.data.Dataset.range((x % 2**32) * num_consumers, (x % 2**32 + 1) * num_consumers)
        )
        consumers = [
            groups.apply(
                distribute_of(run.service)(
                    processing_mode="parallel_epochs",
                    service=cluster.target,
                    job_name=name,
                    consumer_index=index,
                    num_consumers=num_consumers,
                )
            )
            for index in range(num_consumers)
        ]
        return tf.data.Dataset.from_tensor_slices(consumers).interleave(
            lambda x: x, cycle_length=num_consumers, num_parallel_calls=num_consumers
        )

    got = read_dataset(make, run.mode, limit=200)
    rounds = [got[i : i + num_consumers] for i in range(0, len(got), num_consumers)]
    assert len(got) == 200
    assert all(r == list(range(r[0], r[0] + num_consumers)) for r in rounds), rounds[:5]


@eager_only
def test_remote_workers_added_mid_job(run):
    """testAddRemoteWorkersMidJob: four remote workers join a job after 100 elements, two of them
    COLOCATED: the job's elements come from the local worker and the two untagged newcomers."""
    cluster = run.cluster(*local(1, [COLOCATED]), *remote(1, [COLOCATED]), fresh=True)
    num_elements = 200 + 2  # TensorFlow's margin: one prefetched element per core
    iterator = iter(
        tf.data.Dataset.range(num_elements).apply(
            distribute_of(run.service)(processing_mode="parallel_epochs", service=cluster.target)
        )
    )
    got = [int(next(iterator)) for _ in range(100)]
    for tags in ([], [COLOCATED], [], [COLOCATED]):
        cluster.add_worker("remote", tags)
    got.extend(int(e) for e in iterator)
    # TensorFlow's test expects 3 copies (the local worker's and the two untagged newcomers'). Both
    # services read fewer: a client that reads some of the iteration's tasks (AUTO left the
    # COLOCATED remote worker out) ends with its own tasks, and the local task may have delivered
    # all its elements before the newcomers join (read ahead). What they read are whole copies:
    # the local worker's and those of the newcomers the client saw in time.
    counts = collections.Counter(got)
    assert set(counts) == set(range(num_elements)) and len(set(counts.values())) == 1, counts
    assert next(iter(counts.values())) in (1, 2, 3)


def test_several_tags(run):
    """testMultipleTags: workers tagged COLOCATED and two more tags: AUTO reads the local one."""
    tags = [COLOCATED, "COLOCATED_2", "COLOCATED_3"]
    cluster = run.cluster(*local(1, tags), *remote(3, tags))
    assert run(_range(100), cluster) == list(range(100))


def test_unused_tags(run):
    """testUnusedTags: tags other than COLOCATED change nothing: AUTO reads all four workers."""
    tags = ["Unused tag 1", "Unused tag 2", "Unused tag 3"]
    cluster = run.cluster(*local(1, tags), *remote(3, tags))
    same_items(run(_range(100), cluster), 4 * list(range(100)))


def test_an_empty_tag_is_refused(run):
    """testInvalidTag: a worker with an empty tag does not start."""
    if run.service == "tensorflow":
        with pytest.raises(RuntimeError, match="Worker tags cannot be empty"):
            run.cluster(*local(1, ["", COLOCATED]), fresh=True)
    else:
        with pytest.raises(ValueError, match="worker_tags must be a list of non-empty strings"):
            run.cluster(*local(1, ["", COLOCATED]), fresh=True)


# ---- auto_shard_test.py -------------------------------------------------------------------------


def _sharded(run, num_workers: int = 5, local_index: int = 3, entries: str = "host", fresh: bool = False):
    """TensorFlow's `_make_service_cluster`: `num_workers` workers listed for static sharding, the
    local one at `local_index` among them, the others remote. Reads of it are LOCAL unless a
    scenario says otherwise, as in TensorFlow's tests of its 2.21 release (whose client reads
    every worker under static sharding with AUTO; its later tests read AUTO as LOCAL, as ours)."""
    workers = [*remote(local_index), *local(1), *remote(num_workers - local_index - 1)]
    cluster = run.cluster(*workers, static=entries, fresh=fresh)
    cluster.reads_locally = True
    return cluster


@pytest.fixture(scope="module")
def record_files(tmp_path_factory) -> list[str]:
    """10 TFRecord files of 10 records each: b"Record r of file f"."""
    return write_record_files(tmp_path_factory.mktemp("records"), 10, 10)


def _records(files: Sequence[int], records: Sequence[int], files_first: bool = True) -> list[bytes]:
    if files_first:
        return [b"Record %d of file %d" % (r, f) for f in files for r in records]
    return [b"Record %d of file %d" % (r, f) for r in records for f in files]


def _files_then_records(names: Sequence[str], shuffle: bool = False) -> Callable[[], tf.data.Dataset]:
    return lambda: tf.data.Dataset.list_files(list(names), shuffle=shuffle).flat_map(tf.data.TFRecordDataset)


@pytest.mark.parametrize("policy", ["DATA", "FILE_OR_DATA"])
def test_range_shard_by_data(run, policy):
    """testRangeDataset_AutoShard: range(20) over 5 workers, the local one second: its shard."""
    cluster = _sharded(run, local_index=1)
    assert run(_range(20), cluster, processing_mode=_policy(run, policy), target_workers="LOCAL") == [1, 6, 11, 16]


def test_range_shard_by_file_has_no_files(run):
    """testRangeDataset_FileShard: FILE over range() is a NotFoundError (no file source)."""
    cluster = _sharded(run, local_index=1)
    if run.service == "tensorflow":
        expected = pytest.raises(tf.errors.NotFoundError, match="Found an unshardable source dataset")
    else:
        # Ours finds it when the job is made, before any worker runs: InvalidArgument.
        expected = raises_at_read(run.service, tf.errors.InvalidArgumentError, "Found an unshardable source dataset")
    with expected:
        run(_range(20), cluster, processing_mode=_policy(run, "FILE"), target_workers="LOCAL")


def test_range_shard_hints(run):
    """testRangeDataset_ShardHint and _NoShardHint: shard(SHARD_HINT, SHARD_HINT) under HINT is
    the worker's shard; shard(1, 0) stays as written."""
    cluster = _sharded(run, local_index=1)
    hint = tf.data.experimental.SHARD_HINT
    hinted = run(lambda: tf.data.Dataset.range(20).shard(hint, hint), cluster, processing_mode=_policy(run, "HINT"))
    assert hinted == [1, 6, 11, 16]
    plain_shard = run(lambda: tf.data.Dataset.range(20).shard(1, 0), cluster, processing_mode=_policy(run, "HINT"))
    assert plain_shard == list(range(20))


def test_no_sharding_and_one_worker(run):
    """testRangeDataset_NoShard and _OneWorker: OFF reads the local worker's whole range; one
    listed worker's shard is the whole range."""
    assert run(_range(20), _sharded(run, local_index=1), target_workers="LOCAL") == list(range(20))
    one = _sharded(run, num_workers=1, local_index=0)
    assert run(_range(20), one, processing_mode=_policy(run, "FILE_OR_DATA")) == list(range(20))


def test_static_sharding_read_from_any_worker_is_refused(run):
    """testRangeDataset_ReadFromAllWorkers (and the TFRecord one): static sharding with
    target_workers ANY is an InvalidArgumentError."""
    run.tensorflow_differs("TensorFlow's 2.21 client reads every worker under static sharding with ANY")
    cluster = _sharded(run, local_index=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires reading from local workers"):
        run(_range(20), cluster, processing_mode=_policy(run, "FILE_OR_DATA"), target_workers="ANY")


@pytest.mark.parametrize("policy", ["FILE_OR_DATA", "FILE"])
def test_records_shard_by_file(run, record_files, policy):
    """testTFRecordDataset_AutoShard and _ShuffleFileList: the fourth of 5 workers reads files 3
    and 8, in order (in some order when list_files shuffles)."""
    cluster = _sharded(run, local_index=3)
    policy = _policy(run, policy)
    assert run(_files_then_records(record_files), cluster, processing_mode=policy) == _records((3, 8), range(10))
    shuffled = run(_files_then_records(record_files, shuffle=True), cluster, processing_mode=policy)
    same_items(shuffled, _records((3, 8), range(10)))


def test_records_shard_by_data_and_by_hints(run, record_files):
    """testTFRecordDataset_DataShard, _HintDataShard, _HintFileShard and _NoShard."""
    cluster = _sharded(run, local_index=3)
    hint = tf.data.experimental.SHARD_HINT
    by_data = run(_files_then_records(record_files), cluster, processing_mode=_policy(run, "DATA"))
    assert by_data == _records(range(10), (3, 8))
    hinted_records = run(
        lambda: _files_then_records(record_files)().shard(hint, hint), cluster, processing_mode=_policy(run, "HINT")
    )
    assert hinted_records == _records(range(10), (3, 8))

    def hinted_files() -> tf.data.Dataset:
        files = tf.data.Dataset.list_files(record_files, shuffle=False).shard(hint, hint)
        return files.flat_map(tf.data.TFRecordDataset)

    assert run(hinted_files, cluster, processing_mode=_policy(run, "HINT")) == _records((3, 8), range(10))
    whole = run(_files_then_records(record_files), cluster, target_workers="LOCAL")
    assert whole == _records(range(10), range(10))


@pytest.mark.parametrize("policy", ["FILE_OR_DATA", "FILE"])
def test_fewer_files_than_workers(run, record_files, policy):
    """testTFRecordDataset_FewerFilesThanWorkers: 4 files cannot be sharded by file over 5
    workers (InvalidArgumentError); _DataShard: by data they can."""
    cluster = _sharded(run, local_index=3)
    message = "not enough for the required 5 shards/workers"
    if run.service == "tensorflow":
        expected = pytest.raises(tf.errors.InvalidArgumentError, match=message)
    else:
        expected = raises_at_read(run.service, tf.errors.InvalidArgumentError, message)
    with expected:
        run(_files_then_records(record_files[:4]), cluster, processing_mode=_policy(run, policy))
    by_data = run(_files_then_records(record_files[:4]), cluster, processing_mode=_policy(run, "DATA"))
    same_items(by_data, _records(range(4), (3, 8)))


@pytest.mark.parametrize("policy", ["FILE_OR_DATA", "DATA"])
def test_batches_sharded(run, policy):
    """testBatchDataset: range(20).batch(3) over 5 workers, the second: batches 1 and 6."""
    cluster = _sharded(run, local_index=1)
    assert run(lambda: tf.data.Dataset.range(20).batch(3), cluster, processing_mode=_policy(run, policy)) == [
        (3, 4, 5),
        (18, 19),
    ]


def test_interleave_zip_and_concatenate_sharded_by_file(run, record_files):
    """testInterleaveDataset, testZipDataset, testConcatenateDataset and testEmptyDataset."""
    cluster = _sharded(run, local_index=3)
    policy = _policy(run, "FILE_OR_DATA")

    def interleaved() -> tf.data.Dataset:
        files = tf.data.Dataset.list_files(record_files, shuffle=False)
        return files.interleave(tf.data.TFRecordDataset, cycle_length=10, num_parallel_calls=tf.data.AUTOTUNE)

    expected = _records((3, 8), range(10), files_first=False)
    assert run(lambda: interleaved().prefetch(tf.data.AUTOTUNE), cluster, processing_mode=policy) == expected
    zipped = run(lambda: tf.data.Dataset.zip((interleaved(), interleaved())), cluster, processing_mode=policy)
    assert zipped == [(e, e) for e in expected]
    joined = run(lambda: interleaved().concatenate(interleaved()), cluster, processing_mode=policy)
    assert joined == expected + expected
    assert run(_range(0), cluster, processing_mode=policy) == []


@pytest.mark.parametrize("entries", ["port", "named-port"])
def test_listed_addresses_with_open_ports(run, entries):
    """testAnonymousPorts and testNamedPorts: entries "host:%port%" and "host:%port_worker%"
    take the workers of their host in the order they register."""
    cluster = _sharded(run, local_index=3, entries=entries)
    assert run(_range(20), cluster, processing_mode=_policy(run, "FILE_OR_DATA")) == [3, 8, 13, 18]


@pytest.mark.parametrize("entries", ["bad-port", "other-hosts", "one-entry"])
def test_workers_without_an_entry_are_refused(run, entries):
    """testInvalidPorts, testWorkerNotFound and testMoreWorkersThanConfigured: a worker that
    finds no entry for it in the list does not start."""
    message = (
        "other workers are already running at the configured host"
        if run.service == "tensorflow"
        else "not in the dispatcher's worker_addresses"
    )
    with pytest.raises(RuntimeError if run.service == "tensorflow" else tf.errors.FailedPreconditionError) as e:
        _sharded(run, local_index=1 if entries == "one-entry" else 0, entries=entries, fresh=True)
    assert message in str(e.value) or (run.service == "tensorflow" and "address is not configured" in str(e.value))


def test_an_empty_list_of_workers(run):
    """testEmptyWorkerList: workers register with a dispatcher whose list is empty, but static
    sharding cannot give them an index. TensorFlow's raises NotFoundError when a worker runs its
    task; ours refuses the job when it is made: FailedPreconditionError naming worker_addresses."""
    cluster = _sharded(run, local_index=1, entries="empty")
    if run.service == "tensorflow":
        expected = pytest.raises(tf.errors.NotFoundError, match="Worker .* is not in the workers list")
    else:
        expected = raises_at_read(run.service, tf.errors.FailedPreconditionError, "needs a dispatcher configured with")
    with expected:
        run(_range(20), cluster, processing_mode=_policy(run, "FILE_OR_DATA"))


def test_static_sharding_without_local_workers(run, record_files):
    """testNoLocalWorkers: FILE_OR_DATA read with LOCAL and no local worker is an
    InvalidArgumentError."""
    only_remote = run.cluster(*remote(3), static="host")
    only_remote.reads_locally = True
    if run.service == "tensorflow":
        got = _read_in_a_process_without_workers(only_remote.target, "FILE_OR_DATA", "LOCAL", record_files)
        assert got.startswith("InvalidArgumentError"), got
        assert "Static sharding policy <FILE_OR_DATA> requires local tf.data workers" in got, got
        return
    with raises_at_read(run.service, tf.errors.InvalidArgumentError, "static sharding reads the workers on this host"):
        run(_files_then_records(record_files), only_remote, processing_mode=_policy(run, "FILE_OR_DATA"))


@pytest.mark.parametrize("policy", ["OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_every_sharding_policy_reads(run, record_files, policy):
    """testEnumerateShardingPolicies: every policy reads the records without an error."""
    cluster = _sharded(run, local_index=3)
    assert run(_files_then_records(record_files), cluster, processing_mode=_policy(run, policy))
