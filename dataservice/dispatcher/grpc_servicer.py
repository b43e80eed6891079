"""The dispatcher's gRPC service: a thin adapter over DispatcherCore (as TensorFlow's
grpc_dispatcher_impl.cc over dispatcher_impl.cc).

Each method passes the request to the core and returns its response; a
status.ServiceError becomes its gRPC status, any other exception INTERNAL
(errors.handler), so nothing a client sends can kill the server. Until the core is
attached (a restarted dispatcher replaying its journal) every call is UNAVAILABLE, which
clients retry.
"""

from __future__ import annotations

from dataservice import status
from dataservice.dispatcher.core import DispatcherCore
from dataservice.rpc import errors
from dataservice.v1 import dispatcher_pb2_grpc


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServiceServicer):
    def __init__(self, core: DispatcherCore | None = None, address: str = "the dispatcher"):
        self._attached = core
        self._address = address

    def attach(self, core: DispatcherCore) -> None:
        self._attached = core

    @property
    def _core(self) -> DispatcherCore:
        core = self._attached
        if core is None:
            raise status.unavailable(f"{self._address} is recovering its state from its journal; retry shortly")
        return core

    @errors.handler
    def RegisterDataset(self, request, context):
        return self._core.register_dataset(request)

    @errors.handler
    def GetDataServiceMetadata(self, request, context):
        return self._core.get_data_service_metadata(request)

    @errors.handler
    def GetElementSpec(self, request, context):
        return self._core.get_element_spec(request)

    @errors.handler
    def GetDatasetDef(self, request, context):
        return self._core.get_dataset_def(request)

    @errors.handler
    def GetOrCreateJob(self, request, context):
        return self._core.get_or_create_job(request)

    @errors.handler
    def GetOrCreateIteration(self, request, context):
        return self._core.get_or_create_iteration(request)

    @errors.handler
    def ResumeIteration(self, request, context):
        return self._core.resume_iteration(request)

    @errors.handler
    def ClientHeartbeat(self, request, context):
        return self._core.client_heartbeat(request)

    @errors.handler
    def ReleaseIterationClient(self, request, context):
        return self._core.release_iteration_client(request)

    @errors.handler
    def GetWorkers(self, request, context):
        return self._core.get_workers(request)

    @errors.handler
    def WorkerHeartbeat(self, request, context):
        return self._core.worker_heartbeat(request)

    @errors.handler
    def WorkerUpdate(self, request, context):
        return self._core.worker_update(request)

    @errors.handler
    def GetSplits(self, request, context):
        return self._core.get_splits(request)

    @errors.handler
    def GetStatus(self, request, context):
        return self._core.get_status(request)

    @errors.handler
    def Snapshot(self, request, context):
        return self._core.snapshot(request)

    @errors.handler
    def CommitSnapshotChunk(self, request, context):
        return self._core.commit_snapshot_chunk(request)
