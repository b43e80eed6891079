"""The chunked data path against a worker process on this host: elements of every kind through
the Unix socket and its ring of shared memory, the TCP fallback, a consumer that holds more than
the ring, errors in the middle of a chunk, and processes killed on either side."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import scrape, total
from hosts import TestHosts, require_test_hosts

import dataservice as service
from dataservice.local_cluster import LocalCluster, ServerProcess
from dataservice.worker import chunk_iterator

MIB_FLOATS = 262144  # float32s in 1 MiB


@pytest.fixture(scope="module")
def same_host():
    """One worker process on this host (the client's), shared by the module's tests."""
    cluster = LocalCluster(num_workers=1)
    yield cluster
    cluster.stop()


def _metrics(cluster: LocalCluster):
    return scrape(cluster.workers[0].monitoring_port)


def _shared_memory_messages(cluster: LocalCluster, body: str) -> float:
    return total(_metrics(cluster), "dataservice_worker_shared_memory_messages_total", body=body)


def _sent_bytes(cluster: LocalCluster, protocol: str) -> float:
    return total(_metrics(cluster), "dataservice_worker_bytes_sent_total", protocol=protocol)


def _same(a, b) -> None:
    """Elements equal in structure, types, shapes and values, composites component by component."""
    tf.nest.assert_same_structure(a, b, expand_composites=True)
    for x, y in zip(tf.nest.flatten(a, expand_composites=True), tf.nest.flatten(b, expand_composites=True)):
        x, y = np.asarray(x.numpy()), np.asarray(y.numpy())
        assert x.dtype == y.dtype and x.shape == y.shape, (x, y)
        assert x.tolist() == y.tolist()


KINDS = {
    "scalars and strings": lambda: tf.data.Dataset.range(3000).map(lambda i: (i, tf.strings.as_string(i))),
    "varying shapes": lambda: tf.data.Dataset.range(40).map(lambda i: tf.reshape(tf.range(i * 3), [i, 3])),
    "varying strings": lambda: tf.data.Dataset.range(30).map(lambda i: tf.strings.as_string(tf.range(i % 5))),
    "ragged": lambda: tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1], [2, 3]], [], [[4, 5, 6]]] * 9)),
    "sparse and nested": lambda: tf.data.Dataset.range(20).map(
        lambda i: {
            "s": tf.sparse.from_dense(tf.reshape(tf.range(4, dtype=tf.int64) * i, [2, 2])),
            "t": (i, [b"x", b"yz"]),
        }
    ),
    "unknown rank": lambda: tf.data.Dataset.range(12).map(
        lambda i: tf.io.parse_tensor(tf.io.serialize_tensor(tf.fill(tf.ones([i % 3], tf.int32), i)), tf.int64)
    ),
    "large": lambda: tf.data.Dataset.range(24).map(lambda i: tf.fill([MIB_FLOATS], tf.cast(i, tf.float32))),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_elements_of_every_kind_arrive_as_tf_data_makes_them(same_host, kind):
    source = KINDS[kind]()
    ds = source.apply(service.distribute("parallel_epochs", same_host.target))
    assert ds.element_spec == source.element_spec
    got, expected = list(ds), list(source)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        _same(a, b)


def test_same_host_reads_go_through_shared_memory_and_tcp_on_request(same_host):
    ring_before, unix_before = _shared_memory_messages(same_host, "ring"), _sent_bytes(same_host, "unix")
    tcp_before = _sent_bytes(same_host, "tcp")
    source = tf.data.Dataset.range(64).map(lambda i: tf.fill([MIB_FLOATS], tf.cast(i, tf.float32)))
    ds = source.apply(service.distribute("parallel_epochs", same_host.target, compression=None))
    assert [float(x[0]) for x in ds.as_numpy_iterator()] == list(range(64))
    assert _shared_memory_messages(same_host, "ring") > ring_before
    # Bodies in the ring are counted as sent: 64 MiB, never compressed on the host.
    assert _sent_bytes(same_host, "unix") - unix_before >= 64 * (1 << 20)
    assert _sent_bytes(same_host, "tcp") == tcp_before
    ring_after = _shared_memory_messages(same_host, "ring")
    tcp_ds = source.apply(
        service.distribute("parallel_epochs", same_host.target, compression=None, data_transfer_protocol="tcp")
    )
    assert [float(x[0]) for x in tcp_ds.as_numpy_iterator()] == list(range(64))
    assert _sent_bytes(same_host, "tcp") - tcp_before >= 64 * (1 << 20)
    assert _shared_memory_messages(same_host, "ring") == ring_after


def test_a_consumer_holding_more_than_the_ring_gets_the_rest_through_the_socket(same_host):
    """A shuffle buffer holding every element keeps all the ring's slots: the stream goes on through
    the socket instead of waiting for slots the consumer will not release."""
    socket_before = _shared_memory_messages(same_host, "socket")
    source = tf.data.Dataset.range(48).map(lambda i: tf.fill([MIB_FLOATS], tf.cast(i, tf.float32)))
    ds = source.apply(service.distribute("parallel_epochs", same_host.target, max_outstanding_requests=4))
    values = sorted(float(x[0]) for x in ds.shuffle(48).as_numpy_iterator())
    assert values == list(range(48))
    assert _shared_memory_messages(same_host, "socket") > socket_before


def test_an_error_in_the_middle_of_a_chunk_ends_the_stream_after_the_chunks_before_it(same_host):
    def check(x):
        tf.debugging.assert_none_equal(x, tf.constant(5000, tf.int64), message="element 5000 is bad")
        return x

    ds = tf.data.Dataset.range(10_000).map(check).apply(service.distribute("parallel_epochs", same_host.target))
    got = []
    with pytest.raises(tf.errors.OpError, match="element 5000 is bad"):
        for x in ds.as_numpy_iterator():
            got.append(int(x))
    # In order, none twice, none past the error; the chunk the error fell in is lost with it (TensorFlow's
    # batching drops what it collected), the chunks before it all arrive.
    assert got == list(range(len(got)))
    assert 5000 - chunk_iterator.MAX_CHUNK_ELEMENTS <= len(got) <= 5000


def _dev_shm() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


_READER = """
import sys, tensorflow as tf, dataservice as service
ds = tf.data.Dataset.range(10**9).map(lambda i: tf.fill([262144], tf.cast(i, tf.float32)))
for i, x in enumerate(ds.apply(service.distribute("parallel_epochs", sys.argv[1], max_outstanding_requests=8))):
    if i == 20:
        print("reading", flush=True)
"""


def test_killing_the_client_or_the_worker_leaves_nothing_behind(same_host):
    shm_before = _dev_shm()
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, same_host.target],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "reading"
        assert total(_metrics(same_host), "dataservice_worker_shared_memory_bytes") > 0
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait(30)
    deadline = time.monotonic() + 30
    while total(_metrics(same_host), "dataservice_worker_shared_memory_bytes") > 0:
        assert time.monotonic() < deadline, "the killed client's ring was not freed"
        time.sleep(0.1)
    assert _dev_shm() == shm_before

    # A worker killed while this process holds elements in its ring: they stay readable.
    with LocalCluster(num_workers=1) as cluster:
        source = tf.data.Dataset.range(10**9).map(lambda i: tf.fill([MIB_FLOATS], tf.cast(i, tf.float32)))
        iterator = iter(source.apply(service.distribute("parallel_epochs", cluster.target)))
        held = [next(iterator) for _ in range(8)]
        assert total(scrape(cluster.workers[0].monitoring_port), "dataservice_worker_shared_memory_messages_total") > 0
        cluster.workers[0].kill()
        assert [float(x[0]) for x in held] == list(range(8))
        assert all(float(tf.reduce_min(x)) == float(tf.reduce_max(x)) for x in held)
        del iterator
    assert _dev_shm() == shm_before


@pytest.fixture
def other_host():
    """A test host (tests/hosts.py). Yields (its namespace, this side's address, its address)."""
    require_test_hosts()
    hosts = TestHosts(["other"])
    try:
        yield hosts["other"].namespace, hosts.here, hosts["other"].address
    finally:
        hosts.close()


def test_a_worker_on_another_host_is_read_over_tcp(other_host):
    """The worker's Unix socket lives in its host's network namespace: the client cannot reach it
    and reads over TCP instead."""
    namespace, here, there = other_host
    dispatcher = ServerProcess("--role=dispatcher", "--port=0")
    worker = None
    try:
        worker = ServerProcess(
            "--role=worker",
            "--port=0",
            f"--dispatcher_address={here}:{dispatcher.port}",
            f"--worker_address={there}:%port%",
            launcher=["ip", "netns", "exec", namespace],
        )
        source = tf.data.Dataset.range(16).map(lambda i: tf.fill([MIB_FLOATS], tf.cast(i, tf.float32)))
        target = f"grpc://localhost:{dispatcher.port}"
        ds = source.apply(service.distribute("parallel_epochs", target, compression=None))
        assert [float(x[0]) for x in ds.as_numpy_iterator()] == list(range(16))
        metrics = scrape(worker.monitoring_port, host=there)
        assert total(metrics, "dataservice_worker_bytes_sent_total", protocol="tcp") >= 16 * (1 << 20)
        assert total(metrics, "dataservice_worker_bytes_sent_total", protocol="unix") == 0
    finally:
        if worker is not None:
            worker.kill()
        dispatcher.kill()
