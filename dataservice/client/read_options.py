"""The reading arguments of distribute(), from_dataset_id() and NumpyReader, checked before any RPC.

Shared by the TensorFlow client (api.py) and the TensorFlow-free reader
(dataservice/reader.py): the same arguments mean the same reads, and a bad
one fails the same way in both (ValueError, or the service's error classes of
status.py, which the TensorFlow client re-types as tf.errors).
"""

from __future__ import annotations

from typing import Any

from dataservice import modes, status
from dataservice.config import DEFAULT_CLIENT_TIMEOUT_MS, DEFAULT_STREAM_TIMEOUT_MS
from dataservice.transfer.wire import WireCodec
from dataservice.v1 import common_pb2

# tf.data.AUTOTUNE, which max_outstanding_requests takes for "a budget in bytes".
AUTOTUNE = -1

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
# Chunks that have arrived together are handed to the consumer as one (to tf.data, or to the
# numpy reader's loop), up to this many elements and bytes: joining them is a copy, and a call
# into Python per chunk costs more for small ones. A checkpoint holds the rest of the chunk
# being handed out.
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


def timeout_s(dispatcher_timeout_ms: int | None) -> float:
    if dispatcher_timeout_ms is None:
        return DEFAULT_CLIENT_TIMEOUT_MS / 1000
    if not isinstance(dispatcher_timeout_ms, int) or dispatcher_timeout_ms <= 0:
        raise ValueError(f"dispatcher_timeout_ms must be a positive integer, got {dispatcher_timeout_ms!r}")
    return dispatcher_timeout_ms / 1000


# The shortest stream_timeout_ms: a few of the workers' keepalive periods (wire.STREAM_KEEPALIVE_S),
# which a busy worker may stretch, so that a live worker is never taken for a silent one.
MIN_STREAM_TIMEOUT_MS = 5_000


def stream_timeout_s(stream_timeout_ms: int | None) -> float:
    if stream_timeout_ms is None:
        return DEFAULT_STREAM_TIMEOUT_MS / 1000
    if (
        not isinstance(stream_timeout_ms, int)
        or isinstance(stream_timeout_ms, bool)
        or stream_timeout_ms < MIN_STREAM_TIMEOUT_MS
    ):
        raise ValueError(
            f"stream_timeout_ms must be an integer of at least {MIN_STREAM_TIMEOUT_MS} (workers send a keepalive "
            f"every second), got {stream_timeout_ms!r}"
        )
    return stream_timeout_ms / 1000


class ReadOptions:
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
        stream_timeout_ms=None,
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
        if max_outstanding_requests == AUTOTUNE:
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
                raise status.InvalidArgumentError(problem)
        self.target_workers = modes.parse_target_workers(target_workers)
        if self.target_workers == common_pb2.TARGET_WORKERS_ANY and self.sharding_policy in modes.STATIC_POLICIES:
            raise status.InvalidArgumentError(
                f"Static sharding policy <{modes.POLICY_NAMES[self.sharding_policy].removeprefix('SHARDING_POLICY_')}> "
                'requires reading from local workers, but `target_workers` is "ANY": each worker keeps its own '
                'shard for the clients on its host; read with target_workers="LOCAL" or "AUTO"'
            )
        if self.target_workers == common_pb2.TARGET_WORKERS_LOCAL and num_consumers is not None:
            raise status.InvalidArgumentError(
                'Coordinated reads require non-local workers, but `target_workers` is "LOCAL".'
            )
        self.job_name = job_name
        self.consumer_index = consumer_index
        self.num_consumers = num_consumers
        self.max_outstanding_requests = max_outstanding_requests
        self.timeout_s = timeout_s(dispatcher_timeout_ms)
        self.stream_timeout_s = stream_timeout_s(stream_timeout_ms)

    def check_cardinality(self, cardinality: int) -> None:
        """Coordinated reads need an infinite dataset: every consumer reads every round; so does a
        cross-trainer cache (TensorFlow's message; UNKNOWN is left to the dispatcher)."""
        problem = (
            modes.cross_trainer_cache_problem(self.job_name or "", self.num_consumers or 0, cardinality)
            if self.trainer_id and cardinality >= 0
            else None
        )
        if problem:
            raise status.InvalidArgumentError(problem)
        problem = modes.coordinated_reads_problem(cardinality) if self.num_consumers is not None else None
        if problem:
            # TensorFlow's class (its service raises it at the first read; ours at once).
            raise status.FailedPreconditionError(problem)

    def element_budget(self, codec: WireCodec) -> int:
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
