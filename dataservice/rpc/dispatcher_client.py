"""DispatcherClient: every call to the dispatcher, from clients, workers and split fetchers.

One place decides how the dispatcher is reached: which channel (a client
process shares one per address with its readers; a worker owns one), the
deadline of each call, which failures are retried (UNAVAILABLE and ABORTED,
with backoff, until the call's timeout), and how a failure reads ("...: the
dispatcher at HOST:PORT is unavailable", the status kept as the matching
class of its code, status.py). Authentication, TLS and client-side metrics hook in here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import grpc

from dataservice import status
from dataservice.rpc import auth, errors, retrying
from dataservice.rpc.channels import make_channel, shared_channels
from dataservice.rpc.tls import TlsFiles, diagnose
from dataservice.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc

# Each try of a call waits at most this long for an answer (the call as a whole: its timeout).
DEFAULT_RPC_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class ReadingTotals:
    """What a client reports of its reading in each heartbeat, as totals since it started:
    elements and bytes handed to its consumer, seconds it waited for data, and seconds its
    consumer spent on what it was handed."""

    elements: int = 0
    nbytes: int = 0
    wait_s: float = 0.0
    consume_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class TaskPosition:
    """How far a saved iterator had read one task: the elements its consumer had taken from the
    task's stream, and the task's latest receipt it held with the count that receipt covers
    (read_keys.py): the dispatcher resumes no position past a receipt."""

    task_id: int
    elements: int
    receipt_elements: int = 0
    receipt: str = ""


class DispatcherClient:
    """Typed calls to the dispatcher at `address` ("host:port").

    `timeout_s` bounds each call, retries included, unless the call is given
    its own (a try still waits retrying.MIN_TRY_S for its answer). `shared=True`
    (clients) uses the process's shared channel to the address; otherwise
    (workers) the client owns its channel. close() gives the channel back.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float,
        shared: bool = False,
        auth_token: str | None = None,
        tls: TlsFiles | None = None,
    ):
        self.address = address
        self.timeout_s = timeout_s
        self._shared = shared
        self._tls = tls
        self._channel: grpc.Channel | None = (
            shared_channels.acquire(address, tls)
            if shared
            else make_channel(address, auth_token or auth.client_token(), tls)
        )
        self._stub = dispatcher_pb2_grpc.DispatcherServiceStub(self._channel)

    @property
    def server(self) -> str:
        """How errors name the peer."""
        return f"dispatcher at {self.address}"

    def close(self) -> None:
        """Releases the channel; calling it again does nothing."""
        if self._channel is None:
            return
        if self._shared:
            shared_channels.release(self._channel)
        else:
            self._channel.close()
        self._channel = None

    def __enter__(self) -> DispatcherClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(
        self,
        method: Callable,
        request,
        what: str,
        timeout_s: float | None = None,
        rpc_timeout_s: float | None = DEFAULT_RPC_TIMEOUT_S,
    ):
        try:
            return retrying.call(
                method,
                request,
                server=self.server,
                what=what,
                timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                rpc_timeout_s=rpc_timeout_s,
            )
        except status.UnavailableError as e:
            # Why it could not be reached, if a look at its TLS says (plaintext against TLS, an
            # unknown CA, a missing client certificate...).
            reason = diagnose(self.address, self._tls)
            if reason is None:
                raise
            raise status.UnavailableError(f"{e.message}; the {self.server}: {reason}") from None

    # ---- datasets ----------------------------------------------------------

    def register_dataset(
        self,
        graph_def: bytes,
        metadata: common_pb2.DatasetMetadata,
        requested_dataset_id: str = "",
        prepare_workers: bool = False,
    ) -> str:
        request = dispatcher_pb2.RegisterDatasetRequest(
            graph_def=graph_def,
            metadata=metadata,
            requested_dataset_id=requested_dataset_id,
            prepare_workers=prepare_workers,
        )
        return self._call(self._stub.RegisterDataset, request, "registering a dataset").dataset_id

    def get_data_service_metadata(self, dataset_id: str) -> common_pb2.DatasetMetadata:
        return self.dataset_metadata(dataset_id).metadata

    def dataset_metadata(
        self, dataset_id: str = "", job_name: str = ""
    ) -> dispatcher_pb2.GetDataServiceMetadataResponse:
        """The metadata, element layout and id of dataset `dataset_id`, or (without it) of the
        dataset of the job named `job_name`."""
        request = dispatcher_pb2.GetDataServiceMetadataRequest(dataset_id=dataset_id, job_name=job_name)
        what = f"fetching the element spec of dataset {dataset_id!r}" if dataset_id else f"finding job {job_name!r}"
        return self._call(self._stub.GetDataServiceMetadata, request, what)

    def get_dataset_def(self, dataset_id: str) -> dispatcher_pb2.GetDatasetDefResponse:
        request = dispatcher_pb2.GetDatasetDefRequest(dataset_id=dataset_id)
        return self._call(self._stub.GetDatasetDef, request, f"fetching dataset {dataset_id}")

    # ---- jobs, iterations and their clients -----------------------------------

    def get_or_create_job(self, request: dispatcher_pb2.GetOrCreateJobRequest) -> int:
        return self._call(self._stub.GetOrCreateJob, request, "creating a job").job_id

    def get_or_create_iteration(self, job_id: int, repetition: int) -> dispatcher_pb2.GetOrCreateIterationResponse:
        request = dispatcher_pb2.GetOrCreateIterationRequest(job_id=job_id, repetition=repetition)
        return self._call(self._stub.GetOrCreateIteration, request, "creating an iteration")

    def resume_iteration(
        self, job: dispatcher_pb2.GetOrCreateJobRequest, progress: Sequence[TaskPosition]
    ) -> dispatcher_pb2.ResumeIterationResponse:
        """A new iteration continuing where a saved iterator stood, at `progress` (one per task)."""
        request = dispatcher_pb2.ResumeIterationRequest(
            job=job,
            progress=[
                dispatcher_pb2.TaskProgress(
                    task_id=p.task_id, elements=p.elements, receipt_elements=p.receipt_elements, receipt=p.receipt
                )
                for p in progress
            ],
        )
        return self._call(self._stub.ResumeIteration, request, "resuming a restored iterator")

    def client_heartbeat(
        self,
        iteration_client_id: int,
        current_round: int = 0,
        consumed_tasks: Sequence[int] = (),
        reading: ReadingTotals | None = None,
        read_key: str = "",
        tasks_version: int = 0,
    ) -> dispatcher_pb2.ClientHeartbeatResponse:
        """`tasks_version`: the last answer's (0: answer with every task of the iteration)."""
        request = dispatcher_pb2.ClientHeartbeatRequest(
            iteration_client_id=iteration_client_id,
            current_round=current_round,
            consumed_tasks=consumed_tasks,
            read_key=read_key,
            tasks_version=tasks_version,
        )
        if reading is not None:
            request.elements_received = reading.elements
            request.bytes_received = reading.nbytes
            request.wait_seconds = reading.wait_s
            request.consume_seconds = reading.consume_s
        return self._call(self._stub.ClientHeartbeat, request, "client heartbeat")

    def release_iteration_client(self, iteration_client_id: int, timeout_s: float, read_key: str = "") -> None:
        """One try, no retries: releasing is best effort (a silent client is released after
        client_timeout_ms anyway)."""
        request = dispatcher_pb2.ReleaseIterationClientRequest(
            iteration_client_id=iteration_client_id, read_key=read_key
        )
        try:
            self._stub.ReleaseIterationClient(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise errors.client_error(e, f"releasing iteration client {iteration_client_id} ({self.server})") from None

    def get_workers(self) -> list[dispatcher_pb2.WorkerInfo]:
        request = dispatcher_pb2.GetWorkersRequest()
        return list(self._call(self._stub.GetWorkers, request, "listing workers").workers)

    # ---- workers -------------------------------------------------------------

    def worker_heartbeat(
        self,
        worker_address: str,
        transfer_address: str,
        current_tasks: Sequence[int],
        timeout_s: float,
        worker_uid: int = 0,
        task_loads: Sequence[dispatcher_pb2.TaskLoad] = (),
        snapshot_chunks: Sequence[tuple[str, int]] = (),
        worker_tags: Sequence[str] = (),
    ) -> dispatcher_pb2.WorkerHeartbeatResponse:
        request = dispatcher_pb2.WorkerHeartbeatRequest(
            worker_address=worker_address,
            transfer_address=transfer_address,
            current_tasks=current_tasks,
            worker_uid=worker_uid,
            task_loads=task_loads,
            current_snapshot_chunks=[
                dispatcher_pb2.SnapshotChunkRef(path=path, chunk_index=index) for path, index in snapshot_chunks
            ],
            worker_tags=worker_tags,
        )
        what = f"worker {worker_address} heartbeat"
        return self._call(self._stub.WorkerHeartbeat, request, what, timeout_s=timeout_s, rpc_timeout_s=10.0)

    def worker_update(self, worker_address: str, finished_tasks: Sequence[int], timeout_s: float) -> None:
        request = dispatcher_pb2.WorkerUpdateRequest(worker_address=worker_address, finished_tasks=finished_tasks)
        self._call(self._stub.WorkerUpdate, request, f"worker {worker_address} task update", timeout_s=timeout_s)

    def commit_snapshot_chunk(
        self, request: dispatcher_pb2.CommitSnapshotChunkRequest
    ) -> dispatcher_pb2.CommitSnapshotChunkResponse:
        what = f"committing chunk {request.chunk_index} of snapshot {request.path}"
        return self._call(self._stub.CommitSnapshotChunk, request, what)

    def snapshot(self, dataset_id: str, path: str, metadata: bytes) -> None:
        """Starts a distributed_save of the dataset to `path`."""
        request = dispatcher_pb2.SnapshotRequest(dataset_id=dataset_id, path=path, metadata=metadata)
        self._call(self._stub.Snapshot, request, f"starting a snapshot at {path}")

    def get_status(self) -> dict:
        """The dispatcher's status document (what /status.json serves)."""
        response = self._call(self._stub.GetStatus, dispatcher_pb2.GetStatusRequest(), "getting the status")
        return json.loads(response.status_json)

    def get_splits(
        self, iteration_id: int, task_id: int, split_group: int, repetition: int, index: int, max_splits: int = 0
    ) -> dispatcher_pb2.GetSplitsResponse:
        """Range `index` of the group's repetition for the task, of at most `max_splits` splits
        (0: the dispatcher's default)."""
        request = splits_request(iteration_id, task_id, split_group, repetition, index, max_splits)
        return self._call(self._stub.GetSplits, request, f"fetching splits for task {task_id}")


def splits_request(
    iteration_id: int, task_id: int, split_group: int, repetition: int, index: int, max_splits: int = 0
) -> dispatcher_pb2.GetSplitsRequest:
    """What DispatcherClient.get_splits asks."""
    return dispatcher_pb2.GetSplitsRequest(
        iteration_id=iteration_id,
        task_id=task_id,
        split_group=split_group,
        repetition=repetition,
        index=index,
        max_splits=max_splits,
    )
