from dataservice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Update(_message.Message):
    __slots__ = ("register_dataset", "register_worker", "create_job", "create_iteration", "create_task", "finish_task", "acquire_iteration_client", "release_iteration_client", "finish_iteration", "produce_splits", "reserve_ids", "start_splits", "return_splits", "remove_worker", "extend_rounds", "start_snapshot", "commit_snapshot_chunk", "finish_snapshot", "drop_iteration")
    REGISTER_DATASET_FIELD_NUMBER: _ClassVar[int]
    REGISTER_WORKER_FIELD_NUMBER: _ClassVar[int]
    CREATE_JOB_FIELD_NUMBER: _ClassVar[int]
    CREATE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TASK_FIELD_NUMBER: _ClassVar[int]
    FINISH_TASK_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_ITERATION_CLIENT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ITERATION_CLIENT_FIELD_NUMBER: _ClassVar[int]
    FINISH_ITERATION_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_SPLITS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_IDS_FIELD_NUMBER: _ClassVar[int]
    START_SPLITS_FIELD_NUMBER: _ClassVar[int]
    RETURN_SPLITS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_WORKER_FIELD_NUMBER: _ClassVar[int]
    EXTEND_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    START_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SNAPSHOT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINISH_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DROP_ITERATION_FIELD_NUMBER: _ClassVar[int]
    register_dataset: RegisterDatasetUpdate
    register_worker: RegisterWorkerUpdate
    create_job: CreateJobUpdate
    create_iteration: CreateIterationUpdate
    create_task: CreateTaskUpdate
    finish_task: FinishTaskUpdate
    acquire_iteration_client: AcquireIterationClientUpdate
    release_iteration_client: ReleaseIterationClientUpdate
    finish_iteration: FinishIterationUpdate
    produce_splits: ProduceSplitsUpdate
    reserve_ids: ReserveIdsUpdate
    start_splits: StartSplitsUpdate
    return_splits: ReturnSplitsUpdate
    remove_worker: RemoveWorkerUpdate
    extend_rounds: ExtendRoundsUpdate
    start_snapshot: StartSnapshotUpdate
    commit_snapshot_chunk: CommitSnapshotChunkUpdate
    finish_snapshot: FinishSnapshotUpdate
    drop_iteration: DropIterationUpdate
    def __init__(self, register_dataset: _Optional[_Union[RegisterDatasetUpdate, _Mapping]] = ..., register_worker: _Optional[_Union[RegisterWorkerUpdate, _Mapping]] = ..., create_job: _Optional[_Union[CreateJobUpdate, _Mapping]] = ..., create_iteration: _Optional[_Union[CreateIterationUpdate, _Mapping]] = ..., create_task: _Optional[_Union[CreateTaskUpdate, _Mapping]] = ..., finish_task: _Optional[_Union[FinishTaskUpdate, _Mapping]] = ..., acquire_iteration_client: _Optional[_Union[AcquireIterationClientUpdate, _Mapping]] = ..., release_iteration_client: _Optional[_Union[ReleaseIterationClientUpdate, _Mapping]] = ..., finish_iteration: _Optional[_Union[FinishIterationUpdate, _Mapping]] = ..., produce_splits: _Optional[_Union[ProduceSplitsUpdate, _Mapping]] = ..., reserve_ids: _Optional[_Union[ReserveIdsUpdate, _Mapping]] = ..., start_splits: _Optional[_Union[StartSplitsUpdate, _Mapping]] = ..., return_splits: _Optional[_Union[ReturnSplitsUpdate, _Mapping]] = ..., remove_worker: _Optional[_Union[RemoveWorkerUpdate, _Mapping]] = ..., extend_rounds: _Optional[_Union[ExtendRoundsUpdate, _Mapping]] = ..., start_snapshot: _Optional[_Union[StartSnapshotUpdate, _Mapping]] = ..., commit_snapshot_chunk: _Optional[_Union[CommitSnapshotChunkUpdate, _Mapping]] = ..., finish_snapshot: _Optional[_Union[FinishSnapshotUpdate, _Mapping]] = ..., drop_iteration: _Optional[_Union[DropIterationUpdate, _Mapping]] = ...) -> None: ...

class RegisterDatasetUpdate(_message.Message):
    __slots__ = ("dataset_id", "fingerprint", "metadata")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    fingerprint: str
    metadata: _common_pb2.DatasetMetadata
    def __init__(self, dataset_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., metadata: _Optional[_Union[_common_pb2.DatasetMetadata, _Mapping]] = ...) -> None: ...

class RegisterWorkerUpdate(_message.Message):
    __slots__ = ("worker_address", "transfer_address", "worker_uid", "worker_tags")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    WORKER_TAGS_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    transfer_address: str
    worker_uid: int
    worker_tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_address: _Optional[str] = ..., transfer_address: _Optional[str] = ..., worker_uid: _Optional[int] = ..., worker_tags: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateJobUpdate(_message.Message):
    __slots__ = ("job_id", "dataset_id", "processing_mode", "job_name", "num_consumers", "target_workers", "split_group_sizes", "use_cross_trainer_cache")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_MODE_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_GROUP_SIZES_FIELD_NUMBER: _ClassVar[int]
    USE_CROSS_TRAINER_CACHE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    dataset_id: str
    processing_mode: _common_pb2.ProcessingModeDef
    job_name: str
    num_consumers: int
    target_workers: _common_pb2.TargetWorkers
    split_group_sizes: _containers.RepeatedScalarFieldContainer[int]
    use_cross_trainer_cache: bool
    def __init__(self, job_id: _Optional[int] = ..., dataset_id: _Optional[str] = ..., processing_mode: _Optional[_Union[_common_pb2.ProcessingModeDef, _Mapping]] = ..., job_name: _Optional[str] = ..., num_consumers: _Optional[int] = ..., target_workers: _Optional[_Union[_common_pb2.TargetWorkers, str]] = ..., split_group_sizes: _Optional[_Iterable[int]] = ..., use_cross_trainer_cache: _Optional[bool] = ...) -> None: ...

class CreateIterationUpdate(_message.Message):
    __slots__ = ("iteration_id", "job_id", "repetition", "resumes_iteration_id", "read_key")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    RESUMES_ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    job_id: int
    repetition: int
    resumes_iteration_id: int
    read_key: str
    def __init__(self, iteration_id: _Optional[int] = ..., job_id: _Optional[int] = ..., repetition: _Optional[int] = ..., resumes_iteration_id: _Optional[int] = ..., read_key: _Optional[str] = ...) -> None: ...

class SplitRange(_message.Message):
    __slots__ = ("split_group", "repetition", "begin", "end")
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    split_group: int
    repetition: int
    begin: int
    end: int
    def __init__(self, split_group: _Optional[int] = ..., repetition: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class CreateTaskUpdate(_message.Message):
    __slots__ = ("task_id", "iteration_id", "worker_address", "starting_round", "skip_elements", "replay")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTING_ROUND_FIELD_NUMBER: _ClassVar[int]
    SKIP_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    iteration_id: int
    worker_address: str
    starting_round: int
    skip_elements: int
    replay: _containers.RepeatedCompositeFieldContainer[SplitRange]
    def __init__(self, task_id: _Optional[int] = ..., iteration_id: _Optional[int] = ..., worker_address: _Optional[str] = ..., starting_round: _Optional[int] = ..., skip_elements: _Optional[int] = ..., replay: _Optional[_Iterable[_Union[SplitRange, _Mapping]]] = ...) -> None: ...

class FinishTaskUpdate(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    def __init__(self, task_id: _Optional[int] = ...) -> None: ...

class AcquireIterationClientUpdate(_message.Message):
    __slots__ = ("iteration_client_id", "iteration_id")
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    iteration_id: int
    def __init__(self, iteration_client_id: _Optional[int] = ..., iteration_id: _Optional[int] = ...) -> None: ...

class ReleaseIterationClientUpdate(_message.Message):
    __slots__ = ("iteration_client_id",)
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    iteration_client_id: int
    def __init__(self, iteration_client_id: _Optional[int] = ...) -> None: ...

class FinishIterationUpdate(_message.Message):
    __slots__ = ("iteration_id",)
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    def __init__(self, iteration_id: _Optional[int] = ...) -> None: ...

class DropIterationUpdate(_message.Message):
    __slots__ = ("iteration_id",)
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    def __init__(self, iteration_id: _Optional[int] = ...) -> None: ...

class ProduceSplitsUpdate(_message.Message):
    __slots__ = ("iteration_id", "split_group", "repetition", "begin", "end", "task_id", "index", "from_pool", "replayed")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FROM_POOL_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    split_group: int
    repetition: int
    begin: int
    end: int
    task_id: int
    index: int
    from_pool: bool
    replayed: bool
    def __init__(self, iteration_id: _Optional[int] = ..., split_group: _Optional[int] = ..., repetition: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ..., task_id: _Optional[int] = ..., index: _Optional[int] = ..., from_pool: _Optional[bool] = ..., replayed: _Optional[bool] = ...) -> None: ...

class StartSplitsUpdate(_message.Message):
    __slots__ = ("iteration_id", "task_id", "split_group", "repetition", "index")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    task_id: int
    split_group: int
    repetition: int
    index: int
    def __init__(self, iteration_id: _Optional[int] = ..., task_id: _Optional[int] = ..., split_group: _Optional[int] = ..., repetition: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class ReturnSplitsUpdate(_message.Message):
    __slots__ = ("iteration_id", "split_group", "repetition", "begin", "end")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    split_group: int
    repetition: int
    begin: int
    end: int
    def __init__(self, iteration_id: _Optional[int] = ..., split_group: _Optional[int] = ..., repetition: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class RemoveWorkerUpdate(_message.Message):
    __slots__ = ("worker_address", "lost_tasks")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOST_TASKS_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    lost_tasks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_address: _Optional[str] = ..., lost_tasks: _Optional[_Iterable[int]] = ...) -> None: ...

class ReserveIdsUpdate(_message.Message):
    __slots__ = ("next_dataset_id", "next_job_id", "next_iteration_id", "next_task_id", "next_client_id")
    NEXT_DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    next_dataset_id: int
    next_job_id: int
    next_iteration_id: int
    next_task_id: int
    next_client_id: int
    def __init__(self, next_dataset_id: _Optional[int] = ..., next_job_id: _Optional[int] = ..., next_iteration_id: _Optional[int] = ..., next_task_id: _Optional[int] = ..., next_client_id: _Optional[int] = ...) -> None: ...

class ExtendRoundsUpdate(_message.Message):
    __slots__ = ("iteration_id", "round_limit")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    round_limit: int
    def __init__(self, iteration_id: _Optional[int] = ..., round_limit: _Optional[int] = ...) -> None: ...

class StartSnapshotUpdate(_message.Message):
    __slots__ = ("path", "dataset_id", "compression", "group_sizes", "num_chunks")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    path: str
    dataset_id: str
    compression: str
    group_sizes: _containers.RepeatedScalarFieldContainer[int]
    num_chunks: int
    def __init__(self, path: _Optional[str] = ..., dataset_id: _Optional[str] = ..., compression: _Optional[str] = ..., group_sizes: _Optional[_Iterable[int]] = ..., num_chunks: _Optional[int] = ...) -> None: ...

class CommitSnapshotChunkUpdate(_message.Message):
    __slots__ = ("path", "chunk_index", "num_records", "uncommitted_file")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    UNCOMMITTED_FILE_FIELD_NUMBER: _ClassVar[int]
    path: str
    chunk_index: int
    num_records: int
    uncommitted_file: str
    def __init__(self, path: _Optional[str] = ..., chunk_index: _Optional[int] = ..., num_records: _Optional[int] = ..., uncommitted_file: _Optional[str] = ...) -> None: ...

class FinishSnapshotUpdate(_message.Message):
    __slots__ = ("path", "error_code", "error_message")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    path: str
    error_code: int
    error_message: str
    def __init__(self, path: _Optional[str] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...
