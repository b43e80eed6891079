"""Separate credentials for clients and for the cluster's own servers (rpc/auth.py), attacked
with a client's token against a TLS cluster of `data-server` processes that has both: posing as
a worker (a fake worker at the attacker's address, a real worker's address under a new uid that
would declare its tasks lost), reading other clients' graphs and splits, committing snapshot
chunks, and pushing tasks to a worker. Each is PERMISSION_DENIED, the dispatcher's worker list is
unchanged, a trainer reading meanwhile reads every element, and the servers' token in turn
cannot act as a client."""

from __future__ import annotations

import threading

import grpc
import pytest
import tensorflow as tf

import dataservice
from dataservice.rpc import channels, tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, worker_pb2, worker_pb2_grpc


def _tls(secure_cluster) -> tls.TlsFiles:
    return tls.TlsFiles(ca_file=secure_cluster.certs.ca_file)


def _dispatcher_stub(secure_cluster, token: str | None):
    channel = channels.make_channel(secure_cluster.dispatcher.address, token, _tls(secure_cluster))
    return dispatcher_pb2_grpc.DispatcherServiceStub(channel)


def _worker_addresses(secure_cluster) -> list[str]:
    with DispatcherClient(secure_cluster.dispatcher.address, timeout_s=10, tls=_tls(secure_cluster)) as client:
        return sorted(w.address for w in client.get_workers())


def _server_calls(secure_cluster) -> dict[str, tuple]:
    real_worker = _worker_addresses(secure_cluster)[0]
    return {
        "register a fake worker": (
            "WorkerHeartbeat",
            dispatcher_pb2.WorkerHeartbeatRequest(worker_address="localhost:1", worker_uid=7),
        ),
        "take over a real worker's address": (
            "WorkerHeartbeat",
            dispatcher_pb2.WorkerHeartbeatRequest(worker_address=real_worker, worker_uid=12345),
        ),
        "finish a real worker's tasks": (
            "WorkerUpdate",
            dispatcher_pb2.WorkerUpdateRequest(worker_address=real_worker, finished_tasks=[1, 2, 3]),
        ),
        "read another client's graph": ("GetDatasetDef", dispatcher_pb2.GetDatasetDefRequest(dataset_id="1000")),
        "take another iteration's splits": (
            "GetSplits",
            dispatcher_pb2.GetSplitsRequest(iteration_id=1, task_id=1, split_group=0),
        ),
        "commit a snapshot chunk": (
            "CommitSnapshotChunk",
            dispatcher_pb2.CommitSnapshotChunkRequest(worker_address=real_worker, path="/tmp/x", chunk_index=0),
        ),
    }


@pytest.mark.parametrize(
    "attack",
    [
        "register a fake worker", "take over a real worker's address", "finish a real worker's tasks",
        "read another client's graph", "take another iteration's splits", "commit a snapshot chunk",
    ],
)  # fmt: skip
def test_a_client_token_cannot_make_the_servers_calls(secure_cluster, attack):
    method, request = _server_calls(secure_cluster)[attack]
    workers_before = _worker_addresses(secure_cluster)
    trainer = tf.data.Dataset.range(3_000).apply(dataservice.distribute("parallel_epochs", secure_cluster.target))
    read: list = []
    reader = threading.Thread(target=lambda: read.extend(trainer.as_numpy_iterator()))
    reader.start()
    try:
        with pytest.raises(grpc.RpcError) as raised:
            getattr(_dispatcher_stub(secure_cluster, secure_cluster.token), method)(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "client's token cannot call it" in raised.value.details()
        with pytest.raises(grpc.RpcError) as anonymous:
            getattr(_dispatcher_stub(secure_cluster, None), method)(request, timeout=10)
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        reader.join(120)
    assert sorted(read) == list(range(3_000))
    assert _worker_addresses(secure_cluster) == workers_before


def test_a_client_token_cannot_push_tasks_to_a_worker(secure_cluster):
    worker = worker_pb2_grpc.WorkerServiceStub(
        channels.make_channel(secure_cluster.worker.address, secure_cluster.token, _tls(secure_cluster))
    )
    task = common_pb2.TaskDef(task_id=99, dataset_id="1000", iteration_id=1)
    with pytest.raises(grpc.RpcError) as raised:
        worker.ProcessTask(worker_pb2.ProcessTaskRequest(task=task), timeout=10)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as raised:
        worker.PrepareDataset(worker_pb2.PrepareDatasetRequest(dataset_id="1000"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_servers_token_cannot_act_as_a_client(secure_cluster):
    dispatcher = _dispatcher_stub(secure_cluster, secure_cluster.worker_token)
    with pytest.raises(grpc.RpcError) as raised:
        dispatcher.GetWorkers(dispatcher_pb2.GetWorkersRequest(), timeout=10)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "client needs the client token" in raised.value.details()


def test_one_token_for_both_roles_is_refused(tmp_path):
    from dataservice.config import DispatcherConfig

    (tmp_path / "a").write_text("same")
    (tmp_path / "b").write_text("same")
    with pytest.raises(ValueError, match="same token"):
        DispatcherConfig(auth_token_file=str(tmp_path / "a"), worker_token_file=str(tmp_path / "b"))
