"""Dispatchers restarted on the same work_dir, with and without fault_tolerant_mode."""

import pytest
import tensorflow as tf
from conftest import to_list

import dataservice as service
from dataservice import tf_internal

pytestmark = pytest.mark.timeout(120)


def test_fault_tolerant_dispatcher_restart_keeps_datasets_and_jobs(tmp_path):
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = dispatcher.port
    source = tf.data.Dataset.range(20).map(lambda x: x * 5)
    dataset_id = service.register_dataset(dispatcher.target, source, dataset_id="kept")
    dispatcher.stop()
    restarted = service.DispatchServer(
        service.DispatcherConfig(port=port, work_dir=str(tmp_path), fault_tolerant_mode=True)
    )
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=f"localhost:{port}"))
    try:
        ds = service.from_dataset_id("parallel_epochs", restarted.target, dataset_id)
        assert ds.element_spec == source.element_spec
        assert sorted(to_list(ds)) == [5 * i for i in range(20)]
        # The id counters survived too: a new pipeline does not reuse an id.
        other = service.register_dataset(restarted.target, tf.data.Dataset.range(3))
        assert other.numpy() != b"kept"
    finally:
        worker.stop()
        restarted.stop()


def test_without_fault_tolerance_a_restart_forgets(tmp_path):
    dispatcher = service.DispatchServer(service.DispatcherConfig(work_dir=str(tmp_path)))
    port = dispatcher.port
    dataset_id = service.register_dataset(dispatcher.target, tf.data.Dataset.range(3))
    dispatcher.stop()
    restarted = service.DispatchServer(service.DispatcherConfig(port=port, work_dir=str(tmp_path)))
    try:
        with pytest.raises(tf.errors.NotFoundError, match="not registered"):
            service.from_dataset_id("parallel_epochs", restarted.target, dataset_id)
    finally:
        restarted.stop()


def test_restart_without_fault_tolerance_fails_reads_clearly(tmp_path):
    dispatcher = service.DispatchServer()
    port = dispatcher.port
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=f"localhost:{port}", heartbeat_interval_ms=200)
    )
    restarted = None
    try:
        source = tf.data.Dataset.range(100).apply(tf_internal.sleep(20_000))
        iterator = iter(source.apply(service.distribute("parallel_epochs", dispatcher.target)))
        next(iterator)
        dispatcher.stop()
        restarted = service.DispatchServer(service.DispatcherConfig(port=port))
        with pytest.raises(tf.errors.OpError, match="restarted without fault_tolerant_mode"):
            for _ in iterator:
                pass
    finally:
        worker.stop()
        (restarted or dispatcher).stop()
