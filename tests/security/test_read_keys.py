"""Tenants of one cluster apart (read_keys.py): a client holding the cluster's token, with an
iteration of its own, tries to read another client's task (in distributed_epoch what it takes
is lost to its owner) and to heartbeat and release that client, by ids one below its own, as
an attacker would guess them, and to read its own task under a client id it made up. Each is
PERMISSION_DENIED and the victim reads every element of its epoch exactly once.

The same secret signs receipts: a client that resumes "from a checkpoint" it made up, to have
a worker skip 2**62 elements of an infinite pipeline, is INVALID_ARGUMENT while a trainer
reads on."""

from __future__ import annotations

import threading

import grpc
import tensorflow as tf

import dataservice
from dataservice.client.element_streams import open_stream
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


def test_a_client_cannot_resume_past_what_its_task_sent(secure_cluster):
    tls_files = tls.TlsFiles(ca_file=secure_cluster.certs.ca_file)
    infinite = tf.data.Dataset.range(3).repeat()
    trainer = iter(infinite.apply(dataservice.distribute("parallel_epochs", secure_cluster.target)))
    assert [int(next(trainer)) for _ in range(6)] == [0, 1, 2, 0, 1, 2]

    # The attacker reads a few elements of an iteration of its own, keeping the receipts sent.
    dataset_id = dataservice.register_dataset(secure_cluster.target, infinite).numpy().decode()
    job = dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset_id,
        processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_OFF),
    )
    with DispatcherClient(secure_cluster.dispatcher.address, timeout_s=10, tls=tls_files) as attacker:
        own = attacker.get_or_create_iteration(attacker.get_or_create_job(job), 0)
        (task,) = attacker.client_heartbeat(own.iteration_client_id, read_key=own.read_key).tasks
    request = worker_pb2.StreamElementsRequest(
        task_id=task.task_id, iteration_client_id=own.iteration_client_id, credits=5, read_key=own.read_key
    )
    done = threading.Event()

    def requests():  # a stream whose requests end is a client gone: it stays open until done
        yield request
        done.wait(20)

    covered, receipt = 0, ""
    for response, _ in open_stream(task, "grpc", requests(), tls_files):
        if response.receipt:
            covered = response.first_element + sum(c.num_elements for c in response.chunks)
            receipt = response.receipt
        if covered >= 5:
            break
    done.set()
    assert covered == 5 and receipt

    dispatcher = dispatcher_pb2_grpc.DispatcherServiceStub(
        channels.make_channel(secure_cluster.dispatcher.address, secure_cluster.token, tls_files)
    )
    forged = {
        "past its receipt": (2**62, covered, receipt),
        "with the count changed": (2**62, 2**62, receipt),
        "with no receipt": (2**62, 0, ""),
    }
    for name, (elements, receipt_elements, signed) in forged.items():
        progress = dispatcher_pb2.TaskProgress(
            task_id=task.task_id, elements=elements, receipt_elements=receipt_elements, receipt=signed
        )
        try:
            dispatcher.ResumeIteration(dispatcher_pb2.ResumeIterationRequest(job=job, progress=[progress]), timeout=10)
            raise AssertionError(f"a position {name} was resumed")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, e.details())
            assert f"task {task.task_id}" in e.details(), e.details()
    # The position the receipt covers resumes.
    honest = dispatcher_pb2.TaskProgress(
        task_id=task.task_id, elements=covered, receipt_elements=covered, receipt=receipt
    )
    resumed = dispatcher.ResumeIteration(dispatcher_pb2.ResumeIterationRequest(job=job, progress=[honest]), timeout=10)
    assert resumed.task_ids
    dispatcher.ReleaseIterationClient(
        dispatcher_pb2.ReleaseIterationClientRequest(
            iteration_client_id=resumed.iteration_client_id, read_key=resumed.read_key
        ),
        timeout=10,
    )
    assert [int(next(trainer)) for _ in range(3_000)] == [0, 1, 2] * 1_000
