"""Processing modes, sharding policies and the other enumerated client options.

Validation happens here, on the client, before any RPC: a bad value is a
ValueError that names the argument and the values it accepts.
"""

from __future__ import annotations

import enum
from typing import cast

from dataservice.config import DATA_TRANSFER_PROTOCOLS
from dataservice.v1 import common_pb2

# The sharding policies' names in the wire enum, by number (for messages).
POLICY_NAMES = {v: k for k, v in common_pb2.ShardingPolicy.items()}

# A split group's size when its source repeats for ever (pipeline/splits.py counts them).
INFINITE_SPLITS = 2**62


class ShardingPolicy(enum.IntEnum):
    """How a dataset is divided between workers (as tf.data.experimental.service.ShardingPolicy).

    OFF: every worker processes the whole dataset ("parallel_epochs").
    DYNAMIC: the dispatcher hands out splits of the source ("distributed_epoch").
    FILE, DATA, FILE_OR_DATA, HINT: static sharding by worker index, for a
    dispatcher configured with a fixed `worker_addresses` list.
    """

    OFF = 0
    DYNAMIC = 1
    FILE = 2
    DATA = 3
    FILE_OR_DATA = 4
    HINT = 5


# Static sharding: each listed worker keeps its own shard, which only a client on its host reads.
STATIC_POLICIES = frozenset(
    {
        common_pb2.SHARDING_POLICY_FILE,
        common_pb2.SHARDING_POLICY_DATA,
        common_pb2.SHARDING_POLICY_FILE_OR_DATA,
        common_pb2.SHARDING_POLICY_HINT,
    }
)


def reading_target(sharding_policy: int, target_workers: common_pb2.TargetWorkers) -> common_pb2.TargetWorkers:
    """The workers a client reads from: as asked, except that AUTO under static sharding reads the
    local workers only (TensorFlow's client does the same)."""
    if sharding_policy in STATIC_POLICIES and target_workers == common_pb2.TARGET_WORKERS_AUTO:
        return common_pb2.TARGET_WORKERS_LOCAL
    return target_workers


_MODE_NAMES = {"parallel_epochs": ShardingPolicy.OFF, "distributed_epoch": ShardingPolicy.DYNAMIC}


def parse_processing_mode(processing_mode: str | enum.Enum) -> ShardingPolicy:
    """Maps "parallel_epochs", "distributed_epoch" or a ShardingPolicy to a ShardingPolicy.
    TensorFlow's ShardingPolicy is taken too, by member name (code that switched its import to
    dataservice may still name TensorFlow's enum somewhere); TensorFlow is not imported here."""
    if isinstance(processing_mode, ShardingPolicy):
        return processing_mode
    if (
        isinstance(processing_mode, enum.Enum)
        and type(processing_mode).__name__ == "ShardingPolicy"
        and processing_mode.name in ShardingPolicy.__members__
    ):
        return ShardingPolicy[processing_mode.name]
    if isinstance(processing_mode, str) and processing_mode in _MODE_NAMES:
        return _MODE_NAMES[processing_mode]
    raise ValueError(
        f"processing_mode must be 'parallel_epochs', 'distributed_epoch' or a ShardingPolicy, got {processing_mode!r}"
    )


def wire_sharding_policy(policy: ShardingPolicy) -> common_pb2.ShardingPolicy:
    """The policy as the protocol's enum, which ShardingPolicy numbers alike."""
    return cast(common_pb2.ShardingPolicy, int(policy))


_COMPRESSIONS = {
    "AUTO": common_pb2.COMPRESSION_AUTO,
    "SNAPPY": common_pb2.COMPRESSION_SNAPPY,
    None: common_pb2.COMPRESSION_NONE,
}


def parse_compression(compression: str | None) -> common_pb2.Compression:
    """Maps the `compression` argument ("AUTO", "SNAPPY" or None) to its proto enum value."""
    if compression not in _COMPRESSIONS:
        raise ValueError(f"compression must be 'AUTO', 'SNAPPY' or None, got {compression!r}")
    return _COMPRESSIONS[compression]


_TARGET_WORKERS = {
    "AUTO": common_pb2.TARGET_WORKERS_AUTO,
    "ANY": common_pb2.TARGET_WORKERS_ANY,
    "LOCAL": common_pb2.TARGET_WORKERS_LOCAL,
}


def parse_target_workers(target_workers: str | None) -> common_pb2.TargetWorkers:
    """Maps "AUTO" (also for None), "ANY" or "LOCAL" (any case) to its proto enum value."""
    if target_workers is None:
        target_workers = "AUTO"
    key = target_workers.upper() if isinstance(target_workers, str) else target_workers
    if key not in _TARGET_WORKERS:
        raise ValueError(f"target_workers must be 'AUTO', 'ANY' or 'LOCAL', got {target_workers!r}")
    return _TARGET_WORKERS[key]


def cross_trainer_cache_problem(job_name: str, num_consumers: int, cardinality: int | None) -> str | None:
    """What keeps a job from a cross-trainer cache, in TensorFlow's words (its
    client/validate_utils.cc), or None. `cardinality` None: not known here (checked later)."""
    if not job_name:
        return "Cross-trainer caching requires named jobs. Got empty `job_name`."
    if cardinality is not None and cardinality != -1:  # tf.data.INFINITE_CARDINALITY
        return (
            f"Cross-trainer caching requires the input dataset to be infinite. Got input with cardinality "
            f"{cardinality}: add .repeat() to the pipeline"
        )
    if num_consumers:
        return (
            "Cross-trainer caching does not support coordinated reads. Got number of coordinated consumers: "
            f"{num_consumers}"
        )
    return None


def coordinated_reads_problem(cardinality: int, dataset: str = "this one") -> str | None:
    """Why a dataset of `cardinality` cannot be read by coordinated consumers, or None. Every
    consumer reads every round, so the dataset must not run out: a known, finite cardinality is
    refused; an unknown one (a flat_map, a filter) is the pipeline's to keep going, as in
    TensorFlow's service. `dataset`: how the message names it."""
    if cardinality < 0:
        return None
    return (
        f"coordinated reads (consumer_index, num_consumers) need an infinite dataset, but {dataset} has "
        f"cardinality {cardinality}: add .repeat() to the pipeline, so that no consumer runs out of rounds "
        "before the others"
    )


def parse_data_transfer_protocol(protocol: str | None) -> str | None:
    """None (from a worker on this host its Unix socket and shared memory, else TCP where the
    worker offers it, else gRPC), "unix" and "local" (the same; "local" is TensorFlow's name for
    in-process workers, which every client reads through memory), "tcp" (TCP, never the Unix
    socket) or "grpc" (gRPC only)."""
    if protocol is not None and protocol not in DATA_TRANSFER_PROTOCOLS:
        raise ValueError(f"data_transfer_protocol must be None, 'grpc', 'tcp', 'unix' or 'local', got {protocol!r}")
    return None if protocol in ("local", "unix") else protocol
