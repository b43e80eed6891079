"""Data streams cut in the middle, by the kernel (`ss -K` destroys the client's TCP sockets to the
worker's data port, as a reset on a real network does): every element still arrives exactly once
and in order, because the worker keeps what it sent until the client says it has it, and a
reconnecting client says where it stopped."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import dataservice as service
from dataservice.local_cluster import LocalCluster
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import tcp

pytestmark = pytest.mark.timeout(180)

ELEMENTS = 300
FLOATS = 64 * 1024  # 256 KiB elements: several are in the socket buffers when a cut comes


@pytest.fixture(scope="module")
def worker_process():
    if shutil.which("ss") is None or os.geteuid() != 0:
        why = "needs iproute2's ss and root to destroy sockets (ss -K)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    cluster = LocalCluster(num_workers=1)
    yield cluster
    cluster.stop()


def _data_port(cluster: LocalCluster) -> int:
    with DispatcherClient(cluster.address, timeout_s=10) as dispatcher:
        (worker,) = dispatcher.get_workers()
    return int(tcp.split_host_port(tcp.transfer_addresses(worker.transfer_address)[tcp.PROTOCOL])[1])


class _Cutter:
    """Destroys every TCP connection to `port` every `every_s` seconds, counting those it cut."""

    def __init__(self, port: int, every_s: float):
        self.cuts = 0
        self._port, self._every_s = port, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            out = subprocess.run(
                ["ss", "-K", "-t", "-n", "dst", "127.0.0.1", "dport", "=", f":{self._port}"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            self.cuts += sum(1 for line in out.splitlines() if line.startswith("ESTAB"))

    def __enter__(self) -> _Cutter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(20)


def _source() -> tf.data.Dataset:
    return tf.data.Dataset.range(ELEMENTS).map(lambda i: tf.fill([FLOATS], tf.cast(i, tf.float32)))


def _read_slowly(dataset: tf.data.Dataset) -> list[int]:
    """The elements' ids, read at about 100 a second (so that cuts land while data flows); each
    element must be whole."""
    ids = []
    for element in dataset.as_numpy_iterator():
        assert np.all(element == element[0])
        ids.append(int(element[0]))
        time.sleep(0.01)
    return ids


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_streams_cut_by_the_kernel_lose_and_repeat_nothing(worker_process, mode):
    dataset = _source().apply(
        service.distribute(mode, worker_process.target, data_transfer_protocol="tcp", max_outstanding_requests=64)
    )
    with _Cutter(_data_port(worker_process), every_s=0.05) as cutter:
        ids = _read_slowly(dataset)
    assert cutter.cuts >= 3, "the test cut too few streams to show anything"
    assert ids == list(range(ELEMENTS)), (len(ids), sorted(set(range(ELEMENTS)) - set(ids))[:20])
