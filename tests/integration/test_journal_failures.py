"""A fault-tolerant dispatcher process whose journal cannot be written: the RPC fails clearly, nothing
is applied, reads go on, writes succeed once the disk allows them again, and a restart loses nothing
that was acknowledged.

The disk is made "full" with a file-size limit (RLIMIT_FSIZE, set on the running process with
prlimit): journal segments are preallocated in chunks, and the first chunk past the limit cannot be.
"""

import resource

import pytest
import tensorflow as tf

import dataservice as service
from dataservice import errors
from dataservice.dispatcher import journal
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import common_pb2, dispatcher_pb2

pytestmark = pytest.mark.timeout(180)

LIMIT = journal.DEFAULT_CHUNK_BYTES  # the first segment fits; growing it does not


def _create_job(dispatcher: DispatcherClient, dataset_id: str, name: str) -> int:
    return dispatcher.get_or_create_job(
        dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_OFF),
            job_name=name,
        )
    )


def test_a_journal_that_cannot_grow_fails_writes_clearly_and_recovers(tmp_path, processes):
    work_dir = str(tmp_path)
    dispatcher = processes("--role=dispatcher", "--port=0", f"--work_dir={work_dir}", "--fault_tolerant_mode")
    dataset_id = service.register_dataset(f"grpc://{dispatcher.address}", tf.data.Dataset.range(5)).numpy().decode()
    resource.prlimit(dispatcher.proc.pid, resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
    acknowledged = {}
    failure = None
    # Each job is one journal record: a thousand or so fill the first chunk.
    with DispatcherClient(dispatcher.address, timeout_s=1.0) as client:
        for i in range(20_000):
            try:
                acknowledged[f"job-{i}"] = _create_job(client, dataset_id, f"job-{i}")
            except errors.UnavailableError as e:
                failure = (f"job-{i}", e.message)
                break
        assert failure is not None, "the journal never filled its first chunk"
        name, message = failure
        assert "cannot write its journal" in message and "File too large" in message, message
        assert "the change was not made" in message
        # Reads go on while writes fail, and the failed job does not exist.
        assert client.get_data_service_metadata(dataset_id).cardinality == 5
        with pytest.raises(errors.UnavailableError):
            _create_job(client, dataset_id, name)
        # Space returns: the same write succeeds.
        resource.prlimit(dispatcher.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        acknowledged[name] = _create_job(client, dataset_id, name)
        acknowledged["after"] = _create_job(client, dataset_id, "after")
    assert len(set(acknowledged.values())) == len(acknowledged)

    dispatcher.kill()
    restarted = processes(
        "--role=dispatcher", f"--port={dispatcher.port}", f"--work_dir={work_dir}", "--fault_tolerant_mode"
    )
    with DispatcherClient(restarted.address, timeout_s=30) as client:
        for name, job_id in acknowledged.items():
            assert _create_job(client, dataset_id, name) == job_id, f"{name} was acknowledged, then lost"


def test_a_graph_that_cannot_be_stored_is_not_registered(tmp_path, processes):
    dispatcher = processes("--role=dispatcher", "--port=0", f"--work_dir={tmp_path}", "--fault_tolerant_mode")
    resource.prlimit(dispatcher.proc.pid, resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
    # (The first registration also waits for the dispatcher to have imported TensorFlow.)
    first = service.register_dataset(f"grpc://{dispatcher.address}", tf.data.Dataset.range(3))
    big = tf.data.Dataset.from_tensor_slices(tf.range(LIMIT, dtype=tf.int32))  # a graph of 4 x LIMIT bytes
    with pytest.raises(tf.errors.UnavailableError, match="cannot store the dataset's graph"):
        service.register_dataset(f"grpc://{dispatcher.address}", big, dispatcher_timeout_ms=1000)
    second = service.register_dataset(f"grpc://{dispatcher.address}", tf.data.Dataset.range(4))
    assert (first.numpy().decode(), second.numpy().decode()) == ("1", "2"), "the refused dataset took an id"
