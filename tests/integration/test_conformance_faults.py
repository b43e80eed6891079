"""TensorFlow's fault-tolerance scenarios (fault_tolerance_test.py: servers started late,
stopped, restarted or added while a client reads), run against ours and against TensorFlow's
service (conformance.py), eagerly, as TensorFlow's test runs them. Each scenario has a cluster of
its own: a fault-tolerant dispatcher (a work_dir, journaled state) and workers, ours in this
process, TensorFlow's in its service's process."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from conformance import SERVICES, TensorFlowService, distribute_of, same_items, tensorflow_service_on_demand
from conftest import wait_for_workers

import dataservice as service
from dataservice.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)


class _OurCluster:
    """LocalCluster in this process, fault-tolerant, with TensorFlow's test cluster's controls."""

    def __init__(self, num_workers: int):
        self._cluster = LocalCluster(
            num_workers, processes=False, fault_tolerant_mode=True, worker_options={"heartbeat_interval_ms": 200}
        )
        self.target = self._cluster.target

    def restart_dispatcher(self) -> None:
        self._cluster.restart_dispatcher()

    def stop_dispatcher(self) -> None:
        self._cluster.dispatcher.stop()

    def add_worker(self) -> None:
        self._cluster.add_worker()

    def restart_worker(self, index: int, same_port: bool = True) -> None:
        old = self._cluster.workers[index]
        port = old.port if same_port else 0
        old.stop()
        self._cluster.workers[index] = service.WorkerServer(
            service.WorkerConfig(dispatcher_address=self._cluster.address, port=port, heartbeat_interval_ms=200)
        )

    def stop_worker(self, index: int) -> None:
        self._cluster.workers[index].stop()

    def wait_for_workers(self, count: int) -> None:
        wait_for_workers(self._cluster.address, count)

    def stop(self) -> None:
        self._cluster.stop()


class _TheirCluster:
    """A fault-tolerant cluster of TensorFlow's service process."""

    def __init__(self, tensorflow: TensorFlowService, num_workers: int):
        self._cluster = tensorflow.cluster(num_workers, fault_tolerant=True)
        self.target = self._cluster.target
        for name in ("restart_dispatcher", "stop_dispatcher", "add_worker", "restart_worker", "stop_worker"):
            setattr(self, name, getattr(self._cluster, name))

    def wait_for_workers(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while self._cluster.num_workers() < count:
            assert time.monotonic() < deadline, f"fewer than {count} workers registered"
            time.sleep(0.01)

    def stop(self) -> None:
        """(Its servers end with the service's process.)"""


class _OurLateCluster:
    """A fault-tolerant dispatcher at `port` and a worker, started `delay_s` from now in the
    background, as TensorFlow's test starts its servers."""

    def __init__(self, port: int, delay_s: float, work_dir: str):
        self.target = f"grpc://localhost:{port}"
        self._work_dir = work_dir
        self._servers: list = []
        self._thread = threading.Thread(target=self._start, args=(port, delay_s, work_dir), daemon=True)
        self._thread.start()

    def _start(self, port: int, delay_s: float, work_dir: str) -> None:
        time.sleep(delay_s)
        self._servers.append(
            service.DispatchServer(service.DispatcherConfig(port=port, work_dir=work_dir, fault_tolerant_mode=True))
        )
        self._servers.append(
            service.WorkerServer(
                service.WorkerConfig(dispatcher_address=f"localhost:{port}", heartbeat_interval_ms=200)
            )
        )

    def stop(self) -> None:
        self._thread.join(60)
        for server in reversed(self._servers):
            server.stop()
        shutil.rmtree(self._work_dir, ignore_errors=True)


def _free_port() -> int:
    """A port nothing listens on now (as TensorFlow's test picks one with portpicker)."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def tensorflow_service():
    with tensorflow_service_on_demand() as get:
        yield get


@pytest.fixture(params=SERVICES)
def side(request, tensorflow_service):
    """side.cluster(num_workers): a new cluster of the service (stopped after the scenario);
    side.distribute(dataset, cluster, **kwargs): the dataset read from it."""
    which = request.param
    made: list = []

    class Side:
        service = which

        @staticmethod
        def cluster(num_workers: int = 1):
            made.append(
                _OurCluster(num_workers) if which == "ours" else _TheirCluster(tensorflow_service(), num_workers)
            )
            return made[-1]

        @staticmethod
        def cluster_later(delay_s: float):
            """A cluster of one worker whose servers start `delay_s` from now; its target."""
            port = _free_port()
            if which == "tensorflow":
                return tensorflow_service().cluster_later(port, delay_s)
            made.append(_OurLateCluster(port, delay_s, tempfile.mkdtemp(prefix="late-cluster-")))
            return made[-1].target

        @staticmethod
        def distribute(dataset: tf.data.Dataset, cluster, **kwargs) -> tf.data.Dataset:
            kwargs.setdefault("processing_mode", "parallel_epochs")
            return dataset.apply(distribute_of(which)(service=cluster.target, **kwargs))

    yield Side
    for cluster in made:
        cluster.stop()


def _range(side, n: int, cluster, **kwargs) -> tf.data.Dataset:
    return side.distribute(tf.data.Dataset.range(n), cluster, **kwargs)


def _all(dataset) -> list[int]:
    return [int(e) for e in dataset]


def test_servers_started_after_the_dataset_is_made(side):
    """testStartServersLate: the dataset is made, and read, while the dispatcher and worker are
    still to start (half a second later): the client waits for them instead of failing."""
    target = side.cluster_later(0.5)
    dataset = tf.data.Dataset.range(10).apply(
        distribute_of(side.service)(processing_mode="parallel_epochs", service=target)
    )
    assert _all(dataset) == list(range(10))


def test_reading_goes_on_after_the_dispatcher_stops(side):
    """testDispatcherStop: after one element the dispatcher stops; the worker serves the other 99."""
    cluster = side.cluster()
    iterator = iter(_range(side, 100, cluster))
    got = [int(next(iterator))]
    cluster.stop_dispatcher()
    got.extend(int(next(iterator)) for _ in range(99))
    assert got == list(range(100))


def test_dispatcher_restarted_before_and_during_reading(side):
    """testDispatcherRestartBeforeReading and testDispatcherRestartDuringReading (both modes):
    every element, in order, across a restart before the first read or after 50."""
    cluster = side.cluster()
    dataset = _range(side, 100, cluster)
    cluster.restart_dispatcher()
    assert _all(dataset) == list(range(100))
    for mode in ("parallel_epochs", "distributed_epoch"):
        iterator = iter(_range(side, 100, cluster, processing_mode=mode))
        got = [int(next(iterator)) for _ in range(50)]
        cluster.restart_dispatcher()
        got.extend(int(e) for e in iterator)
        assert got == list(range(100)), mode


def test_dispatcher_restarted_through_a_repeated_distributed_epoch(side):
    """testDispatcherRestartDuringDistributedEpochRepeat: range(100).repeat(5) in
    distributed_epoch, the dispatcher restarted after 50, 250, 450 and 500 elements: each element
    5 times."""
    cluster = side.cluster()
    iterator = iter(side.distribute(tf.data.Dataset.range(100).repeat(5), cluster, processing_mode="distributed_epoch"))
    got: list[int] = []
    for breakpoint_ in (50, 250, 450, 500):
        got.extend(int(next(iterator)) for _ in range(breakpoint_ - len(got)))
        cluster.restart_dispatcher()
    same_items(got, 5 * list(range(100)))


def test_dispatcher_restarted_between_iterations_and_between_registrations(side):
    """testDispatcherRestartBetweenIterations and testDispatcherManyRestarts: datasets made before
    restarts read whole after them."""
    cluster = side.cluster()
    dataset = _range(side, 100, cluster)
    assert _all(dataset) == list(range(100))
    cluster.restart_dispatcher()
    assert _all(dataset) == list(range(100))
    datasets = []
    for n in range(10, 15):
        datasets.append((n, _range(side, n, cluster)))
        cluster.restart_dispatcher()
    for n, made in datasets:
        assert _all(made) == list(range(n))


def test_dispatcher_and_workers_restarted(side):
    """testDispatcherAndWorkerRestart and testDispatcherAndMultiWorkerRestart: restarted together
    before reading, one worker or two; an exhausted iterator stays exhausted."""
    cluster = side.cluster()
    dataset = _range(side, 100, cluster)
    for _ in range(2):
        cluster.restart_dispatcher()
        cluster.restart_worker(0)
        assert _all(dataset) == list(range(100))
    two = side.cluster(2)
    iterator = iter(_range(side, 100, two))
    cluster_restart = (two.restart_dispatcher, lambda: two.restart_worker(0), lambda: two.restart_worker(1))
    for restart in cluster_restart:
        restart()
    got = [int(e) for e in iterator]
    same_items(got, 2 * list(range(100)))
    for restart in cluster_restart:
        restart()
    got.extend(int(e) for e in iterator)
    same_items(got, 2 * list(range(100)))


def test_a_worker_added_mid_job(side):
    """testAddWorkerMidJob: a second worker joins after half the elements; the job gives both
    workers' elements."""
    cluster = side.cluster()
    num_elements = 2 * 2 + 100  # TensorFlow's: twice the cores, and 100
    iterator = iter(_range(side, num_elements, cluster))
    got = [int(next(iterator)) for _ in range(num_elements // 2)]
    cluster.add_worker()
    cluster.wait_for_workers(2)
    got.extend(int(e) for e in iterator)
    same_items(got, 2 * list(range(num_elements)))


def test_four_of_five_workers_stopped_with_one_outstanding_request(side):
    """testRemoveMoreWorkersThanMaxOutstandingRequests: having read a 0 from each of 5 workers,
    4 stop; 1,000 more elements come without a hang."""
    if side.service == "tensorflow":
        pytest.xfail(
            "TensorFlow's 2.21 worker, stopped in its process while a client's request waits on it, did not "
            "return within 300 s: not run"
        )
    cluster = side.cluster(5)
    iterator = iter(_range(side, 2**55, cluster, max_outstanding_requests=1))
    zeros = 0
    while zeros < 5:
        zeros += int(next(iterator)) == 0
    for index in range(4):
        cluster.stop_worker(index)
    assert len([next(iterator) for _ in range(1000)]) == 1000


@pytest.mark.parametrize("same_port", [True, False])
def test_a_restarted_worker_starts_over(side, same_port):
    """testRestartWorker: half way through, the worker restarts (at its port or another); after
    what the first one had sent, the new one's elements start over from 0, in order."""
    cluster = side.cluster()
    num_elements = 2 * 2 + 100
    iterator = iter(_range(side, num_elements, cluster))
    assert [int(next(iterator)) for _ in range(num_elements // 2)] == list(range(num_elements // 2))
    cluster.restart_worker(0, same_port)
    while int(next(iterator)) != 0:
        pass
    assert [int(next(iterator)) for _ in range(1, num_elements // 2)] == list(range(1, num_elements // 2))


def test_a_large_graph_registered_before_any_worker(side):
    """testDistributeLargeGraphThenRegisterWorker: a pipeline of 8 MB (above gRPC's default 4 MB
    message), read by a worker that registers after it."""
    cluster = side.cluster(0)
    tensor = np.ones((2, 1000, 1000), dtype=np.float32)
    iterator = iter(side.distribute(tf.data.Dataset.from_tensors(tensor), cluster))
    cluster.add_worker()
    assert np.array_equal(next(iterator).numpy(), tensor)
