"""target_workers, worker tags and the local transfer: workers in the client's process are read
through memory; LOCAL reads only this process's and host's workers; AUTO skips other hosts'
COLOCATED workers (TensorFlow's semantics)."""

import pytest
import tensorflow as tf
from conftest import in_process_cluster, to_list, wait_for_workers

import dataservice as service
from dataservice.local_cluster import ServerProcess

pytestmark = pytest.mark.timeout(180)


def _sent(worker):
    sent, _ = worker._streams.transfer.snapshot()
    return sent


@pytest.mark.parametrize("protocol", [None, "local", "grpc", "tcp"])
def test_a_worker_in_this_process_is_read_through_memory(cluster, protocol):
    (worker,) = cluster.workers
    before = _sent(worker).get("local", (0, 0))[0]
    elements = tf.data.Dataset.range(300).map(lambda x: {"x": x, "s": tf.strings.as_string(x), "v": tf.fill([4], x)})
    ds = elements.apply(
        service.distribute("parallel_epochs", cluster.target, target_workers="LOCAL", data_transfer_protocol=protocol)
    )
    got = to_list(ds)
    assert sorted(int(e["x"]) for e in got) == list(range(300))
    assert all(e["s"] == str(e["x"]).encode() and list(e["v"]) == [e["x"]] * 4 for e in got)
    assert _sent(worker)["local"][0] - before == 300
    assert set(_sent(worker)) == {"local"}, "nothing went over a socket"


def _worker_elsewhere(cluster, *flags):
    """A worker process whose address names another host."""
    return ServerProcess(
        "--role=worker",
        f"--dispatcher_address={cluster.address}",
        "--worker_address=worker-7.elsewhere.invalid:%port%",
        "--no-monitoring",
        *flags,
    )


def test_local_reads_read_this_hosts_workers_only():
    cluster = in_process_cluster(1)
    elsewhere = None
    try:
        # A worker process that names another host: LOCAL and AUTO readers here leave it alone.
        elsewhere = _worker_elsewhere(cluster, "--worker_tags=COLOCATED")
        wait_for_workers(cluster.address, 2)
        for target in ("LOCAL", "AUTO"):
            ds = tf.data.Dataset.range(50).apply(
                service.distribute("parallel_epochs", cluster.target, target_workers=target, job_name=target)
            )
            assert sorted(int(x) for x in to_list(ds)) == list(range(50)), target
    finally:
        if elsewhere is not None:
            elsewhere.kill()
        cluster.stop()


def test_local_reads_without_a_local_worker_fail_clearly():
    cluster = in_process_cluster(0)
    elsewhere = None
    try:
        elsewhere = _worker_elsewhere(cluster)
        wait_for_workers(cluster.address, 1)
        ds = tf.data.Dataset.range(50).apply(
            service.distribute("parallel_epochs", cluster.target, target_workers="LOCAL")
        )
        with pytest.raises(tf.errors.OpError, match="InvalidArgumentError.*target_workers='LOCAL'.*elsewhere"):
            next(iter(ds))
    finally:
        if elsewhere is not None:
            elsewhere.kill()
        cluster.stop()


def test_worker_tags_reach_the_dispatcher_and_are_checked(tmp_path):
    cluster = in_process_cluster(0)
    try:
        cluster.add_worker(worker_tags=["COLOCATED", "rack-3"])
        workers = cluster.dispatcher._core.status()["workers"]
        assert len(workers) == 1
        state_worker = cluster.dispatcher._core.state.workers()[0]
        assert state_worker.tags == ["COLOCATED", "rack-3"]
    finally:
        cluster.stop()
    for bad in ("COLOCATED", [""], [3]):
        with pytest.raises(ValueError, match="worker_tags"):
            service.WorkerConfig(dispatcher_address="localhost:1", worker_tags=bad)


def test_coordinated_reads_cannot_be_local(cluster):
    with pytest.raises(tf.errors.InvalidArgumentError, match="Coordinated reads require non-local workers"):
        service.distribute(
            "parallel_epochs", cluster.target, job_name="j", consumer_index=0, num_consumers=1, target_workers="LOCAL"
        )
