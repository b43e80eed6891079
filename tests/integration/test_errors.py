"""Bad input gets a clear error, and the servers keep serving."""

import socket
import time

import grpc
import pytest
import tensorflow as tf
from conftest import to_list
from tensorflow.core.framework import graph_pb2

import dataservice as service
from dataservice.pipeline import graph as graph_lib
from dataservice.rpc import channels
from dataservice.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc

pytestmark = pytest.mark.timeout(60)


def _stub(cluster):
    return dispatcher_pb2_grpc.DispatcherServiceStub(channels.make_channel(cluster.address))


def _metadata(ds):
    return common_pb2.DatasetMetadata(element_spec=graph_lib.encode_element_spec(ds.element_spec))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _assert_still_serving(cluster):
    ds = tf.data.Dataset.range(3).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(to_list(ds)) == [0, 1, 2]


def test_unknown_dataset_id_is_not_found(cluster):
    with pytest.raises(tf.errors.NotFoundError, match="Dataset id nope not found: it is not registered"):
        service.from_dataset_id("parallel_epochs", cluster.target, "nope")
    # With an element_spec too: the id is checked here, not at the first element.
    with pytest.raises(tf.errors.NotFoundError, match="Dataset id nope not found: it is not registered"):
        service.from_dataset_id("parallel_epochs", cluster.target, "nope", element_spec=tf.TensorSpec([], tf.int64))
    _assert_still_serving(cluster)


@pytest.mark.parametrize(
    "graph_bytes, message",
    [
        (b"\xff\xfe not a graph", "not a serialized GraphDef"),
        (graph_pb2.GraphDef(node=[{"name": "c", "op": "Const"}]).SerializeToString(), "no '_Retval'"),
        (
            graph_pb2.GraphDef(
                node=[{"name": "x", "op": "NoSuchOp"}, {"name": "dataset", "op": "_Retval", "input": ["x"]}]
            ).SerializeToString(),
            "does not import",
        ),
    ],
)
def test_malformed_graph_is_invalid_argument(cluster, graph_bytes, message):
    request = dispatcher_pb2.RegisterDatasetRequest(graph_def=graph_bytes, metadata=_metadata(tf.data.Dataset.range(1)))
    with pytest.raises(grpc.RpcError) as info:
        _stub(cluster).RegisterDataset(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    _assert_still_serving(cluster)


def test_unreadable_element_spec_is_invalid_argument(cluster):
    ds = tf.data.Dataset.range(1)
    request = dispatcher_pb2.RegisterDatasetRequest(
        graph_def=graph_lib.serialize_dataset(ds), metadata=common_pb2.DatasetMetadata(element_spec=b"\x0a\xff garbage")
    )
    with pytest.raises(grpc.RpcError) as info:
        _stub(cluster).RegisterDataset(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "element_spec" in info.value.details()
    _assert_still_serving(cluster)


def _python_pipeline():
    return tf.data.Dataset.range(3).map(lambda x: tf.py_function(lambda v: v * 2, [x], tf.int64))


def test_python_functions_are_refused_before_any_rpc():
    # No dispatcher at all: the refusal must come from the client's own check.
    with pytest.raises(ValueError, match="EagerPyFunc.*tf.py_function"):
        _python_pipeline().apply(service.distribute("parallel_epochs", f"grpc://localhost:{_free_port()}"))
    gen = tf.data.Dataset.from_generator(lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32))
    with pytest.raises(ValueError, match="PyFunc.*from_generator"):
        service.register_dataset(f"grpc://localhost:{_free_port()}", gen)


def test_python_functions_are_refused_by_the_dispatcher(cluster):
    ds = _python_pipeline()
    request = dispatcher_pb2.RegisterDatasetRequest(graph_def=graph_lib.serialize_dataset(ds), metadata=_metadata(ds))
    with pytest.raises(grpc.RpcError) as info:
        _stub(cluster).RegisterDataset(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot run on a remote worker" in info.value.details()


def test_unreachable_dispatcher_fails_within_the_timeout():
    address = f"localhost:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match=f"dispatcher at {address} is unavailable"):
        tf.data.Dataset.range(3).apply(
            service.distribute("parallel_epochs", "grpc://" + address, dispatcher_timeout_ms=1500)
        )
    assert time.monotonic() - start < 10


def test_worker_without_dispatcher_fails_to_start():
    config = service.WorkerConfig(dispatcher_address=f"localhost:{_free_port()}", dispatcher_timeout_ms=1000)
    with pytest.raises(tf.errors.UnavailableError, match="is unavailable"):
        service.WorkerServer(config)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(processing_mode="every_epoch"), "processing_mode"),
        (dict(processing_mode=7), "processing_mode"),
        (dict(compression="gzip"), "compression"),
        (dict(target_workers="NEAREST"), "target_workers"),
        (dict(job_name=""), "job_name"),
        (dict(job_name=3), "job_name"),
        (dict(consumer_index=0), "together"),
        (dict(num_consumers=2), "together"),
        (dict(consumer_index=0, num_consumers=2), "need a job_name"),
        (dict(job_name="j", consumer_index=2, num_consumers=2), "consumer_index"),
        (dict(max_outstanding_requests=0), "max_outstanding_requests"),
        (dict(data_transfer_protocol="rdma"), "data_transfer_protocol"),
        (dict(service="http://localhost:1"), "protocol"),
        (dict(service="localhost"), "host:port"),
        (dict(service=42), "service"),
        (dict(service="grpc://localhost:1://x"), "more than one '://'"),
        (dict(max_outstanding_requests=-2), "max_outstanding_requests"),
        (dict(max_outstanding_requests=True), "max_outstanding_requests"),
        (dict(dispatcher_timeout_ms=0), "dispatcher_timeout_ms"),
        (dict(stream_timeout_ms=1000), "stream_timeout_ms must be an integer of at least 5000"),
        (dict(stream_timeout_ms=7.5), "stream_timeout_ms"),
    ],
)
def test_invalid_distribute_arguments_are_value_errors(kwargs, message):
    args = dict(processing_mode="parallel_epochs", service="grpc://localhost:1")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        service.distribute(**args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(fault_tolerant_mode=True), "work_dir"),
        (dict(port=-1), "port"),
        (dict(port=70000), "port"),
        (dict(protocol="http"), "protocol"),
        (dict(worker_addresses="a:1"), "worker_addresses"),
        (dict(worker_timeout_ms=-1), "worker_timeout_ms must be a non-negative"),
        (dict(worker_timeout_ms=1.5), "worker_timeout_ms must be a non-negative"),
        (dict(job_gc_timeout_ms=-2), "job_gc_timeout_ms must be a non-negative number of milliseconds, or -1"),
    ],
)
def test_invalid_dispatcher_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        service.DispatcherConfig(**kwargs)


def test_job_gc_timeout_minus_one_is_never_as_in_tensorflow():
    assert service.DispatcherConfig(job_gc_timeout_ms=-1).job_gc_timeout_ms == -1


def test_zero_milliseconds_is_the_shortest_and_none_the_default_as_in_tensorflow():
    zero = service.DispatcherConfig(job_gc_check_interval_ms=0, job_gc_timeout_ms=0, worker_timeout_ms=0)
    assert (zero.job_gc_check_interval_ms, zero.job_gc_timeout_ms, zero.worker_timeout_ms) == (1, 1, 1)
    default = service.DispatcherConfig()
    assert default.worker_timeout_ms > 1000 and default.job_gc_timeout_ms > 1000
    worker = service.WorkerConfig("localhost:1", heartbeat_interval_ms=0, dispatcher_timeout_ms=0, protocol=None)
    assert (worker.heartbeat_interval_ms, worker.dispatcher_timeout_ms, worker.protocol) == (1, 1, "grpc")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dispatcher_address=""), "dispatcher_address"),
        (dict(dispatcher_address="ftp://x:1"), "protocol"),
        (dict(dispatcher_address="localhost:1", heartbeat_interval_ms=-5), "heartbeat_interval_ms"),
        (dict(dispatcher_address="localhost:1", port="80"), "port"),
    ],
)
def test_invalid_worker_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        service.WorkerConfig(**kwargs)


def test_raw_rpcs_with_bad_ids_get_the_right_codes(cluster):
    stub = _stub(cluster)
    cases = [
        (stub.GetOrCreateIteration, dispatcher_pb2.GetOrCreateIterationRequest(job_id=999), grpc.StatusCode.NOT_FOUND),
        (
            stub.ClientHeartbeat,
            dispatcher_pb2.ClientHeartbeatRequest(iteration_client_id=999),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            stub.ReleaseIterationClient,
            dispatcher_pb2.ReleaseIterationClientRequest(iteration_client_id=999),
            grpc.StatusCode.NOT_FOUND,
        ),
        (stub.GetElementSpec, dispatcher_pb2.GetElementSpecRequest(dataset_id=""), grpc.StatusCode.INVALID_ARGUMENT),
        (stub.GetDatasetDef, dispatcher_pb2.GetDatasetDefRequest(dataset_id="x"), grpc.StatusCode.NOT_FOUND),
        (stub.WorkerHeartbeat, dispatcher_pb2.WorkerHeartbeatRequest(), grpc.StatusCode.INVALID_ARGUMENT),
        (
            stub.WorkerUpdate,
            dispatcher_pb2.WorkerUpdateRequest(worker_address="nobody:1", finished_tasks=[1]),
            grpc.StatusCode.NOT_FOUND,
        ),
        (stub.GetOrCreateJob, dispatcher_pb2.GetOrCreateJobRequest(dataset_id="x"), grpc.StatusCode.NOT_FOUND),
        (
            stub.GetOrCreateJob,
            dispatcher_pb2.GetOrCreateJobRequest(
                dataset_id="x", processing_mode=common_pb2.ProcessingModeDef(sharding_policy=42)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ]
    for method, request, code in cases:
        with pytest.raises(grpc.RpcError) as info:
            method(request, timeout=10)
        assert info.value.code() == code, (request, info.value.details())
        assert info.value.details()
    _assert_still_serving(cluster)


def test_job_mismatch_names_the_difference(cluster):
    """A named job asked for again with other arguments is INVALID_ARGUMENT naming what differs;
    the same name for another dataset is another job, as in TensorFlow (names are per dataset)."""
    dataset_id = service.register_dataset(cluster.target, tf.data.Dataset.range(5)).numpy().decode()
    stub = _stub(cluster)
    dynamic = common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_DYNAMIC)
    first = stub.GetOrCreateJob(dispatcher_pb2.GetOrCreateJobRequest(dataset_id=dataset_id, job_name="a"), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetOrCreateJob(
            dispatcher_pb2.GetOrCreateJobRequest(dataset_id=dataset_id, job_name="a", processing_mode=dynamic),
            timeout=10,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "processing mode" in info.value.details()
    other = service.register_dataset(cluster.target, tf.data.Dataset.range(6)).numpy().decode()
    second = stub.GetOrCreateJob(dispatcher_pb2.GetOrCreateJobRequest(dataset_id=other, job_name="a"), timeout=10)
    assert second.job_id != first.job_id
