from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardingPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARDING_POLICY_OFF: _ClassVar[ShardingPolicy]
    SHARDING_POLICY_DYNAMIC: _ClassVar[ShardingPolicy]
    SHARDING_POLICY_FILE: _ClassVar[ShardingPolicy]
    SHARDING_POLICY_DATA: _ClassVar[ShardingPolicy]
    SHARDING_POLICY_FILE_OR_DATA: _ClassVar[ShardingPolicy]
    SHARDING_POLICY_HINT: _ClassVar[ShardingPolicy]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_AUTO: _ClassVar[Compression]
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_LZ4: _ClassVar[Compression]
    COMPRESSION_SNAPPY: _ClassVar[Compression]

class TargetWorkers(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_WORKERS_AUTO: _ClassVar[TargetWorkers]
    TARGET_WORKERS_ANY: _ClassVar[TargetWorkers]
    TARGET_WORKERS_LOCAL: _ClassVar[TargetWorkers]
SHARDING_POLICY_OFF: ShardingPolicy
SHARDING_POLICY_DYNAMIC: ShardingPolicy
SHARDING_POLICY_FILE: ShardingPolicy
SHARDING_POLICY_DATA: ShardingPolicy
SHARDING_POLICY_FILE_OR_DATA: ShardingPolicy
SHARDING_POLICY_HINT: ShardingPolicy
COMPRESSION_AUTO: Compression
COMPRESSION_NONE: Compression
COMPRESSION_LZ4: Compression
COMPRESSION_SNAPPY: Compression
TARGET_WORKERS_AUTO: TargetWorkers
TARGET_WORKERS_ANY: TargetWorkers
TARGET_WORKERS_LOCAL: TargetWorkers

class ProcessingModeDef(_message.Message):
    __slots__ = ("sharding_policy",)
    SHARDING_POLICY_FIELD_NUMBER: _ClassVar[int]
    sharding_policy: ShardingPolicy
    def __init__(self, sharding_policy: _Optional[_Union[ShardingPolicy, str]] = ...) -> None: ...

class DatasetMetadata(_message.Message):
    __slots__ = ("element_spec", "compression", "cardinality")
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CARDINALITY_FIELD_NUMBER: _ClassVar[int]
    element_spec: bytes
    compression: Compression
    cardinality: int
    def __init__(self, element_spec: _Optional[bytes] = ..., compression: _Optional[_Union[Compression, str]] = ..., cardinality: _Optional[int] = ...) -> None: ...

class ElementLayout(_message.Message):
    __slots__ = ("components", "structure")
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURE_FIELD_NUMBER: _ClassVar[int]
    components: _containers.RepeatedCompositeFieldContainer[ComponentLayout]
    structure: StructureNode
    def __init__(self, components: _Optional[_Iterable[_Union[ComponentLayout, _Mapping]]] = ..., structure: _Optional[_Union[StructureNode, _Mapping]] = ...) -> None: ...

class ComponentLayout(_message.Message):
    __slots__ = ("dtype", "shape", "unknown_rank")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_RANK_FIELD_NUMBER: _ClassVar[int]
    dtype: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    unknown_rank: bool
    def __init__(self, dtype: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., unknown_rank: _Optional[bool] = ...) -> None: ...

class StructureNode(_message.Message):
    __slots__ = ("tensor", "sequence", "dict", "ragged", "sparse", "none")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    RAGGED_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    tensor: int
    sequence: StructureSequence
    dict: StructureDict
    ragged: RaggedNode
    sparse: int
    none: bool
    def __init__(self, tensor: _Optional[int] = ..., sequence: _Optional[_Union[StructureSequence, _Mapping]] = ..., dict: _Optional[_Union[StructureDict, _Mapping]] = ..., ragged: _Optional[_Union[RaggedNode, _Mapping]] = ..., sparse: _Optional[int] = ..., none: _Optional[bool] = ...) -> None: ...

class StructureSequence(_message.Message):
    __slots__ = ("kind", "items", "name", "fields")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_TUPLE: _ClassVar[StructureSequence.Kind]
        KIND_LIST: _ClassVar[StructureSequence.Kind]
        KIND_NAMEDTUPLE: _ClassVar[StructureSequence.Kind]
    KIND_TUPLE: StructureSequence.Kind
    KIND_LIST: StructureSequence.Kind
    KIND_NAMEDTUPLE: StructureSequence.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    kind: StructureSequence.Kind
    items: _containers.RepeatedCompositeFieldContainer[StructureNode]
    name: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[StructureSequence.Kind, str]] = ..., items: _Optional[_Iterable[_Union[StructureNode, _Mapping]]] = ..., name: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class StructureDict(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedCompositeFieldContainer[StructureNode]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[_Union[StructureNode, _Mapping]]] = ...) -> None: ...

class RaggedNode(_message.Message):
    __slots__ = ("first_component", "ragged_rank")
    FIRST_COMPONENT_FIELD_NUMBER: _ClassVar[int]
    RAGGED_RANK_FIELD_NUMBER: _ClassVar[int]
    first_component: int
    ragged_rank: int
    def __init__(self, first_component: _Optional[int] = ..., ragged_rank: _Optional[int] = ...) -> None: ...

class TaskDef(_message.Message):
    __slots__ = ("task_id", "iteration_id", "job_id", "dataset_id", "processing_mode", "worker_address", "worker_index", "num_workers", "num_consumers", "starting_round", "skip_elements", "repetition", "use_cross_trainer_cache", "seconds_per_element", "read_key")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_MODE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    STARTING_ROUND_FIELD_NUMBER: _ClassVar[int]
    SKIP_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    USE_CROSS_TRAINER_CACHE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    iteration_id: int
    job_id: int
    dataset_id: str
    processing_mode: ProcessingModeDef
    worker_address: str
    worker_index: int
    num_workers: int
    num_consumers: int
    starting_round: int
    skip_elements: int
    repetition: int
    use_cross_trainer_cache: bool
    seconds_per_element: float
    read_key: str
    def __init__(self, task_id: _Optional[int] = ..., iteration_id: _Optional[int] = ..., job_id: _Optional[int] = ..., dataset_id: _Optional[str] = ..., processing_mode: _Optional[_Union[ProcessingModeDef, _Mapping]] = ..., worker_address: _Optional[str] = ..., worker_index: _Optional[int] = ..., num_workers: _Optional[int] = ..., num_consumers: _Optional[int] = ..., starting_round: _Optional[int] = ..., skip_elements: _Optional[int] = ..., repetition: _Optional[int] = ..., use_cross_trainer_cache: _Optional[bool] = ..., seconds_per_element: _Optional[float] = ..., read_key: _Optional[str] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task_id", "worker_address", "transfer_address", "finished", "starting_round", "lost", "worker_tags")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STARTING_ROUND_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    WORKER_TAGS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    worker_address: str
    transfer_address: str
    finished: bool
    starting_round: int
    lost: bool
    worker_tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_id: _Optional[int] = ..., worker_address: _Optional[str] = ..., transfer_address: _Optional[str] = ..., finished: _Optional[bool] = ..., starting_round: _Optional[int] = ..., lost: _Optional[bool] = ..., worker_tags: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorData(_message.Message):
    __slots__ = ("dtype", "shape", "compression", "uncompressed_size", "size", "lengths_size", "shapes_size")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHAPES_SIZE_FIELD_NUMBER: _ClassVar[int]
    dtype: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    compression: Compression
    uncompressed_size: int
    size: int
    lengths_size: int
    shapes_size: int
    def __init__(self, dtype: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., compression: _Optional[_Union[Compression, str]] = ..., uncompressed_size: _Optional[int] = ..., size: _Optional[int] = ..., lengths_size: _Optional[int] = ..., shapes_size: _Optional[int] = ...) -> None: ...

class ElementChunk(_message.Message):
    __slots__ = ("num_elements", "components")
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    num_elements: int
    components: _containers.RepeatedCompositeFieldContainer[TensorData]
    def __init__(self, num_elements: _Optional[int] = ..., components: _Optional[_Iterable[_Union[TensorData, _Mapping]]] = ...) -> None: ...

class SnapshotChunkDef(_message.Message):
    __slots__ = ("path", "dataset_id", "chunk_index", "ranges", "compression")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    dataset_id: str
    chunk_index: int
    ranges: _containers.RepeatedCompositeFieldContainer[SnapshotRange]
    compression: str
    def __init__(self, path: _Optional[str] = ..., dataset_id: _Optional[str] = ..., chunk_index: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[SnapshotRange, _Mapping]]] = ..., compression: _Optional[str] = ...) -> None: ...

class SnapshotRange(_message.Message):
    __slots__ = ("split_group", "begin", "end")
    SPLIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    split_group: int
    begin: int
    end: int
    def __init__(self, split_group: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...
