from dataservice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrepareDatasetRequest(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class PrepareDatasetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProcessTaskRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _common_pb2.TaskDef
    def __init__(self, task: _Optional[_Union[_common_pb2.TaskDef, _Mapping]] = ...) -> None: ...

class ProcessTaskResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamElementsRequest(_message.Message):
    __slots__ = ("task_id", "iteration_client_id", "max_elements_per_message", "credits", "compression", "auth_token", "trainer_id", "shared_memory_bytes", "released_regions", "received", "read_key")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ELEMENTS_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    iteration_client_id: int
    max_elements_per_message: int
    credits: int
    compression: _common_pb2.Compression
    auth_token: str
    trainer_id: str
    shared_memory_bytes: int
    released_regions: _containers.RepeatedScalarFieldContainer[int]
    received: int
    read_key: str
    def __init__(self, task_id: _Optional[int] = ..., iteration_client_id: _Optional[int] = ..., max_elements_per_message: _Optional[int] = ..., credits: _Optional[int] = ..., compression: _Optional[_Union[_common_pb2.Compression, str]] = ..., auth_token: _Optional[str] = ..., trainer_id: _Optional[str] = ..., shared_memory_bytes: _Optional[int] = ..., released_regions: _Optional[_Iterable[int]] = ..., received: _Optional[int] = ..., read_key: _Optional[str] = ...) -> None: ...

class StreamElementsResponse(_message.Message):
    __slots__ = ("chunks", "end_of_sequence", "error_code", "error_message", "ring_bytes", "region_offset", "region_size", "first_element", "acknowledge", "receipt")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    END_OF_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RING_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGION_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REGION_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.ElementChunk]
    end_of_sequence: bool
    error_code: int
    error_message: str
    ring_bytes: int
    region_offset: int
    region_size: int
    first_element: int
    acknowledge: bool
    receipt: str
    def __init__(self, chunks: _Optional[_Iterable[_Union[_common_pb2.ElementChunk, _Mapping]]] = ..., end_of_sequence: _Optional[bool] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., ring_bytes: _Optional[int] = ..., region_offset: _Optional[int] = ..., region_size: _Optional[int] = ..., first_element: _Optional[int] = ..., acknowledge: _Optional[bool] = ..., receipt: _Optional[str] = ...) -> None: ...

class GetElementRequest(_message.Message):
    __slots__ = ("task_id", "iteration_client_id", "consumer_index", "round", "compression", "read_key")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    READ_KEY_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    iteration_client_id: int
    consumer_index: int
    round: int
    compression: _common_pb2.Compression
    read_key: str
    def __init__(self, task_id: _Optional[int] = ..., iteration_client_id: _Optional[int] = ..., consumer_index: _Optional[int] = ..., round: _Optional[int] = ..., compression: _Optional[_Union[_common_pb2.Compression, str]] = ..., read_key: _Optional[str] = ...) -> None: ...

class GetElementResponse(_message.Message):
    __slots__ = ("chunk", "end_of_sequence", "not_ready")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_OF_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.ElementChunk
    end_of_sequence: bool
    not_ready: bool
    def __init__(self, chunk: _Optional[_Union[_common_pb2.ElementChunk, _Mapping]] = ..., end_of_sequence: _Optional[bool] = ..., not_ready: _Optional[bool] = ...) -> None: ...
