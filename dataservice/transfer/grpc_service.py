"""The worker's data methods with framed responses: the server's handlers and the client's stub.

StreamElements and GetElement answer frames (dataservice/transfer/wire.py): the
handlers return bytes that gRPC sends as they are, and the client receives
the bytes without protobuf parsing them, so tensor buffers are never copied
through a protobuf message. ProcessTask and PrepareDataset, which the
dispatcher calls, stay ordinary protobuf methods. The method names are those
of WorkerService in proto/dataservice/v1/worker.proto.
"""

from __future__ import annotations

import grpc

from dataservice.v1 import worker_pb2

_SERVICE = "dataservice.v1.WorkerService"


def add_worker_service(server: grpc.Server, servicer) -> None:
    """Registers `servicer`'s methods (every method of WorkerService) on `server`."""
    handlers = {
        "ProcessTask": grpc.unary_unary_rpc_method_handler(
            servicer.ProcessTask,
            request_deserializer=worker_pb2.ProcessTaskRequest.FromString,
            response_serializer=worker_pb2.ProcessTaskResponse.SerializeToString,
        ),
        "PrepareDataset": grpc.unary_unary_rpc_method_handler(
            servicer.PrepareDataset,
            request_deserializer=worker_pb2.PrepareDatasetRequest.FromString,
            response_serializer=worker_pb2.PrepareDatasetResponse.SerializeToString,
        ),
        "StreamElements": grpc.stream_stream_rpc_method_handler(
            servicer.StreamElements, request_deserializer=worker_pb2.StreamElementsRequest.FromString
        ),
        "GetElement": grpc.unary_unary_rpc_method_handler(
            servicer.GetElement, request_deserializer=worker_pb2.GetElementRequest.FromString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))


class WorkerDataStub:
    """A client's stub for the data methods; their responses arrive as frame bytes."""

    def __init__(self, channel: grpc.Channel):
        self.StreamElements = channel.stream_stream(
            f"/{_SERVICE}/StreamElements", request_serializer=worker_pb2.StreamElementsRequest.SerializeToString
        )
        self.GetElement = channel.unary_unary(
            f"/{_SERVICE}/GetElement", request_serializer=worker_pb2.GetElementRequest.SerializeToString
        )
