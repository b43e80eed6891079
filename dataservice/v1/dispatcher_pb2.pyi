from dataservice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterDatasetRequest(_message.Message):
    __slots__ = ("graph_def", "metadata", "requested_dataset_id", "prepare_workers")
    GRAPH_DEF_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PREPARE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    graph_def: bytes
    metadata: _common_pb2.DatasetMetadata
    requested_dataset_id: str
    prepare_workers: bool
    def __init__(self, graph_def: _Optional[bytes] = ..., metadata: _Optional[_Union[_common_pb2.DatasetMetadata, _Mapping]] = ..., requested_dataset_id: _Optional[str] = ..., prepare_workers: _Optional[bool] = ...) -> None: ...

class RegisterDatasetResponse(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class GetDataServiceMetadataRequest(_message.Message):
    __slots__ = ("dataset_id", "job_name")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    job_name: str
    def __init__(self, dataset_id: _Optional[str] = ..., job_name: _Optional[str] = ...) -> None: ...

class GetDataServiceMetadataResponse(_message.Message):
    __slots__ = ("metadata", "element_layout", "dataset_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.DatasetMetadata
    element_layout: _common_pb2.ElementLayout
    dataset_id: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.DatasetMetadata, _Mapping]] = ..., element_layout: _Optional[_Union[_common_pb2.ElementLayout, _Mapping]] = ..., dataset_id: _Optional[str] = ...) -> None: ...

class GetElementSpecRequest(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class GetElementSpecResponse(_message.Message):
    __slots__ = ("element_spec",)
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    element_spec: bytes
    def __init__(self, element_spec: _Optional[bytes] = ...) -> None: ...

class GetOrCreateJobRequest(_message.Message):
    __slots__ = ("dataset_id", "processing_mode", "job_name", "num_consumers", "target_workers", "use_cross_trainer_cache")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_MODE_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORKERS_FIELD_NUMBER: _ClassVar[int]
    USE_CROSS_TRAINER_CACHE_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    processing_mode: _common_pb2.ProcessingModeDef
    job_name: str
    num_consumers: int
    target_workers: _common_pb2.TargetWorkers
    use_cross_trainer_cache: bool
    def __init__(self, dataset_id: _Optional[str] = ..., processing_mode: _Optional[_Union[_common_pb2.ProcessingModeDef, _Mapping]] = ..., job_name: _Optional[str] = ..., num_consumers: _Optional[int] = ..., target_workers: _Optional[_Union[_common_pb2.TargetWorkers, str]] = ..., use_cross_trainer_cache: _Optional[bool] = ...) -> None: ...

class GetOrCreateJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class GetOrCreateIterationRequest(_message.Message):
    __slots__ = ("job_id", "repetition")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    repetition: int
    def __init__(self, job_id: _Optional[int] = ..., repetition: _Optional[int] = ...) -> None: ...

class GetOrCreateIterationResponse(_message.Message):
    __slots__ = ("iteration_client_id", "iteration_id", "read_key")
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    iteration_id: int
    read_key: str
    def __init__(self, iteration_client_id: _Optional[int] = ..., iteration_id: _Optional[int] = ..., read_key: _Optional[str] = ...) -> None: ...

class TaskProgress(_message.Message):
    __slots__ = ("task_id", "elements", "receipt_elements", "receipt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    elements: int
    receipt_elements: int
    receipt: str
    def __init__(self, task_id: _Optional[int] = ..., elements: _Optional[int] = ..., receipt_elements: _Optional[int] = ..., receipt: _Optional[str] = ...) -> None: ...

class ResumeIterationRequest(_message.Message):
    __slots__ = ("job", "progress")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    job: GetOrCreateJobRequest
    progress: _containers.RepeatedCompositeFieldContainer[TaskProgress]
    def __init__(self, job: _Optional[_Union[GetOrCreateJobRequest, _Mapping]] = ..., progress: _Optional[_Iterable[_Union[TaskProgress, _Mapping]]] = ...) -> None: ...

class ResumeIterationResponse(_message.Message):
    __slots__ = ("iteration_client_id", "iteration_id", "repetition", "task_ids", "read_key")
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    iteration_id: int
    repetition: int
    task_ids: _containers.RepeatedScalarFieldContainer[int]
    read_key: str
    def __init__(self, iteration_client_id: _Optional[int] = ..., iteration_id: _Optional[int] = ..., repetition: _Optional[int] = ..., task_ids: _Optional[_Iterable[int]] = ..., read_key: _Optional[str] = ...) -> None: ...

class ClientHeartbeatRequest(_message.Message):
    __slots__ = ("iteration_client_id", "current_round", "consumed_tasks", "elements_received", "bytes_received", "wait_seconds", "consume_seconds", "read_key", "tasks_version")
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_TASKS_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONSUME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    TASKS_VERSION_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    current_round: int
    consumed_tasks: _containers.RepeatedScalarFieldContainer[int]
    elements_received: int
    bytes_received: int
    wait_seconds: float
    consume_seconds: float
    read_key: str
    tasks_version: int
    def __init__(self, iteration_client_id: _Optional[int] = ..., current_round: _Optional[int] = ..., consumed_tasks: _Optional[_Iterable[int]] = ..., elements_received: _Optional[int] = ..., bytes_received: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., consume_seconds: _Optional[float] = ..., read_key: _Optional[str] = ..., tasks_version: _Optional[int] = ...) -> None: ...

class ClientHeartbeatResponse(_message.Message):
    __slots__ = ("tasks", "iteration_finished", "round_limit", "tasks_version")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FINISHED_FIELD_NUMBER: _ClassVar[int]
    ROUND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TASKS_VERSION_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskInfo]
    iteration_finished: bool
    round_limit: int
    tasks_version: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[_common_pb2.TaskInfo, _Mapping]]] = ..., iteration_finished: _Optional[bool] = ..., round_limit: _Optional[int] = ..., tasks_version: _Optional[int] = ...) -> None: ...

class ReleaseIterationClientRequest(_message.Message):
    __slots__ = ("iteration_client_id", "read_key")
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    read_key: str
    def __init__(self, iteration_client_id: _Optional[int] = ..., read_key: _Optional[str] = ...) -> None: ...

class ReleaseIterationClientResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("address", "transfer_address")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    transfer_address: str
    def __init__(self, address: _Optional[str] = ..., transfer_address: _Optional[str] = ...) -> None: ...

class GetWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class WorkerHeartbeatRequest(_message.Message):
    __slots__ = ("worker_address", "transfer_address", "current_tasks", "worker_uid", "task_loads", "current_snapshot_chunks", "worker_tags")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TASKS_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    TASK_LOADS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_SNAPSHOT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WORKER_TAGS_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    transfer_address: str
    current_tasks: _containers.RepeatedScalarFieldContainer[int]
    worker_uid: int
    task_loads: _containers.RepeatedCompositeFieldContainer[TaskLoad]
    current_snapshot_chunks: _containers.RepeatedCompositeFieldContainer[SnapshotChunkRef]
    worker_tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_address: _Optional[str] = ..., transfer_address: _Optional[str] = ..., current_tasks: _Optional[_Iterable[int]] = ..., worker_uid: _Optional[int] = ..., task_loads: _Optional[_Iterable[_Union[TaskLoad, _Mapping]]] = ..., current_snapshot_chunks: _Optional[_Iterable[_Union[SnapshotChunkRef, _Mapping]]] = ..., worker_tags: _Optional[_Iterable[str]] = ...) -> None: ...

class SnapshotChunkRef(_message.Message):
    __slots__ = ("path", "chunk_index")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    path: str
    chunk_index: int
    def __init__(self, path: _Optional[str] = ..., chunk_index: _Optional[int] = ...) -> None: ...

class TaskLoad(_message.Message):
    __slots__ = ("task_id", "elements_produced", "bytes_produced", "processing_seconds")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    BYTES_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    elements_produced: int
    bytes_produced: int
    processing_seconds: float
    def __init__(self, task_id: _Optional[int] = ..., elements_produced: _Optional[int] = ..., bytes_produced: _Optional[int] = ..., processing_seconds: _Optional[float] = ...) -> None: ...

class WorkerHeartbeatResponse(_message.Message):
    __slots__ = ("new_tasks", "tasks_to_delete", "snapshot_chunks", "snapshot_chunks_to_drop")
    NEW_TASKS_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_DELETE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CHUNKS_TO_DROP_FIELD_NUMBER: _ClassVar[int]
    new_tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskDef]
    tasks_to_delete: _containers.RepeatedScalarFieldContainer[int]
    snapshot_chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotChunkDef]
    snapshot_chunks_to_drop: _containers.RepeatedCompositeFieldContainer[SnapshotChunkRef]
    def __init__(self, new_tasks: _Optional[_Iterable[_Union[_common_pb2.TaskDef, _Mapping]]] = ..., tasks_to_delete: _Optional[_Iterable[int]] = ..., snapshot_chunks: _Optional[_Iterable[_Union[_common_pb2.SnapshotChunkDef, _Mapping]]] = ..., snapshot_chunks_to_drop: _Optional[_Iterable[_Union[SnapshotChunkRef, _Mapping]]] = ...) -> None: ...

class WorkerUpdateRequest(_message.Message):
    __slots__ = ("worker_address", "finished_tasks")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    finished_tasks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_address: _Optional[str] = ..., finished_tasks: _Optional[_Iterable[int]] = ...) -> None: ...

class WorkerUpdateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetDatasetDefRequest(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class GetDatasetDefResponse(_message.Message):
    __slots__ = ("graph_def", "metadata")
    GRAPH_DEF_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    graph_def: bytes
    metadata: _common_pb2.DatasetMetadata
    def __init__(self, graph_def: _Optional[bytes] = ..., metadata: _Optional[_Union[_common_pb2.DatasetMetadata, _Mapping]] = ...) -> None: ...

class GetSplitsRequest(_message.Message):
    __slots__ = ("iteration_id", "task_id", "split_group", "repetition", "max_splits", "index")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    MAX_SPLITS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    task_id: int
    split_group: int
    repetition: int
    max_splits: int
    index: int
    def __init__(self, iteration_id: _Optional[int] = ..., task_id: _Optional[int] = ..., split_group: _Optional[int] = ..., repetition: _Optional[int] = ..., max_splits: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class GetSplitsResponse(_message.Message):
    __slots__ = ("begin", "end", "end_of_splits")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPLITS_FIELD_NUMBER: _ClassVar[int]
    begin: int
    end: int
    end_of_splits: bool
    def __init__(self, begin: _Optional[int] = ..., end: _Optional[int] = ..., end_of_splits: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("status_json",)
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    status_json: str
    def __init__(self, status_json: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("dataset_id", "path", "metadata")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    path: str
    metadata: bytes
    def __init__(self, dataset_id: _Optional[str] = ..., path: _Optional[str] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommitSnapshotChunkRequest(_message.Message):
    __slots__ = ("worker_address", "path", "chunk_index", "uncommitted_file", "num_records", "error_code", "error_message")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    UNCOMMITTED_FILE_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    path: str
    chunk_index: int
    uncommitted_file: str
    num_records: int
    error_code: int
    error_message: str
    def __init__(self, worker_address: _Optional[str] = ..., path: _Optional[str] = ..., chunk_index: _Optional[int] = ..., uncommitted_file: _Optional[str] = ..., num_records: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class CommitSnapshotChunkResponse(_message.Message):
    __slots__ = ("committed", "next_chunks")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    next_chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotChunkDef]
    def __init__(self, committed: _Optional[bool] = ..., next_chunks: _Optional[_Iterable[_Union[_common_pb2.SnapshotChunkDef, _Mapping]]] = ...) -> None: ...
