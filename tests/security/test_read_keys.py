"""Tenants of one cluster apart (read_keys.py): a client holding the cluster's token, with an
iteration of its own, tries to read another client's task (in distributed_epoch what it takes
is lost to its owner) and to heartbeat and release that client, by ids one below its own, as
an attacker would guess them, and to read its own task under a client id it made up. Each is
PERMISSION_DENIED and the victim reads every element of its epoch exactly once."""

from __future__ import annotations

import grpc
import tensorflow as tf

import dataservice
from dataservice.rpc import channels, tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, worker_pb2, worker_pb2_grpc

ELEMENTS = 5_000


def test_a_client_cannot_read_or_release_another_clients_iteration(secure_cluster):
    tls_files = tls.TlsFiles(ca_file=secure_cluster.certs.ca_file)
    victim = iter(
        tf.data.Dataset.range(ELEMENTS).apply(
            dataservice.distribute("distributed_epoch", secure_cluster.target, max_outstanding_requests=1)
        )
    )
    read = [int(next(victim))]

    # The attacker's own iteration, made as any client makes one: its ids are the victim's plus one.
    dataset_id = dataservice.register_dataset(secure_cluster.target, tf.data.Dataset.range(10)).numpy().decode()
    with DispatcherClient(secure_cluster.dispatcher.address, timeout_s=10, tls=tls_files) as attacker:
        job_id = attacker.get_or_create_job(
            dispatcher_pb2.GetOrCreateJobRequest(
                dataset_id=dataset_id,
                processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_OFF),
            )
        )
        own = attacker.get_or_create_iteration(job_id, 0)
        own_tasks = attacker.client_heartbeat(own.iteration_client_id, read_key=own.read_key).tasks
    victim_task = min(t.task_id for t in own_tasks) - 1
    victim_client = own.iteration_client_id - 1

    worker = worker_pb2_grpc.WorkerServiceStub(
        channels.make_channel(secure_cluster.worker.address, secure_cluster.token, tls_files)
    )
    for key in (own.read_key, ""):
        request = worker_pb2.StreamElementsRequest(
            task_id=victim_task, iteration_client_id=own.iteration_client_id, credits=1_000, read_key=key
        )
        try:
            list(worker.StreamElements(iter([request]), timeout=20))
            raise AssertionError("the victim's task was served to another client")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
            assert "did not create or join" in e.details()

    dispatcher = dispatcher_pb2_grpc.DispatcherServiceStub(
        channels.make_channel(secure_cluster.dispatcher.address, secure_cluster.token, tls_files)
    )
    for method, request in (
        ("ClientHeartbeat", dispatcher_pb2.ClientHeartbeatRequest(iteration_client_id=victim_client)),
        (
            "ReleaseIterationClient",
            dispatcher_pb2.ReleaseIterationClientRequest(iteration_client_id=victim_client, read_key=own.read_key),
        ),
    ):
        try:
            getattr(dispatcher, method)(request, timeout=10)
            raise AssertionError(f"{method} acted for another client")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()

    # Its own task under an id it made up (to get around the per-client stream limit): refused too.
    forged = worker_pb2.StreamElementsRequest(
        task_id=min(t.task_id for t in own_tasks),
        iteration_client_id=own.iteration_client_id + 10_000,
        credits=1,
        read_key=own.read_key,
    )
    try:
        list(worker.StreamElements(iter([forged]), timeout=20))
        raise AssertionError("a made-up client id was served")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()

    read.extend(int(x) for x in victim)
    assert sorted(read) == list(range(ELEMENTS)), "the victim lost or repeated elements"
