"""The dataset policy end to end: a dispatcher refuses graphs that write files, a worker
refuses to build them even when its dispatcher allowed them, and allow_unsafe_ops lets them run."""

import os

import pytest
import tensorflow as tf
from conftest import wait_for_workers

import dataservice
from dataservice.local_cluster import LocalCluster


def writing_pipeline(path: str) -> tf.data.Dataset:
    def write(x):
        with tf.control_dependencies([tf.io.write_file(path, tf.strings.as_string(x))]):
            return tf.identity(x)

    return tf.data.Dataset.range(5).map(write)


def test_dispatcher_refuses_a_graph_that_writes_files(cluster, tmp_path):
    target = str(tmp_path / "written")
    with pytest.raises(tf.errors.PermissionDeniedError) as raised:
        dataservice.register_dataset(cluster.target, writing_pipeline(target))
    message = raised.value.message
    assert "WriteFile" in message and "function" in message and "allow_unsafe_ops" in message
    assert f"localhost:{cluster.dispatcher.port}" in message
    with pytest.raises(tf.errors.PermissionDeniedError, match="WriteFile"):
        list(writing_pipeline(target).apply(dataservice.distribute("parallel_epochs", cluster.target)))
    assert not os.path.exists(target)
    # The dispatcher still serves an ordinary pipeline.
    ordinary = tf.data.Dataset.range(5).apply(dataservice.distribute("parallel_epochs", cluster.target))
    assert sorted(ordinary.as_numpy_iterator()) == list(range(5))


def test_interleave_and_nested_functions_are_refused(cluster, tmp_path):
    target = str(tmp_path / "w")
    interleaved = tf.data.Dataset.range(2).interleave(lambda x: writing_pipeline(target), num_parallel_calls=2)

    @tf.function
    def nested(x):
        with tf.control_dependencies([tf.io.write_file(target, tf.strings.as_string(x))]):
            return x + 1

    for dataset in (interleaved, tf.data.Dataset.range(3).map(lambda x: nested(x) * 2)):
        with pytest.raises(tf.errors.PermissionDeniedError, match="WriteFile"):
            dataservice.register_dataset(cluster.target, dataset)
    assert not os.path.exists(target)


def test_allow_unsafe_ops_runs_them(tmp_path):
    target = str(tmp_path / "allowed")
    with LocalCluster(
        1, processes=False, dispatcher_options={"allow_unsafe_ops": True}, worker_options={"allow_unsafe_ops": True}
    ) as cluster:
        dataset = writing_pipeline(target).apply(dataservice.distribute("parallel_epochs", cluster.target))
        assert sorted(dataset.as_numpy_iterator()) == list(range(5))
    assert os.path.exists(target)


def test_a_worker_refuses_what_its_dispatcher_allowed(tmp_path, processes):
    target = str(tmp_path / "worker-refused")
    dispatcher = processes("--role=dispatcher", "--port=0", "--allow_unsafe_ops", "--no-monitoring")
    worker = processes("--role=worker", "--port=0", f"--dispatcher_address={dispatcher.address}", "--no-monitoring")
    wait_for_workers(dispatcher.address, 1)
    dataset = writing_pipeline(target).apply(dataservice.distribute("parallel_epochs", f"grpc://{dispatcher.address}"))
    # Raised inside tf.data's generator, the error reaches the caller wrapped (its type in the message).
    with pytest.raises(tf.errors.OpError, match="PermissionDeniedError") as raised:
        list(dataset)
    assert "WriteFile" in raised.value.message and f"worker {worker.address} will not run" in raised.value.message
    assert not os.path.exists(target)
