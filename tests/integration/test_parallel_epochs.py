"""parallel_epochs end to end over real gRPC on loopback, servers in this process."""

import collections
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import in_process_cluster, to_list, wait_until

import dataservice as service
from dataservice import tf_internal

pytestmark = pytest.mark.timeout(120)


def _distribute(ds, cluster, **kwargs):
    return ds.apply(service.distribute("parallel_epochs", cluster.target, **kwargs))


def test_one_worker_yields_the_dataset(cluster):
    ds = _distribute(tf.data.Dataset.range(10), cluster)
    assert ds.element_spec == tf.TensorSpec([], tf.int64)
    assert sorted(to_list(ds)) == list(range(10))


def test_every_worker_runs_the_whole_dataset(cluster2):
    ds = _distribute(tf.data.Dataset.range(50).map(lambda x: x * 3), cluster2)
    counts = collections.Counter(int(x) for x in to_list(ds))
    assert counts == {3 * i: 2 for i in range(50)}


def test_nested_structures_and_dtypes(cluster):
    def element(i):
        return {
            "label": tf.cast(i, tf.int32),
            "pair": (tf.cast(i, tf.float64) / 2, tf.strings.as_string(i)),
            "flags": tf.fill([3], i % 2 == 0),
            "half": tf.cast(tf.fill([2, 2], i), tf.bfloat16),
            "complex": tf.complex(tf.cast(i, tf.float32), 1.0),
            "u8": tf.cast(tf.fill([4], i), tf.uint8),
        }

    source = tf.data.Dataset.range(20).map(element)
    ds = _distribute(source, cluster)
    assert ds.element_spec == source.element_spec
    got = sorted(to_list(ds), key=lambda e: e["label"])
    want = list(source.as_numpy_iterator())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        tf.nest.map_structure(np.testing.assert_array_equal, g, w)


def test_varying_shapes_and_strings(cluster):
    source = tf.data.Dataset.range(1, 30).map(
        lambda i: (tf.range(i), tf.strings.as_string(tf.range(i)), tf.strings.reduce_join(["x"] * 3))
    )
    ds = _distribute(source, cluster)
    assert ds.element_spec == source.element_spec
    got = sorted(to_list(ds), key=lambda e: len(e[0]))
    for g, w in zip(got, source.as_numpy_iterator()):
        tf.nest.map_structure(np.testing.assert_array_equal, g, w)


def test_ragged_elements(cluster):
    source = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1, 2], [3]], [[4]], [[5, 6, 7], [], [8]]]))
    ds = _distribute(source, cluster)
    assert ds.element_spec == source.element_spec
    got = sorted((e.to_list() for e in ds), key=str)
    assert got == sorted((e.to_list() for e in source), key=str)


def test_sparse_elements(cluster):
    source = tf.data.Dataset.range(5).map(
        lambda i: tf.sparse.SparseTensor(indices=[[0, i]], values=[tf.cast(i, tf.float32)], dense_shape=[2, 5])
    )
    ds = _distribute(source, cluster)
    assert ds.element_spec == source.element_spec
    got = sorted(tf.sparse.to_dense(e).numpy().tolist() for e in ds)
    assert got == sorted(tf.sparse.to_dense(e).numpy().tolist() for e in source)


def test_elements_larger_than_grpc_default_limit(cluster):
    big = 3 * 1024 * 1024  # 12 MiB of float32, 3x gRPC's 4 MiB default
    source = tf.data.Dataset.range(3).map(lambda i: tf.fill([big], tf.cast(i, tf.float32)))
    got = to_list(_distribute(source, cluster))
    assert sorted(float(e[0]) for e in got) == [0.0, 1.0, 2.0]
    assert all(e.shape == (big,) and (e == e[0]).all() for e in got)


def test_result_is_an_ordinary_dataset(cluster):
    ds = _distribute(tf.data.Dataset.range(20), cluster)
    ds = ds.filter(lambda x: x % 2 == 0).map(lambda x: x + 1).batch(5)
    assert ds.element_spec == tf.TensorSpec([None], tf.int64)
    assert sorted(np.concatenate(to_list(ds)).tolist()) == list(range(1, 20, 2))


def test_keras_fit_on_service_dataset(cluster):
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(-1, 1)
    y = 3 * x + 1
    source = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    ds = _distribute(source, cluster)
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="mse")
    history = model.fit(ds, epochs=15, verbose=0)
    assert history.history["loss"][-1] < 0.05
    w, b = model.layers[0].get_weights()
    assert abs(w[0][0] - 3) < 0.3 and abs(b[0] - 1) < 0.3


def test_iterating_twice_runs_two_epochs(cluster):
    ds = _distribute(tf.data.Dataset.range(5), cluster)
    assert sorted(to_list(ds)) == list(range(5))
    assert sorted(to_list(ds)) == list(range(5))


def test_repeat_after_distribute(cluster):
    ds = _distribute(tf.data.Dataset.range(4), cluster).repeat(3)
    assert sorted(to_list(ds)) == sorted(list(range(4)) * 3)


def test_infinite_dataset_keeps_infinite_cardinality(cluster):
    ds = _distribute(tf.data.Dataset.range(3).repeat(), cluster)
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    assert len(to_list(ds, limit=10)) == 10


def test_worker_joining_mid_iteration_gets_a_task():
    cluster = in_process_cluster(1)
    try:
        # 40 elements at 50 ms each: the first worker is far from done when the second joins.
        source = tf.data.Dataset.range(40).apply(tf_internal.sleep(50_000))
        iterator = iter(_distribute(source, cluster))
        first = [int(next(iterator))]
        cluster.add_worker()
        rest = [int(x) for x in iterator]
        counts = collections.Counter(first + rest)
        assert set(counts) == set(range(40))
        assert sum(counts.values()) > 40, "the late worker produced nothing"
        assert all(c <= 2 for c in counts.values())
    finally:
        cluster.stop()


def test_worker_joining_after_the_first_sent_everything_is_still_read():
    # The first worker sends all 200 elements into the client's buffer at once and ends its task;
    # the iteration is not over until the client has read that end, so a worker added after 50
    # elements still gets a task, and its whole pass is read.
    cluster = in_process_cluster(1)
    try:
        iterator = iter(_distribute(tf.data.Dataset.range(200), cluster))
        first = [int(next(iterator)) for _ in range(50)]
        first_worker = cluster.workers[0]
        wait_until(lambda: not first_worker.running_tasks(), "the first worker sent all 200 elements and its end")
        # Its task stays active until the client consumes that end (a client finishes
        # parallel_epochs tasks), so the iteration is open to a worker that registers now.
        assert cluster.dispatcher.state_summary()["active_tasks"] == 1
        cluster.add_worker()
        rest = [int(x) for x in iterator]
        assert collections.Counter(first + rest) == {i: 2 for i in range(200)}, "the added worker was not read"
        assert cluster.dispatcher.state_summary()["unfinished_iterations"] == 0
    finally:
        cluster.stop()


def test_client_waits_for_a_first_worker():
    cluster = in_process_cluster(0)
    try:
        iterator = iter(_distribute(tf.data.Dataset.range(5), cluster))
        result = []
        reader = threading.Thread(target=lambda: result.extend(int(x) for x in iterator))
        reader.start()
        time.sleep(1.0)
        assert not result
        cluster.add_worker()
        reader.join(60)
        assert sorted(result) == list(range(5))
    finally:
        cluster.stop()


def test_abandoned_iteration_stops_its_tasks(cluster):
    ds = _distribute(tf.data.Dataset.range(10**9), cluster)
    iterator = iter(ds)
    assert int(next(iterator)) == 0
    worker = cluster.workers[0]
    assert len(worker.running_tasks()) == 1
    summary = cluster.dispatcher.state_summary()
    assert (summary["unfinished_iterations"], summary["iteration_clients"], summary["active_tasks"]) == (1, 1, 1)
    del iterator
    deadline = time.monotonic() + 20
    while worker.running_tasks() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not worker.running_tasks(), "the task of a released anonymous iteration kept running"
    summary = cluster.dispatcher.state_summary()
    assert (summary["unfinished_iterations"], summary["iteration_clients"], summary["active_tasks"]) == (0, 0, 0)


def test_named_job_is_shared_between_clients(cluster):
    # Slow elements, so that neither client's read-ahead takes the whole dataset.
    source = tf.data.Dataset.range(60).apply(tf_internal.sleep(20_000))
    a = iter(_distribute(source, cluster, job_name="shared"))
    b = iter(_distribute(source, cluster, job_name="shared"))
    got, per_client, active = [], {0: 0, 1: 0}, {0: a, 1: b}
    while active:
        for index, iterator in list(active.items()):
            try:
                got.append(int(next(iterator)))
                per_client[index] += 1
            except StopIteration:
                del active[index]
    assert per_client[0] > 0 and per_client[1] > 0
    assert sorted(got) == list(range(60)), "each element goes to exactly one consumer of a shared job"


def test_named_job_with_another_mode_is_rejected(cluster):
    iterator = iter(_distribute(tf.data.Dataset.range(10**6), cluster, job_name="j"))
    next(iterator)
    other = tf.data.Dataset.range(10**6).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="j", target_workers="ANY")
    )
    # Errors raised while iterating pass through tf.data's generator op, which
    # keeps the message (and the original error's name) but not the class.
    with pytest.raises(tf.errors.OpError, match="InvalidArgumentError.*job 'j' already exists.*target_workers"):
        next(iter(other))


def test_register_same_pipeline_twice_gives_same_id(cluster):
    make = lambda: tf.data.Dataset.range(10).map(lambda x: x * 2).shuffle(4)  # noqa: E731
    a = service.register_dataset(cluster.target, make())
    b = service.register_dataset(cluster.target, make())
    c = service.register_dataset(cluster.target, tf.data.Dataset.range(11))
    assert a.dtype == tf.string
    assert a.numpy() == b.numpy()
    assert c.numpy() != a.numpy()


def test_requested_dataset_id_is_honoured(cluster):
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(7), dataset_id="my-dataset")
    assert dataset_id.numpy() == b"my-dataset"
    again = service.register_dataset(cluster.target, tf.data.Dataset.range(7), dataset_id="my-dataset")
    assert again.numpy() == b"my-dataset"
    with pytest.raises(tf.errors.AlreadyExistsError, match="my-dataset"):
        service.register_dataset(cluster.target, tf.data.Dataset.range(8), dataset_id="my-dataset")


def test_from_dataset_id_fetches_the_element_spec(cluster):
    source = tf.data.Dataset.range(6).map(lambda x: {"x": x, "s": tf.strings.as_string(x)})
    dataset_id = service.register_dataset(cluster.target, source)
    ds = service.from_dataset_id("parallel_epochs", cluster.target, dataset_id)
    assert ds.element_spec == source.element_spec
    assert sorted(int(e["x"]) for e in to_list(ds)) == list(range(6))
    with_spec = service.from_dataset_id(
        service.ShardingPolicy.OFF, cluster.target, dataset_id.numpy().decode(), element_spec=source.element_spec
    )
    assert len(to_list(with_spec)) == 6


def test_pipeline_error_reaches_the_client(cluster):
    source = tf.data.Dataset.from_tensor_slices(["1", "2", "not a number"]).map(tf.strings.to_number)
    with pytest.raises(tf.errors.OpError, match="(?s)InvalidArgumentError.*failed on worker.*not a number"):
        to_list(_distribute(source, cluster))
