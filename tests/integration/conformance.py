"""What the conformance modules (test_conformance*.py) share: TensorFlow's own service as a
process, reading a dataset eagerly or in a tf.Graph, and comparing elements.

Each scenario there is written from a test of TensorFlow's `tensorflow/python/data/experimental/
kernel_tests/service/` (named in its docstring) and runs against ours and against TensorFlow's
service, in eager mode and in graph mode (a tf.Graph read through a Session, as TF1-style code
does). A scenario whose two services differ fails, or is marked with the reason (README,
"Compatibility").
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import select
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.experimental.ops import data_service_ops

import dataservice as service
from dataservice.local_cluster import LocalCluster

SERVICES = ("ours", "tensorflow")
MODES = ("eager", "graph")

# The `run` parameter of a scenario TensorFlow's test runs eagerly only: both services, eager.
eager_only = pytest.mark.parametrize(
    "run", [(s, "eager") for s in SERVICES], indirect=True, ids=lambda p: f"{p[0]}-{p[1]}"
)

# TensorFlow's service in a process of its own: every cluster of a test module, each a dispatcher
# and workers configured as TensorFlow's own tests configure them (their test_base.py): heartbeats
# every 100 ms and short timeouts, so that finished work is seen quickly; a work_dir and
# fault-tolerant mode where a scenario restarts the dispatcher; the workers' configuration message
# as those tests give it (its WorkerConfig tuple has neither tags nor a cross-trainer cache size).
# One process, so that a cluster costs no TensorFlow import. It prints "ready", then answers each
# command line (JSON) with a JSON line: a new cluster's [id, target], a new worker's address, a
# number of workers, null, or {"error": ...} when a server does not start. It serves until its
# stdin closes (the module's end, or the test process's).
_TENSORFLOW_SERVICE = """
import json, os, sys, tempfile, threading, time
import tensorflow as tf
from tensorflow.core.protobuf import service_config_pb2

S = tf.data.experimental.service

class Cluster:
    def __init__(self, command):
        self.cache_bytes = command["cache_bytes"]
        self.options = dict(
            worker_timeout_ms=200, job_gc_check_interval_ms=1000, worker_addresses=command["worker_addresses"]
        )
        if command.get("fault_tolerant"):
            self.options.update(work_dir=tempfile.mkdtemp(), fault_tolerant_mode=True)
        self.options.update(command.get("dispatcher_options") or {})
        self.dispatcher = S.DispatchServer(self.config(command.get("port", 0)))
        self.address = self.dispatcher.target.split("://")[1]
        self.workers = [self.start_worker(tags) for tags in command["workers"]]

    def config(self, port):
        # Fields the Python DispatcherConfig lacks (client_timeout_ms) go in the proto, as
        # TensorFlow's own tests pass them.
        fields = set(S.DispatcherConfig._fields)
        if all(name in fields for name in self.options):
            return S.DispatcherConfig(port=port, **self.options)
        options = {k: v for k, v in self.options.items() if v is not None}
        return service_config_pb2.DispatcherConfig(port=port, protocol="grpc", **options)

    def start_worker(self, tags, port=0):
        defaults = S.WorkerConfig(dispatcher_address=self.address)
        fields = {f: getattr(defaults, f) for f in defaults._fields if getattr(defaults, f) is not None}
        config = service_config_pb2.WorkerConfig(**fields)
        config.heartbeat_interval_ms, config.dispatcher_timeout_ms, config.port = 100, 1000, port
        if self.cache_bytes is not None:
            config.cross_trainer_cache_size_bytes = self.cache_bytes
        config.worker_tags.extend(tags)
        return S.WorkerServer(config)

    def restart_dispatcher(self):
        port = int(self.address.split(":")[-1])
        self.dispatcher._stop()
        self.dispatcher = S.DispatchServer(self.config(port))

    def restart_worker(self, index, same_port):
        port = int(self.workers[index]._address.split(":")[-1]) if same_port else 0
        self.workers[index]._stop()
        self.workers[index] = self.start_worker([], port)

clusters = []
started_late = []

def start_late(command):
    time.sleep(command["delay_s"])
    started_late.append(Cluster(command))

print("ready", flush=True)
for line in sys.stdin:
    command = json.loads(line)
    try:
        answer = None
        if command["do"] == "cluster":
            clusters.append(Cluster(command))
            answer = [len(clusters) - 1, clusters[-1].dispatcher.target]
        elif command["do"] == "cluster_later":
            threading.Thread(target=start_late, args=(command,), daemon=True).start()
        else:
            cluster = clusters[command["cluster"]]
            if command["do"] == "add":
                cluster.workers.append(cluster.start_worker(command["tags"]))
                answer = cluster.workers[-1]._address
            elif command["do"] == "restart_dispatcher":
                cluster.restart_dispatcher()
            elif command["do"] == "stop_dispatcher":
                cluster.dispatcher._stop()
            elif command["do"] == "restart_worker":
                cluster.restart_worker(command["index"], command["same_port"])
            elif command["do"] == "stop_worker":
                cluster.workers[command["index"]]._stop()
            elif command["do"] == "num_workers":
                answer = cluster.dispatcher._num_workers()
            elif command["do"] == "num_tasks":
                answer = sum(worker._num_tasks() for worker in cluster.workers)
    except Exception as e:
        answer = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
os._exit(0)
"""


class LineProcess:
    """A Python program (`script`, with `args`) run as a process, optionally through a launcher
    (`ip netns exec` for a test host), that prints a first line when ready and takes commands,
    one a line, on stdin, answering each with a line."""

    def __init__(self, script: str, args: Sequence[str], what: str, launcher: Sequence[str] = ()):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self._what = what
        self._process = subprocess.Popen(
            [*launcher, sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.first_line = self._line()

    def _line(self, timeout_s: float = 120) -> str:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        line = self._process.stdout.readline().strip() if ready else ""
        if not line:
            self.stop()
            raise RuntimeError(f"{self._what} did not answer within {timeout_s} s")
        return line

    def ask(self, command: str) -> str:
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._line()

    def stop(self) -> None:
        """Kills the process at once: TensorFlow's servers, stopped in order, wait for reads in
        flight (a dropped coordinated-read iterator held a module's teardown for minutes)."""
        self._process.kill()
        self._process.wait(timeout=30)
        self._process.stdin.close()
        self._process.stdout.close()


# TensorFlow's servers in a process of their own, for differential tests that need no worker in the
# test process (data_transfer_protocol="local" and target_workers="LOCAL" do), configured as given
# rather than as TensorFlow's tests configure theirs (_TENSORFLOW_SERVICE): argv[1] is JSON of
# {"workers": N, "dispatcher": DispatcherConfig fields, "worker": WorkerConfig fields}.
_TENSORFLOW_SERVERS = """
import json, sys
import tensorflow as tf
service = tf.data.experimental.service
options = json.loads(sys.argv[1])
dispatcher = service.DispatchServer(service.DispatcherConfig(**options["dispatcher"]))
address = dispatcher.target.split("://")[1]
workers = [
    service.WorkerServer(service.WorkerConfig(dispatcher_address=address, **options["worker"]))
    for _ in range(options["workers"])
]
print(dispatcher.target, flush=True)
sys.stdin.read()  # serves until the test process closes the pipe (or is gone)
"""


@contextlib.contextmanager
def tensorflow_servers(
    num_workers: int, dispatcher: dict[str, Any] | None = None, worker: dict[str, Any] | None = None
) -> Iterator[str]:
    """TensorFlow's dispatcher and `num_workers` workers (the comparison's) in a LineProcess,
    killed afterwards; yields the dispatcher's target. Stopped in the test process, they made a
    module's teardown take 10-30 s (60-140 s in CI): TensorFlow's worker stop waits for the reads
    in flight and holds the GIL while it does, so no bound on that wait held."""
    options = {"workers": num_workers, "dispatcher": dispatcher or {}, "worker": worker or {}}
    process = LineProcess(_TENSORFLOW_SERVERS, [json.dumps(options)], "TensorFlow's servers")
    try:
        yield process.first_line
    finally:
        process.stop()


class TensorFlowService:
    """TensorFlow's service as one process (_TENSORFLOW_SERVICE) holding a module's clusters."""

    def __init__(self):
        self._process = LineProcess(_TENSORFLOW_SERVICE, [], "TensorFlow's service")

    def ask(self, **command) -> object:
        """The answer to `command`; RuntimeError (TensorFlow's servers' class) with the message of
        a server that did not start."""
        answer = json.loads(self._process.ask(json.dumps(command)))
        if isinstance(answer, dict) and "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def cluster(
        self,
        num_workers: int = 0,
        cache_bytes: int | None = None,
        worker_tags: Sequence[Sequence[str]] | None = None,
        worker_addresses: Sequence[str] | None = None,
        fault_tolerant: bool = False,
        dispatcher_options: dict | None = None,
    ) -> TensorFlowCluster:
        """A dispatcher (with a static sharding list, `worker_addresses`, if given; with a
        work_dir and in fault-tolerant mode if `fault_tolerant`; with `dispatcher_options`,
        DispatcherConfig fields, over the defaults) and a worker for each entry of `worker_tags`
        (its tags), or `num_workers` untagged ones, each with a cross-trainer cache of
        `cache_bytes` if given."""
        tags = [list(t) for t in worker_tags] if worker_tags is not None else [[] for _ in range(num_workers)]
        number, target = self.ask(
            do="cluster",
            workers=tags,
            cache_bytes=cache_bytes,
            worker_addresses=worker_addresses,
            fault_tolerant=fault_tolerant,
            dispatcher_options=dispatcher_options,
        )
        return TensorFlowCluster(self, number, target)

    def cluster_later(self, port: int, delay_s: float, num_workers: int = 1) -> str:
        """A cluster as cluster() makes it, its dispatcher at `port`, started `delay_s` from now
        (in the background); its target."""
        self.ask(
            do="cluster_later",
            port=port,
            delay_s=delay_s,
            workers=[[] for _ in range(num_workers)],
            cache_bytes=None,
            worker_addresses=None,
        )
        return f"grpc://localhost:{port}"

    def stop(self) -> None:
        self._process.stop()


class TensorFlowCluster:
    """One cluster of a TensorFlowService; it lives as long as the service's process."""

    def __init__(self, service: TensorFlowService, number: int, target: str):
        self._service = service
        self._number = number
        self.target = target
        self.address = target.split("://")[1]

    def add_worker(self, tags: Sequence[str] = ()) -> str:
        """Starts one more worker in the service's process (remote, to a client here); its address."""
        return self._service.ask(do="add", cluster=self._number, tags=list(tags))

    def restart_dispatcher(self) -> None:
        """A new dispatcher at the same port, from the work_dir (a fault-tolerant cluster)."""
        self._service.ask(do="restart_dispatcher", cluster=self._number)

    def stop_dispatcher(self) -> None:
        self._service.ask(do="stop_dispatcher", cluster=self._number)

    def restart_worker(self, index: int, same_port: bool = True) -> None:
        self._service.ask(do="restart_worker", cluster=self._number, index=index, same_port=same_port)

    def stop_worker(self, index: int) -> None:
        self._service.ask(do="stop_worker", cluster=self._number, index=index)

    def num_workers(self) -> int:
        return self._service.ask(do="num_workers", cluster=self._number)

    def num_tasks(self) -> int:
        """The tasks the cluster's workers run, all together."""
        return self._service.ask(do="num_tasks", cluster=self._number)

    def stop(self) -> None:
        """Nothing: the service's process ends with the module (stopping TensorFlow's servers
        waits for reads in flight; a dropped coordinated-read iterator held a teardown for minutes)."""


# TensorFlow's client asks its dispatcher for new tasks every this often in TensorFlow's own tests
# (their test_base.py reads its service through the private `_distribute` with this hint; its
# from_dataset_id cases use the public function and its default, a second).
_TENSORFLOW_TASK_REFRESH_MS = 20


def distribute_of(which: str):
    """`distribute` of the service, TensorFlow's as its tests call it."""
    if which == "ours":
        return service.distribute
    return functools.partial(data_service_ops._distribute, task_refresh_interval_hint_ms=_TENSORFLOW_TASK_REFRESH_MS)


def public_distribute_of(which: str):
    """`distribute` of the service as users call it (its argument checks are in the public function)."""
    return service.distribute if which == "ours" else tf.data.experimental.service.distribute


def from_dataset_id_of(which: str):
    return service.from_dataset_id if which == "ours" else tf.data.experimental.service.from_dataset_id


def register_dataset_of(which: str):
    return service.register_dataset if which == "ours" else tf.data.experimental.service.register_dataset


def plain(value):
    """An element as nested tuples of Python scalars, to compare and count."""
    if isinstance(value, tuple | list):
        return tuple(plain(v) for v in value)
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else tuple(value.tolist())


def read_dataset(
    make: Callable[[], tf.data.Dataset],
    mode: str,
    limit: int | None = None,
    until: Callable[[object], bool] | None = None,
) -> list:
    """The elements of the dataset `make()` builds, read eagerly or in a tf.Graph with a Session:
    all of them, the first `limit`, or up to the first for which `until(element)` is true."""
    out: list = []

    def keep(element) -> bool:
        out.append(plain(element))
        return until is not None and until(out[-1])

    if mode == "eager":
        dataset = make()
        if limit is not None:
            dataset = dataset.take(limit)
        for element in dataset.as_numpy_iterator():
            if keep(element):
                break
        return out
    with tf.Graph().as_default():
        dataset = make()
        if limit is not None:
            dataset = dataset.take(limit)
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        next_element = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(iterator.initializer)
            while True:
                try:
                    if keep(session.run(next_element)):
                        return out
                except tf.errors.OutOfRangeError:
                    return out


def scenario_reader(which: str, mode: str, clusters: Callable[..., Any]) -> Callable[..., list]:
    """A scenario's reader of `which` service in `mode`: run(pipeline, num_workers, limit=None,
    **distribute_kwargs) -> elements (distributed_epoch unless told), with run.service, run.mode
    and run.cluster(num_workers, **cluster_options) (`clusters` is a cluster_pool's get)."""

    def run(pipeline: Callable[[], tf.data.Dataset], num_workers: int, limit: int | None = None, **kwargs) -> list:
        cluster = clusters(which, num_workers)
        kwargs.setdefault("processing_mode", "distributed_epoch")

        def make() -> tf.data.Dataset:
            return pipeline().apply(distribute_of(which)(service=cluster.target, **kwargs))

        return read_dataset(make, mode, limit)

    run.service, run.mode = which, mode  # type: ignore[attr-defined]
    run.cluster = lambda num_workers, **options: clusters(which, num_workers, **options)  # type: ignore[attr-defined]
    return run


def same_items(got: list, expected: list) -> None:
    assert collections.Counter(got) == collections.Counter(expected), (sorted(got)[:20], sorted(expected)[:20])


def unique_name(run, name: str) -> str:
    """A job name of this scenario's own: clusters are shared by the scenarios of a module."""
    return f"{name}-{run.service}-{run.mode}-{np.random.default_rng().integers(1 << 40)}"


def write_record_files(directory, num_files: int, num_records: int) -> list[str]:
    """`num_files` TFRecord files in `directory` (a pathlib.Path), each of `num_records` records
    b"Record r of file f", as TensorFlow's tests write them; their names."""
    names = []
    for file in range(num_files):
        names.append(str(directory / f"records-{file}"))
        with tf.io.TFRecordWriter(names[-1]) as writer:
            for record in range(num_records):
                writer.write(b"Record %d of file %d" % (record, file))
    return names


@contextlib.contextmanager
def cluster_pool() -> Iterator[Callable[..., object]]:
    """get(service, num_workers, cache_bytes=None, fault_tolerant=False, dispatcher_options=None)
    -> a cluster made when a scenario first asks and shared by the module's scenarios after: ours
    in this process (workers heartbeating every 200 ms, with a cross-trainer cache of
    `cache_bytes` if given), TensorFlow's in one TensorFlowService process; `fault_tolerant`: its
    dispatcher has a work_dir and journals; `dispatcher_options`: DispatcherConfig fields. All
    stopped when the pool closes."""
    made: dict[tuple, object] = {}
    tensorflow: list[TensorFlowService] = []

    def get(
        which: str,
        num_workers: int,
        cache_bytes: int | None = None,
        fault_tolerant: bool = False,
        dispatcher_options: dict | None = None,
    ):
        key = (which, num_workers, cache_bytes, fault_tolerant, tuple(sorted((dispatcher_options or {}).items())))
        if key not in made:
            if which == "tensorflow":
                if not tensorflow:
                    tensorflow.append(TensorFlowService())
                made[key] = tensorflow[0].cluster(
                    num_workers, cache_bytes, fault_tolerant=fault_tolerant, dispatcher_options=dispatcher_options
                )
            else:
                options: dict = {"heartbeat_interval_ms": 200}
                if cache_bytes is not None:
                    options["cross_trainer_cache_size_bytes"] = cache_bytes
                made[key] = LocalCluster(
                    num_workers,
                    processes=False,
                    worker_options=options,
                    dispatcher_options=dispatcher_options or {},
                    fault_tolerant_mode=fault_tolerant,
                )
        return made[key]

    try:
        yield get
    finally:
        for cluster in made.values():
            cluster.stop()
        for process in tensorflow:
            process.stop()


@contextlib.contextmanager
def tensorflow_service_on_demand() -> Iterator[Callable[[], TensorFlowService]]:
    """get() -> the one TensorFlowService of a module, started when a scenario first asks;
    stopped when the context ends."""
    made: list[TensorFlowService] = []

    def get() -> TensorFlowService:
        if not made:
            made.append(TensorFlowService())
        return made[0]

    try:
        yield get
    finally:
        for process in made:
            process.stop()


def raises_at_read(which: str, error: type, message: str):
    """pytest.raises for an error a scenario's read raises: TensorFlow's with its class; ours, for
    checks it makes inside tf.data, as an UnknownError with the class in the message (README,
    "Compatibility")."""
    if which == "ours":
        return pytest.raises(tf.errors.UnknownError, match=f"{error.__name__}.*{message}")
    return pytest.raises(error, match=message)
