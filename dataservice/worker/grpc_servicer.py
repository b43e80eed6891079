"""The worker's gRPC service: a thin adapter over the worker's task streams (worker/streaming.py).

ProcessTask and PrepareDataset (called by the dispatcher) hand their request
to the worker; StreamElements and GetElement answer frames (transfer/wire.py)
built by the transport-free stream logic, whose status.ServiceError becomes
the call's gRPC status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from dataservice import status
from dataservice.rpc import errors
from dataservice.transfer import wire
from dataservice.v1 import common_pb2, worker_pb2
from dataservice.worker import streaming


class WorkerServicer:
    def __init__(
        self,
        streams: streaming.StreamContext,
        start_task: Callable[[common_pb2.TaskDef], None],
        prepare_dataset: Callable[[str], None],
    ):
        self._streams = streams
        self._start_task = start_task
        self._prepare_dataset = prepare_dataset

    @errors.handler
    def ProcessTask(self, request, context):
        if not request.task.task_id:
            raise status.invalid_argument("ProcessTask needs a task with a task_id")
        self._start_task(request.task)
        return worker_pb2.ProcessTaskResponse()

    @errors.handler
    def PrepareDataset(self, request, context):
        if not request.dataset_id:
            raise status.invalid_argument("PrepareDataset needs a dataset_id")
        self._prepare_dataset(request.dataset_id)
        return worker_pb2.PrepareDatasetResponse()

    def StreamElements(self, request_iterator, context):
        request = next(request_iterator, None)
        if request is None:
            return
        later = _until_broken(request_iterator)
        try:
            for header, buffers in streaming.stream_task(self._streams, request, later, context.is_active):
                yield wire.frame(header, buffers)
        except status.ServiceError as e:
            context.abort(errors.grpc_code(e.code), e.message)

    def GetElement(self, request, context):
        try:
            header, buffers = streaming.get_element(self._streams, request)
        except status.ServiceError as e:
            context.abort(errors.grpc_code(e.code), e.message)
        return wire.frame(header, buffers)


def _until_broken(requests: Iterator[worker_pb2.StreamElementsRequest]) -> Iterator[worker_pb2.StreamElementsRequest]:
    """The client's later requests until the call ends, cancelled or broken (gRPC raises then):
    the transport-free stream logic sees an end, as from the other transfers."""
    try:
        yield from requests
    except grpc.RpcError:
        return
