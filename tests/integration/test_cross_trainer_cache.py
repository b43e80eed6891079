"""Cross-trainer cache: trainers reading one named job share its elements through a
sliding window on each worker. TensorFlow's scenarios are in test_conformance_cache.py; these
check what they do not: elements produced once for trainers in step, a late trainer's skip is
contiguous, and the checks that a client skipping them meets at the dispatcher."""

import threading

import pytest
import tensorflow as tf
from conftest import in_process_cluster, to_list

import dataservice as service
from dataservice import errors
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import dispatcher_pb2
from dataservice.worker.cross_trainer_cache import READ_AHEAD_ELEMENTS

pytestmark = pytest.mark.timeout(180)

INFINITE = tf.data.Dataset.range(10_000_000).repeat()


def read(cluster, trainer_id, count, job_name="job", dataset=INFINITE, processing_mode="parallel_epochs", **kwargs):
    distributed = dataset.apply(
        service.distribute(
            processing_mode,
            cluster.target,
            job_name=job_name,
            cross_trainer_cache=service.CrossTrainerCache(trainer_id) if trainer_id else None,
            **kwargs,
        )
    )
    return [int(x) for x in to_list(distributed.take(count))]


@pytest.fixture
def small_cache_cluster():
    c = in_process_cluster(0)
    c.add_worker(cross_trainer_cache_size_bytes=500)
    yield c
    c.stop()


def test_a_trainer_behind_the_window_skips_ahead(small_cache_cluster):
    assert read(small_cache_cluster, "fast", 200) == list(range(200))
    late = read(small_cache_cluster, "late", 200)
    assert late[0] > 0 and len(late) == 200 and late == list(range(late[0], late[0] + 200))


def test_trainers_in_step_each_read_every_element_produced_once(cluster):
    results = {}

    def trainer(name):
        results[name] = read(cluster, name, 2000, max_outstanding_requests=8)

    threads = [threading.Thread(target=trainer, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(results[f"t{i}"] == list(range(2000)) for i in range(4))
    (worker,) = cluster.workers
    (runner,) = worker._tasks.runners()
    # 8,000 elements consumed; the worker produced each once (not 8,000), plus its read-ahead and
    # what the clients' 8 outstanding requests took beyond the 2,000 (at most 8 each, some slack).
    assert runner.elements_consumed >= 8000
    assert runner.elements_produced <= 2000 + READ_AHEAD_ELEMENTS + 64


def test_tensorflows_checks_and_messages(cluster):
    with pytest.raises(ValueError, match="non-empty trainer ID"):
        service.CrossTrainerCache("")
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires named jobs"):
        read(cluster, "t", 1, job_name=None)
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires the input dataset to be infinite"):
        read(cluster, "t", 1, dataset=tf.data.Dataset.range(10))
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not support coordinated reads"):
        read(cluster, "t", 1, consumer_index=0, num_consumers=1)
    # from_dataset_id with an element_spec: the registered cardinality tells.
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(10))
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires the input dataset to be infinite"):
        service.from_dataset_id(
            "parallel_epochs",
            cluster.target,
            dataset_id,
            element_spec=tf.TensorSpec([], tf.int64),
            job_name="finite",
            cross_trainer_cache=service.CrossTrainerCache("t"),
        )
    # A client that does not check: the dispatcher refuses the job itself.
    request = dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset_id.numpy().decode(), job_name="finite", use_cross_trainer_cache=True
    )
    with DispatcherClient(cluster.address, 10) as dispatcher:
        with pytest.raises(errors.InvalidArgumentError, match="requires the input dataset to be infinite"):
            dispatcher.get_or_create_job(request)
    # A second pass over one dataset is a second repetition, which TensorFlow refuses too.
    once = INFINITE.apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="once", cross_trainer_cache=service.CrossTrainerCache("t")
        )
    )
    assert len(to_list(once.take(5))) == 5
    with pytest.raises(tf.errors.OpError, match="disallows multiple repetitions"):
        to_list(once.take(5))
    # A named job is either cached or not.
    read(cluster, None, 3, job_name="uncached")
    with pytest.raises(tf.errors.OpError, match="cross-trainer cache disabled vs enabled"):
        read(cluster, "t", 3, job_name="uncached")
    # TensorFlow's own CrossTrainerCache objects are accepted too (a one-import switch).
    theirs = tf.data.experimental.service.CrossTrainerCache(trainer_id="theirs")
    shared = INFINITE.apply(
        service.distribute("parallel_epochs", cluster.target, job_name="job", cross_trainer_cache=theirs)
    )
    assert len(to_list(shared.take(3))) == 3
