"""distribute(), register_dataset() and from_dataset_id(), argument for argument
those of tf.data.experimental.service.

Arguments are checked here, before any RPC. The dataset a client gets back
is an ordinary tf.data.Dataset: IterationReader chunks handed to tf.data one
call per chunk, which rebuilds the elements in its own graph
(saveable_stream.py, chunk_layout.py).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import tensorflow as tf

from dataservice import modes, tf_internal
from dataservice.client.chunk_layout import ChunkLayout
from dataservice.client.coordinated_reader import CoordinatedReader
from dataservice.client.read_options import LARGE_ELEMENT_BYTES, MERGE_BYTES, MERGE_ELEMENTS, ReadOptions, timeout_s
from dataservice.client.reader import IterationReader
from dataservice.client.saveable_stream import SaveableStream
from dataservice.client.session import JobSpec
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import splits
from dataservice.rpc import addresses
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.tf_errors import raising_tf_errors
from dataservice.transfer import allocator
from dataservice.transfer.chunk import element_at
from dataservice.transfer.element_codec import ElementCodec
from dataservice.v1 import common_pb2

Service = str | tuple[str, str]
DatasetId: TypeAlias = str | bytes | int | tf.Tensor


# Called inside a tf.function, these run as Python: AutoGraph would otherwise try to convert the
# gRPC calls under them.
_not_converted = tf.autograph.experimental.do_not_convert


def service_target(service: Any) -> addresses.Target:
    """The dispatcher of a `service` argument, which may also be a string tensor or a
    (protocol, address) pair of them (as register_dataset is called inside a tf.function): their
    values are taken now (tf_internal.value_now)."""
    if isinstance(service, tuple | list):
        service = tuple(_tensor_str(part) for part in service)
    else:
        service = _tensor_str(service)
    return addresses.parse_service(service)


def _scalar_now(tensor: tf.Tensor) -> Any:
    """A scalar tensor's value now as a Python value (in graph mode, a constant of the graph
    being built, such as register_dataset's result: tf_internal.value_now)."""
    value = tf_internal.value_now(tensor)
    return value.item() if isinstance(value, np.ndarray | np.generic) else value


def _tensor_str(value: Any) -> Any:
    """A string tensor's value as str; anything else as it is."""
    if not isinstance(value, tf.Tensor) or value.dtype != tf.string:
        return value
    value = _scalar_now(value)
    return value.decode() if isinstance(value, bytes) else value


def _dataset_id_str(dataset_id: DatasetId) -> str:
    if isinstance(dataset_id, tf.Tensor):
        dataset_id = _scalar_now(dataset_id)
    if isinstance(dataset_id, bytes):
        dataset_id = dataset_id.decode()
    if isinstance(dataset_id, int) and not isinstance(dataset_id, bool):
        dataset_id = str(dataset_id)
    if not isinstance(dataset_id, str) or not dataset_id:
        raise ValueError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    return dataset_id


def _cardinality(dataset: tf.data.Dataset) -> int:
    """The dataset's cardinality as readers are told it. tf.data counts choose_from_datasets over
    inputs repeated for ever infinite, though its choices end it: unknown here, so that a read of it
    is not asserted infinite (it would end in FailedPreconditionError) and distributed_save takes it."""
    cardinality = tf_internal.dataset_cardinality(dataset)
    if cardinality == tf.data.INFINITE_CARDINALITY and tf_internal.has_finite_selector(dataset):
        return tf.data.UNKNOWN_CARDINALITY
    return cardinality


def register_pipeline(
    target: addresses.Target,
    dataset: tf.data.Dataset,
    compression: str | None,
    requested: str,
    timeout_s: float,
    splittable: bool = False,
    prepare_workers: bool = False,
    cardinality: int | None = None,
) -> str:
    """Checks the pipeline (splittable: also for distributed_epoch), serializing it once, and registers it.
    `prepare_workers`: it is about to be read whole on every worker, which can prepare it.
    `cardinality`: _cardinality(dataset), where the caller has it already."""
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    metadata = common_pb2.DatasetMetadata(
        element_spec=graph_lib.encode_element_spec(dataset.element_spec),
        compression=modes.parse_compression(compression),
        cardinality=_cardinality(dataset) if cardinality is None else cardinality,
    )
    graph_lib.check_element_spec(dataset.element_spec)
    graph_bytes = graph_lib.serialize_dataset(dataset)
    graph = graph_lib.parse_graph(graph_bytes)
    if splittable:
        # Refuse an unsplittable pipeline here, not at the first element.
        splits.find_sources(graph)
    with DispatcherClient(target.address, timeout_s, shared=True, tls=target.tls) as dispatcher:
        return dispatcher.register_dataset(graph_bytes, metadata, requested, prepare_workers)


@_not_converted
@raising_tf_errors
def register_dataset(
    service: Service,
    dataset: tf.data.Dataset,
    compression: str | None = "AUTO",
    dataset_id: DatasetId | None = None,
    *,
    dispatcher_timeout_ms: int | None = None,
) -> tf.Tensor:
    """Registers `dataset` with the dispatcher and returns its id (a scalar string tensor).

    The same pipeline registered twice gets the same id; a requested
    `dataset_id` is used as given.
    """
    target = service_target(service)
    # An empty id, as None, asks the dispatcher for one (as TensorFlow's).
    requested = "" if dataset_id is None or dataset_id in ("", b"") else _dataset_id_str(dataset_id)
    return tf.constant(register_pipeline(target, dataset, compression, requested, timeout_s(dispatcher_timeout_ms)))


def _service_dataset(
    target: addresses.Target,
    dataset_id: str,
    element_spec: Any,
    cardinality: int,
    options: ReadOptions,
    compression: common_pb2.Compression,
) -> tf.data.Dataset:
    graph_lib.check_element_spec(element_spec)
    options.check_cardinality(cardinality)
    codec = ElementCodec(element_spec)
    job = JobSpec(
        dataset_id,
        modes.wire_sharding_policy(options.sharding_policy),
        options.job_name,
        options.num_consumers,
        options.target_workers,
        options.trainer_id,
    )
    budget = options.element_budget(codec)

    def before_first() -> None:
        if codec.element_bytes >= LARGE_ELEMENT_BYTES:
            allocator.keep_freed_memory_in_client()

    if options.num_consumers is None:
        # Uncoordinated reads: an iterator that tf.train.Checkpoint can save (saveable_stream.py).
        def open_reader(repetition: int, resume_from) -> IterationReader:
            return IterationReader(
                target.address,
                job,
                repetition,
                codec,
                budget,
                options.timeout_s,
                compression,
                options.data_transfer_protocol,
                tls=target.tls,
                resume_from=resume_from,
                stream_timeout_s=options.stream_timeout_s,
            )

        dataset = SaveableStream(ChunkLayout(codec), open_reader, (MERGE_ELEMENTS, MERGE_BYTES), before_first).dataset()
    else:
        dataset = _coordinated_dataset(target, job, codec, options, compression, element_spec)
    if cardinality == tf.data.INFINITE_CARDINALITY:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    _SERVICE_DATASETS.add(dataset)
    return dataset


# The datasets this module made to read the service: a pipeline built on one cannot be split.
_SERVICE_DATASETS: weakref.WeakSet[tf.data.Dataset] = weakref.WeakSet()


def _check_not_read_from_a_service(dataset: tf.data.Dataset) -> None:
    """distributed_epoch splits a pipeline's sources; one that reads the service has none to split.
    UnimplementedError, as TensorFlow's service raises."""
    if any(d in _SERVICE_DATASETS for d in tf_internal.dataset_and_inputs(dataset)):
        raise tf.errors.UnimplementedError(
            None,
            None,
            "Cannot create split providers for dataset of type DataServiceDataset: distributed_epoch cannot "
            "split a pipeline that reads a tf.data service; use processing_mode='parallel_epochs'",
        )


def _coordinated_dataset(
    target: addresses.Target,
    job: JobSpec,
    codec: ElementCodec,
    options: ReadOptions,
    compression: common_pb2.Compression,
    element_spec: Any,
) -> tf.data.Dataset:
    """Coordinated reads (consumer_index, num_consumers): a generator over the rounds, which
    tf.data cannot save in a checkpoint (as TensorFlow's). Each round gives this consumer one
    element. The generator yields batches of one element, or of none when a wait for a round
    came back empty (CoordinatedReader.rounds), unbatched behind a prefetch: tf.data's prefetch
    thread returns between generator calls, so destroying an iterator (a trainer that stops
    reading) does not wait for a round the other consumers will never ask for."""
    # Composite components (ragged, sparse) are rebuilt inside tf.data; plain tensors are
    # yielded in the element's own structure.
    composite = not codec.plain
    specs = tuple(codec.component_specs) if composite else element_spec
    flat_specs = tf.nest.flatten(specs)
    nothing_yet = [np.zeros([0, *_known_dims(spec.shape)], spec.dtype.as_numpy_dtype) for spec in flat_specs]

    def structure(components: list) -> Any:
        return tuple(components) if composite else tf.nest.pack_sequence_as(element_spec, components)

    # Each pass over the dataset is the next repetition: a new iteration of the named job.
    repetitions = itertools.count()

    def generate():
        reader = CoordinatedReader(
            target.address,
            job,
            next(repetitions),
            codec,
            options.consumer_index,
            options.timeout_s,
            compression,
            tls=target.tls,
            stream_timeout_s=options.stream_timeout_s,
        )
        try:
            for chunk in reader.rounds():
                if chunk is None:
                    yield structure(nothing_yet)
                    continue
                for i in range(chunk.num_elements):
                    yield structure([component[np.newaxis] for component in element_at(chunk, i)])
        finally:
            reader.close()

    # Types and shapes rather than output_signature: TensorFlow then calls the generator through
    # numpy_function with light checks, instead of eager_py_func and a conversion of every value
    # to an eager tensor (see _from_generator in TensorFlow; README, "Figures behind the defaults").
    with tf_internal.deprecation_warnings_silenced():
        dataset = tf.data.Dataset.from_generator(
            generate,
            output_types=tf.nest.map_structure(lambda spec: spec.dtype, specs),
            output_shapes=tf.nest.map_structure(lambda spec: tf.TensorShape([None]).concatenate(spec.shape), specs),
        )
    dataset = _on_a_thread_of_its_own(dataset.prefetch(1).unbatch())
    if composite:
        dataset = dataset.map(
            lambda *components: tf.nest.pack_sequence_as(element_spec, list(components), expand_composites=True)
        )
    return dataset


def _known_dims(shape: tf.TensorShape) -> list[int]:
    """The dimensions of an empty value of `shape` (unknown ones 0; none for an unknown rank)."""
    return [] if shape.rank is None else [d or 0 for d in shape.as_list()]


def _on_a_thread_of_its_own(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset run on a private thread of its own. A consumer's generator blocks until every
    consumer has asked for the round; run as tf.data runs functions, on the process's shared
    pool (as many threads as cores), consumers read side by side (an interleave over them, as
    trainers write) would hold every thread of the pool while the rest of the round waits for
    one: a deadlock with more consumers than cores."""
    variant = tf.raw_ops.PrivateThreadPoolDataset(
        input_dataset=tf_internal.variant_tensor(dataset),
        num_threads=1,
        output_types=tf_internal.flat_tensor_types(dataset.element_spec),
        output_shapes=tf_internal.flat_tensor_shapes(dataset.element_spec),
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


@_not_converted
@raising_tf_errors
def from_dataset_id(
    processing_mode: str | modes.ShardingPolicy,
    service: Service,
    dataset_id: DatasetId,
    element_spec: Any = None,
    job_name: str | None = None,
    consumer_index: int | None = None,
    num_consumers: int | None = None,
    max_outstanding_requests: int | None = None,
    data_transfer_protocol: str | None = None,
    cross_trainer_cache: Any = None,
    target_workers: str = "AUTO",
    *,
    dispatcher_timeout_ms: int | None = None,
    stream_timeout_ms: int | None = None,
) -> tf.data.Dataset:
    """A dataset reading the registered dataset `dataset_id` from the service.

    Without `element_spec` the spec is the one registered with the dataset; an
    unknown id fails here, with NotFoundError.
    """
    target = service_target(service)
    dataset_id = _dataset_id_str(dataset_id)
    options = ReadOptions(
        processing_mode,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        cross_trainer_cache,
        target_workers,
        dispatcher_timeout_ms,
        stream_timeout_ms,
    )
    # Asked even with an element_spec given: an unknown id fails here, with NotFoundError (an
    # error raised while reading reaches the user re-typed by tf.data's numpy_function).
    with DispatcherClient(target.address, options.timeout_s, shared=True, tls=target.tls) as dispatcher:
        metadata = dispatcher.get_data_service_metadata(dataset_id)
    if element_spec is None:
        element_spec = graph_lib.decode_element_spec(metadata.element_spec)
    cardinality = metadata.cardinality
    compression = metadata.compression
    return _service_dataset(target, dataset_id, element_spec, cardinality, options, compression)


@raising_tf_errors
def distribute(
    processing_mode: str | modes.ShardingPolicy,
    service: Service,
    job_name: str | None = None,
    consumer_index: int | None = None,
    num_consumers: int | None = None,
    max_outstanding_requests: int | None = None,
    data_transfer_protocol: str | None = None,
    compression: str | None = "AUTO",
    cross_trainer_cache: Any = None,
    target_workers: str = "AUTO",
    *,
    dispatcher_timeout_ms: int | None = None,
    stream_timeout_ms: int | None = None,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """A transformation for Dataset.apply that moves the dataset's processing to the service.

    Beyond TensorFlow's arguments: `dispatcher_timeout_ms`, how long calls to the dispatcher are
    retried; `stream_timeout_ms`, after how long without a message (workers send a keepalive
    every second) a worker's stream is taken for broken and connected again.

    >>> ds = tf.data.Dataset.range(10).apply(distribute("parallel_epochs", "grpc://localhost:5050"))
    """
    target = service_target(service)
    compression_enum = modes.parse_compression(compression)
    options = ReadOptions(
        processing_mode,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        cross_trainer_cache,
        target_workers,
        dispatcher_timeout_ms,
        stream_timeout_ms,
    )

    @_not_converted
    @raising_tf_errors
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if options.sharding_policy == modes.ShardingPolicy.DYNAMIC:
            _check_not_read_from_a_service(dataset)
        cardinality = _cardinality(dataset)
        options.check_cardinality(cardinality)
        dataset_id = register_pipeline(
            target,
            dataset,
            compression,
            "",
            options.timeout_s,
            splittable=options.sharding_policy == modes.ShardingPolicy.DYNAMIC,
            prepare_workers=options.sharding_policy == modes.ShardingPolicy.OFF,
            cardinality=cardinality,
        )
        return _service_dataset(target, dataset_id, dataset.element_spec, cardinality, options, compression_enum)

    return apply
