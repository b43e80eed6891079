"""Processing modes as distribute() takes them: the names, our ShardingPolicy, TensorFlow's."""

import enum

import pytest
import tensorflow as tf

from dataservice import modes


def test_names_and_our_policies():
    assert modes.parse_processing_mode("parallel_epochs") is modes.ShardingPolicy.OFF
    assert modes.parse_processing_mode("distributed_epoch") is modes.ShardingPolicy.DYNAMIC
    assert modes.parse_processing_mode(modes.ShardingPolicy.HINT) is modes.ShardingPolicy.HINT


def test_tensorflows_sharding_policy_maps_by_name():
    for policy in tf.data.experimental.service.ShardingPolicy:
        assert modes.parse_processing_mode(policy) is modes.ShardingPolicy[policy.name]


@pytest.mark.parametrize("value", ["PARALLEL_EPOCHS", "", 0, 1, None, enum.Enum("Other", "OFF").OFF])
def test_anything_else_is_a_value_error_naming_the_argument(value):
    with pytest.raises(ValueError, match="processing_mode must be"):
        modes.parse_processing_mode(value)
