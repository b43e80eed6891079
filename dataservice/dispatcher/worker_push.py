"""The dispatcher's gRPC calls to workers: new tasks and datasets pushed before the next heartbeat.

Best effort, in the background on a small pool: a worker that cannot be
reached learns the same from its next heartbeat, so a failure is only logged.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading

import grpc

from dataservice.rpc.channels import make_channel
from dataservice.rpc.tls import TlsFiles
from dataservice.v1 import common_pb2, worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

PUSH_TIMEOUT_S = 5.0
PUSH_THREADS = 4


class GrpcWorkerNotifier:
    """core.WorkerNotifier over gRPC: ProcessTask and PrepareDataset calls to the workers."""

    def __init__(self, auth_token: str | None = None, tls: TlsFiles | None = None) -> None:
        self._auth_token = auth_token
        self._tls = tls
        self._lock = threading.Lock()
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=PUSH_THREADS, thread_name_prefix="task-push")

    def process_task(self, worker_address: str, task: common_pb2.TaskDef) -> None:
        self._push(
            worker_address,
            "ProcessTask",
            worker_pb2.ProcessTaskRequest(task=task),
            f"task {task.task_id}",
            "its heartbeat will deliver it",
        )

    def prepare_dataset(self, worker_address: str, dataset_id: str) -> None:
        self._push(
            worker_address,
            "PrepareDataset",
            worker_pb2.PrepareDatasetRequest(dataset_id=dataset_id),
            f"dataset {dataset_id}",
            "its first task will build it",
        )

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()

    def _push(self, worker_address: str, method: str, request, what: str, fallback: str) -> None:
        def push() -> None:
            try:
                getattr(self._stub(worker_address), method)(request, timeout=PUSH_TIMEOUT_S)
            except grpc.RpcError as e:
                log.info("could not push %s to %s (%s); %s", what, worker_address, e.code().name, fallback)
            except ValueError:  # the channel was closed: the dispatcher is stopping
                pass

        try:
            self._pool.submit(push)
        except RuntimeError:  # the dispatcher is stopping
            pass

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = self._channels[address] = make_channel(address, self._auth_token, self._tls)
                stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
            return stub
