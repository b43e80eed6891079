"""Fault tolerance with real processes: dispatchers and workers killed with SIGKILL."""

import collections
import concurrent.futures
import socket
import time

import pytest
import tensorflow as tf
from conftest import wait_for_workers

import dataservice as service
from dataservice import tf_internal
from dataservice.local_cluster import LocalCluster, ServerProcess

pytestmark = pytest.mark.timeout(300)

_DISPATCHER_OPTIONS = {"worker_timeout_ms": 3000}
_WORKER_OPTIONS = {"heartbeat_interval_ms": 300}


def _slow_range(n, sleep_us=4000):
    return tf.data.Dataset.range(n).apply(tf_internal.sleep(sleep_us))


@pytest.fixture(scope="module")
def ft_cluster():
    cluster = LocalCluster(
        num_workers=2, fault_tolerant_mode=True, dispatcher_options=_DISPATCHER_OPTIONS, worker_options=_WORKER_OPTIONS
    )
    wait_for_workers(cluster.address, 2)
    yield cluster
    cluster.stop()


def _read_with_restarts(dataset, cluster, restarts_after):
    """Reads everything, restarting the dispatcher after the given element counts."""
    got, pending = [], sorted(restarts_after)
    for element in dataset:
        got.append(int(element))
        if pending and len(got) >= pending[0]:
            pending.pop(0)
            cluster.restart_dispatcher()
    assert not pending, "the dataset ended before every restart happened"
    return collections.Counter(got)


def test_restart_before_reading(ft_cluster):
    ds = tf.data.Dataset.range(50).apply(service.distribute("distributed_epoch", ft_cluster.target))
    ft_cluster.restart_dispatcher()
    assert collections.Counter(int(x) for x in ds) == {i: 1 for i in range(50)}


def test_restart_during_parallel_epochs(ft_cluster):
    ds = _slow_range(400).apply(service.distribute("parallel_epochs", ft_cluster.target))
    counts = _read_with_restarts(ds, ft_cluster, [100])
    assert counts == {i: 2 for i in range(400)}


def test_restart_during_distributed_epoch(ft_cluster):
    ds = _slow_range(800).apply(service.distribute("distributed_epoch", ft_cluster.target))
    counts = _read_with_restarts(ds, ft_cluster, [150])
    assert counts == {i: 1 for i in range(800)}


def test_several_restarts_in_a_row(ft_cluster):
    ds = _slow_range(1200).apply(service.distribute("distributed_epoch", ft_cluster.target))
    counts = _read_with_restarts(ds, ft_cluster, [100, 350, 600])
    assert counts == {i: 1 for i in range(1200)}


def test_worker_added_mid_job(ft_cluster):
    ds = _slow_range(900).apply(service.distribute("distributed_epoch", ft_cluster.target))
    got = []
    added = None
    for element in ds:
        got.append(int(element))
        if len(got) == 100:
            added = ft_cluster.add_worker()
    assert added is not None
    assert collections.Counter(got) == {i: 1 for i in range(900)}


def test_worker_killed_mid_distributed_epoch(report_figures):
    cluster = LocalCluster(
        num_workers=3, fault_tolerant_mode=True, dispatcher_options=_DISPATCHER_OPTIONS, worker_options=_WORKER_OPTIONS
    )
    try:
        wait_for_workers(cluster.address, 3)
        n = 1500
        ds = _slow_range(n).apply(service.distribute("distributed_epoch", cluster.target))
        got = []
        for element in ds:
            got.append(int(element))
            if len(got) == 200:
                cluster.workers[0].kill()
        counts = collections.Counter(got)
        assert max(counts.values()) == 1, "an element was delivered twice"
        lost = n - len(counts)
        report_figures(f"\nworker killed mid distributed_epoch: {len(counts)} of {n} elements delivered, {lost} lost")
        # At most the ranges the dead worker had started: a small part of the epoch.
        assert lost < n // 3
    finally:
        cluster.stop()


def test_dispatcher_and_workers_restarted_together():
    cluster = LocalCluster(
        num_workers=2, fault_tolerant_mode=True, dispatcher_options=_DISPATCHER_OPTIONS, worker_options=_WORKER_OPTIONS
    )
    try:
        wait_for_workers(cluster.address, 2)
        ds = _slow_range(300).apply(service.distribute("parallel_epochs", cluster.target))
        got = []
        for element in ds:
            got.append(int(element))
            if len(got) == 50:
                for worker in cluster.workers:
                    worker.kill()
                cluster.workers.clear()
                cluster.restart_dispatcher()
                cluster.add_workers(2)
        # The restarted workers replay the whole dataset (parallel_epochs): every element arrives.
        assert set(got) == set(range(300))
    finally:
        cluster.stop()


def test_worker_restarted_at_its_address_mid_distributed_epoch(report_figures):
    """A worker SIGKILLed and started again at the same address (as a StatefulSet pod is) long before
    worker_timeout_ms: the dispatcher sees a new process, its old tasks are lost and their unstarted
    splits re-issued, it gets a task for the running iteration, and the client does not wait on the
    old stream."""
    # The dispatcher in this process (to read its state), the workers as processes.
    cluster = LocalCluster(num_workers=0, processes=False, dispatcher_options={"worker_timeout_ms": 120_000})
    other = pinned = restarted = None
    try:
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        worker_args = (f"--dispatcher_address={cluster.address}", "--heartbeat_interval_ms=300")
        # A small memory budget for the other worker and few elements outstanding at the client
        # keep production from running ahead while the read is held below: the epoch cannot end
        # before the restarted process (slow to start on a loaded machine) has registered.
        fixed = ("--role=worker", f"--port={port}", f"--worker_address=localhost:{port}", *worker_args)
        # Started side by side: most of a start is importing TensorFlow.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            starting_other = pool.submit(
                ServerProcess, "--role=worker", "--port=0", "--memory_budget_bytes=4096", *worker_args
            )
            starting_pinned = pool.submit(ServerProcess, *fixed)
        other, pinned = starting_other.result(), starting_pinned.result()
        wait_for_workers(cluster.address, 2)
        n = 2000
        ds = _slow_range(n, sleep_us=3000).apply(
            service.distribute("distributed_epoch", cluster.target, max_outstanding_requests=8)
        )
        got, restarted = [], None
        started = time.monotonic()
        for element in ds:
            got.append(int(element))
            if len(got) == 300:
                pinned.kill()
                restarted = ServerProcess(*fixed)
                # Hold the read until the new process has its task.
                deadline = time.monotonic() + 60
                while cluster.dispatcher.state_summary()["tasks"] < 3:
                    assert time.monotonic() < deadline, "the restarted worker got no task within 60 s"
                    time.sleep(0.05)
        elapsed = time.monotonic() - started
        assert restarted is not None
        counts = collections.Counter(got)
        assert max(counts.values()) == 1, "an element was delivered twice"
        lost = n - len(counts)
        report_figures(f"worker restarted at its address: {len(counts)} of {n} delivered, {lost} lost, {elapsed:.1f} s")
        assert lost < n // 4
        assert elapsed < 60, "the client waited for the old worker's timeout"
        summary = cluster.dispatcher.state_summary()
        assert summary["tasks"] == 3, "the restarted worker's old task was lost and a new one made"
        assert summary["alive_workers"] == 2
    finally:
        for process in (other, pinned, restarted):
            if process is not None:
                process.kill()
        cluster.stop()
