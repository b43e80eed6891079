"""Helpers for the unit tests that drive the dispatcher core without a server: a fake clock, a
notifier that records what the core would push to workers, and requests as clients and workers
send them. (A module of its own, not a conftest: tests/conftest.py already has that module name.)"""

import tensorflow as tf

from dataservice import read_keys
from dataservice.config import DispatcherConfig
from dataservice.dispatcher.core import DispatcherCore
from dataservice.pipeline import graph as graph_lib
from dataservice.v1 import common_pb2, dispatcher_pb2

DYNAMIC = common_pb2.SHARDING_POLICY_DYNAMIC
OFF = common_pb2.SHARDING_POLICY_OFF


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingNotifier:
    def __init__(self) -> None:
        self.tasks: list[tuple[str, int]] = []
        self.datasets: list[tuple[str, str]] = []
        # The iteration secret each task came with (TaskDef.read_key), as its worker keeps it.
        self.secrets: dict[int, str] = {}

    def process_task(self, worker_address, task) -> None:
        self.tasks.append((worker_address, task.task_id))
        self.secrets[task.task_id] = task.read_key

    def task_progress(self, task_id: int, elements: int, covered: int | None = None) -> dispatcher_pb2.TaskProgress:
        """A checkpoint's position in the task, with the receipt its worker signs for having sent
        `covered` elements (by default `elements`), as a client keeps it."""
        covered = elements if covered is None else covered
        receipt = read_keys.receipt(self.secrets.get(task_id, ""), task_id, covered)
        return dispatcher_pb2.TaskProgress(
            task_id=task_id, elements=elements, receipt_elements=covered, receipt=receipt
        )

    def prepare_dataset(self, worker_address, dataset_id) -> None:
        self.datasets.append((worker_address, dataset_id))


def make_core(clock, notifier, **config) -> DispatcherCore:
    config.setdefault("worker_timeout_ms", 2000)
    config.setdefault("client_timeout_ms", 3000)
    config.setdefault("job_gc_timeout_ms", 5000)
    return DispatcherCore(DispatcherConfig(**config), "test:0", clock=clock, notifier=notifier)


def register(core: DispatcherCore, dataset: tf.data.Dataset, prepare_workers: bool = False) -> str:
    metadata = common_pb2.DatasetMetadata(
        element_spec=graph_lib.encode_element_spec(dataset.element_spec), cardinality=int(dataset.cardinality())
    )
    request = dispatcher_pb2.RegisterDatasetRequest(
        graph_def=graph_lib.serialize_dataset(dataset), metadata=metadata, prepare_workers=prepare_workers
    )
    return core.register_dataset(request).dataset_id


def heartbeat(core: DispatcherCore, worker: str, current: tuple[int, ...] = (), uid: int = 0, snapshot_chunks=()):
    chunks = [dispatcher_pb2.SnapshotChunkRef(path=path, chunk_index=index) for path, index in snapshot_chunks]
    return core.worker_heartbeat(
        dispatcher_pb2.WorkerHeartbeatRequest(
            worker_address=worker, current_tasks=current, worker_uid=uid, current_snapshot_chunks=chunks
        )
    )


def start_iteration(core, dataset_id, policy=OFF, job_name="", num_consumers=0, repetition=0):
    job = core.get_or_create_job(
        dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=policy),
            job_name=job_name,
            num_consumers=num_consumers,
        )
    )
    response = core.get_or_create_iteration(
        dispatcher_pb2.GetOrCreateIterationRequest(job_id=job.job_id, repetition=repetition)
    )
    _READ_KEYS[(id(core), response.iteration_client_id)] = response.read_key
    return response


def release(core, iteration) -> None:
    """The client of `iteration` (start_iteration's answer) releases it."""
    core.release_iteration_client(
        dispatcher_pb2.ReleaseIterationClientRequest(
            iteration_client_id=iteration.iteration_client_id, read_key=iteration.read_key
        )
    )


# The read key each client of a core was given (read_keys.py), as a client keeps it.
_READ_KEYS: dict[tuple[int, int], str] = {}


def read_key(core, client_id) -> str:
    return _READ_KEYS.get((id(core), client_id), "")


def client_heartbeat(core, client_id, current_round=0, tasks_version=0, consumed=()):
    return core.client_heartbeat(
        dispatcher_pb2.ClientHeartbeatRequest(
            iteration_client_id=client_id,
            current_round=current_round,
            read_key=read_key(core, client_id),
            tasks_version=tasks_version,
            consumed_tasks=consumed,
        )
    )


def splits(core, iteration_id, task_id, index, repetition=0, max_splits=0) -> tuple[int, int, bool]:
    response = core.get_splits(
        dispatcher_pb2.GetSplitsRequest(
            iteration_id=iteration_id,
            task_id=task_id,
            split_group=0,
            repetition=repetition,
            index=index,
            max_splits=max_splits,
        )
    )
    return response.begin, response.end, response.end_of_splits


def tasks_by_worker(core, client_id) -> dict:
    return {t.worker_address: t.task_id for t in client_heartbeat(core, client_id).tasks}
