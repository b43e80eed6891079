"""Static sharding: worker i of n keeps shard i of the dataset (TensorFlow's auto-shard rewrite)."""

from __future__ import annotations

import tensorflow as tf

from dataservice import modes, tf_internal
from dataservice.v1 import common_pb2

# ShardingPolicy -> tf.data AutoShardPolicy value.
_AUTO_SHARD_POLICY = {
    common_pb2.SHARDING_POLICY_FILE: 1,
    common_pb2.SHARDING_POLICY_DATA: 2,
    common_pb2.SHARDING_POLICY_FILE_OR_DATA: 0,  # AUTO: by file where it can, else by element
    common_pb2.SHARDING_POLICY_HINT: 3,
}
STATIC_POLICIES = modes.STATIC_POLICIES
assert STATIC_POLICIES == frozenset(_AUTO_SHARD_POLICY)


def shard(dataset: tf.data.Dataset, policy: int, num_workers: int, index: int) -> tf.data.Dataset:
    """Shard `index` of `num_workers` of `dataset`; a FILE policy on a dataset without
    file sources raises tf.errors.NotFoundError ("Found an unshardable source dataset")."""
    spec = dataset.element_spec
    variant = tf.raw_ops.AutoShardDataset(
        input_dataset=tf_internal.variant_tensor(dataset),
        num_workers=num_workers,
        index=index,
        auto_shard_policy=_AUTO_SHARD_POLICY[policy],
        output_types=tf_internal.flat_tensor_types(spec),
        output_shapes=tf_internal.flat_tensor_shapes(spec),
    )
    return tf.data.experimental.from_variant(variant, spec)
