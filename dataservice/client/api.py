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
from dataservice.client.reader import IterationReader
from dataservice.client.saveable_stream import SaveableStream
from dataservice.client.session import JobSpec
from dataservice.config import DEFAULT_CLIENT_TIMEOUT_MS
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import splits
from dataservice.rpc import addresses
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import allocator
from dataservice.transfer.chunk import element_at
from dataservice.transfer.wire import ElementCodec
from dataservice.v1 import common_pb2

Service = str | tuple[str, str]
DatasetId: TypeAlias = str | bytes | int | tf.Tensor

# Without max_outstanding_requests, a client holds at most this many bytes of
# fixed-size elements (and at most MAX_DEFAULT_BUDGET of them), or
# DEFAULT_VARIABLE_BUDGET elements whose size is not known in advance.
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024
MAX_DEFAULT_BUDGET = 16384
DEFAULT_VARIABLE_BUDGET = 256
# Consumers of one named job share its elements, each taking what it asks for: one that held
# thousands would leave the others short while it sits on them (TensorFlow's client asks for a
# few at a time). So without max_outstanding_requests a reader of a shared job holds this many.
SHARED_JOB_BUDGET = 64
# Chunks that have arrived together are handed to tf.data as one, up to this many elements and
# bytes: joining them is a copy, and a call into Python per chunk costs more for small ones. A
# checkpoint holds the rest of the chunk being handed out.
MERGE_ELEMENTS = 1024
MERGE_BYTES = 1024 * 1024
# A client reading elements this large keeps freed memory for reuse (transfer/allocator.py).
LARGE_ELEMENT_BYTES = 256 * 1024


class CrossTrainerCache:
    """Makes trainers share a job's elements (distribute(..., cross_trainer_cache=...)), as
    tf.data.experimental.service.CrossTrainerCache.

    Trainers reading one named job over an infinite dataset, each with its own trainer_id,
    read every element from a window cached on each worker (WorkerConfig's
    cross_trainer_cache_size_bytes) instead of making the workers produce it again; one that
    falls behind the window skips ahead. Clients with the same trainer_id share their reads.
    """

    def __init__(self, trainer_id: str):
        if not trainer_id:
            raise ValueError("tf.data service cross-trainer cache requires a non-empty trainer ID.")
        self.trainer_id = trainer_id


def _trainer_id(cross_trainer_cache: Any) -> str:
    """The trainer id of a cross_trainer_cache argument (ours, or TensorFlow's CrossTrainerCache)."""
    if cross_trainer_cache is None:
        return ""
    trainer_id = getattr(cross_trainer_cache, "trainer_id", None)
    if not isinstance(trainer_id, (str, bytes)) or not trainer_id:
        raise ValueError(
            f"cross_trainer_cache must be a CrossTrainerCache with a non-empty trainer_id, got {cross_trainer_cache!r}"
        )
    return trainer_id.decode() if isinstance(trainer_id, bytes) else trainer_id


def _timeout_s(dispatcher_timeout_ms: int | None) -> float:
    if dispatcher_timeout_ms is None:
        return DEFAULT_CLIENT_TIMEOUT_MS / 1000
    if not isinstance(dispatcher_timeout_ms, int) or dispatcher_timeout_ms <= 0:
        raise ValueError(f"dispatcher_timeout_ms must be a positive integer, got {dispatcher_timeout_ms!r}")
    return dispatcher_timeout_ms / 1000


# Called inside a tf.function, these run as Python: AutoGraph would otherwise try to convert the
# gRPC calls under them.
_not_converted = tf.autograph.experimental.do_not_convert


def _dataset_id_str(dataset_id: DatasetId) -> str:
    if isinstance(dataset_id, tf.Tensor):
        # In graph mode, register_dataset's result is a constant of the graph, known now.
        dataset_id = tf_internal.value_now(dataset_id)
        if isinstance(dataset_id, np.ndarray | np.generic):
            dataset_id = dataset_id.item()
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


def _register(
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
    target = addresses.parse_service(service)
    # An empty id, as None, asks the dispatcher for one (as TensorFlow's).
    requested = "" if dataset_id is None or dataset_id in ("", b"") else _dataset_id_str(dataset_id)
    return tf.constant(_register(target, dataset, compression, requested, _timeout_s(dispatcher_timeout_ms)))


class _ReadOptions:
    """The validated reading arguments shared by distribute() and from_dataset_id()."""

    def __init__(
        self,
        processing_mode,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        cross_trainer_cache,
        target_workers,
        dispatcher_timeout_ms,
    ):
        self.sharding_policy = modes.parse_processing_mode(processing_mode)
        if job_name is not None and (not isinstance(job_name, str) or not job_name):
            raise ValueError(f"job_name must be None or a non-empty string, got {job_name!r}")
        if (consumer_index is None) != (num_consumers is None):
            raise ValueError("consumer_index and num_consumers must be given together, or neither")
        if num_consumers is not None:
            if job_name is None:
                raise ValueError("coordinated reads (consumer_index, num_consumers) need a job_name")
            if not isinstance(num_consumers, int) or num_consumers <= 0:
                raise ValueError(f"num_consumers must be a positive integer, got {num_consumers!r}")
            if not isinstance(consumer_index, int) or not 0 <= consumer_index < num_consumers:
                raise ValueError(f"consumer_index must be in [0, {num_consumers}), got {consumer_index!r}")
        if max_outstanding_requests == tf.data.AUTOTUNE:
            max_outstanding_requests = None
        if max_outstanding_requests is not None and (
            not isinstance(max_outstanding_requests, int)
            or isinstance(max_outstanding_requests, bool)
            or max_outstanding_requests <= 0
        ):
            raise ValueError(
                "max_outstanding_requests must be a positive integer, or None or tf.data.AUTOTUNE (-1) for a "
                f"budget in bytes, got {max_outstanding_requests!r}"
            )
        self.data_transfer_protocol = modes.parse_data_transfer_protocol(data_transfer_protocol)
        self.trainer_id = _trainer_id(cross_trainer_cache)
        if self.trainer_id:
            # TensorFlow's checks, raised here rather than at the first element.
            problem = modes.cross_trainer_cache_problem(job_name or "", num_consumers or 0, None)
            if problem:
                raise tf.errors.InvalidArgumentError(None, None, problem)
        self.target_workers = modes.parse_target_workers(target_workers)
        if self.target_workers == common_pb2.TARGET_WORKERS_LOCAL and num_consumers is not None:
            raise tf.errors.InvalidArgumentError(
                None, None, 'Coordinated reads require non-local workers, but `target_workers` is "LOCAL".'
            )
        self.job_name = job_name
        self.consumer_index = consumer_index
        self.num_consumers = num_consumers
        self.max_outstanding_requests = max_outstanding_requests
        self.timeout_s = _timeout_s(dispatcher_timeout_ms)

    def check_cardinality(self, cardinality: int) -> None:
        """Coordinated reads need an infinite dataset: every consumer reads every round; so does a
        cross-trainer cache (TensorFlow's message; UNKNOWN is left to the dispatcher)."""
        if self.trainer_id and cardinality >= 0:
            problem = modes.cross_trainer_cache_problem(self.job_name or "", self.num_consumers or 0, cardinality)
            raise tf.errors.InvalidArgumentError(None, None, problem)
        problem = modes.coordinated_reads_problem(cardinality) if self.num_consumers is not None else None
        if problem:
            # TensorFlow's class (its service raises it at the first read; ours at once).
            raise tf.errors.FailedPreconditionError(None, None, problem)

    def element_budget(self, codec: ElementCodec) -> int:
        """Elements a client may hold buffered plus in flight: max_outstanding_requests, or
        as many as fit DEFAULT_BUFFER_BYTES when element sizes are known."""
        if self.max_outstanding_requests is not None:
            return self.max_outstanding_requests
        if not codec.element_bytes:
            budget = DEFAULT_VARIABLE_BUDGET
        else:
            budget = max(2, min(MAX_DEFAULT_BUDGET, DEFAULT_BUFFER_BYTES // codec.element_bytes))
        # A named job's consumers split its elements (unless each reads them all: a cross-trainer
        # cache; coordinated reads take rounds, not credits).
        if self.job_name is not None and not self.trainer_id and self.num_consumers is None:
            budget = min(budget, SHARED_JOB_BUDGET)
        return budget


def _service_dataset(
    target: addresses.Target,
    dataset_id: str,
    element_spec: Any,
    cardinality: int,
    options: _ReadOptions,
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
    options: _ReadOptions,
    compression: common_pb2.Compression,
    element_spec: Any,
) -> tf.data.Dataset:
    """Coordinated reads (consumer_index, num_consumers): a generator over the rounds, which
    tf.data cannot save in a checkpoint (as TensorFlow's). Each round gives this consumer one
    element, so the generator yields element by element."""
    # Composite components (ragged, sparse) are rebuilt inside tf.data; plain tensors are
    # yielded in the element's own structure.
    composite = not codec.plain

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
        )
        try:
            for chunk in reader:
                for i in range(chunk.num_elements):
                    yield structure(element_at(chunk, i))
        finally:
            reader.close()

    specs = tuple(codec.component_specs) if composite else element_spec
    # Types and shapes rather than output_signature: TensorFlow then calls the generator through
    # numpy_function with light checks, instead of eager_py_func and a conversion of every value
    # to an eager tensor (see _from_generator in TensorFlow; README, "Figures behind the defaults").
    with tf_internal.deprecation_warnings_silenced():
        dataset = tf.data.Dataset.from_generator(
            generate,
            output_types=tf.nest.map_structure(lambda spec: spec.dtype, specs),
            output_shapes=tf.nest.map_structure(lambda spec: spec.shape, specs),
        )
    dataset = _on_a_thread_of_its_own(dataset)
    if composite:
        dataset = dataset.map(
            lambda *components: tf.nest.pack_sequence_as(element_spec, list(components), expand_composites=True)
        )
    return dataset


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
) -> tf.data.Dataset:
    """A dataset reading the registered dataset `dataset_id` from the service.

    Without `element_spec` the spec is the one registered with the dataset; an
    unknown id fails here, with NotFoundError.
    """
    target = addresses.parse_service(service)
    dataset_id = _dataset_id_str(dataset_id)
    options = _ReadOptions(
        processing_mode,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        cross_trainer_cache,
        target_workers,
        dispatcher_timeout_ms,
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
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """A transformation for Dataset.apply that moves the dataset's processing to the service.

    >>> ds = tf.data.Dataset.range(10).apply(distribute("parallel_epochs", "grpc://localhost:5050"))
    """
    target = addresses.parse_service(service)
    compression_enum = modes.parse_compression(compression)
    options = _ReadOptions(
        processing_mode,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        cross_trainer_cache,
        target_workers,
        dispatcher_timeout_ms,
    )

    @_not_converted
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if options.sharding_policy == modes.ShardingPolicy.DYNAMIC:
            _check_not_read_from_a_service(dataset)
        cardinality = _cardinality(dataset)
        options.check_cardinality(cardinality)
        dataset_id = _register(
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
