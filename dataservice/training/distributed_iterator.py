"""Per-replica batches of a tf.distribute strategy from an iterator that tf.train.Checkpoint can save.

`iter(strategy.experimental_distribute_dataset(ds))` is not trackable in
TensorFlow (tf.train.Checkpoint refuses it, for local datasets too): it
prefetches into per-device buffers that TensorFlow cannot serialize. This
iterator reads the global batches from one ordinary tf.data iterator, which
a checkpoint saves (with a service dataset: the position that
saveable_stream.py keeps), and splits each batch over the replicas as
experimental_distribute_dataset does, the remainder of an uneven batch to
the first replicas.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class DistributedIterator(tf.Module):
    """Iterates per-replica values (for strategy.run) of `dataset`'s global batches; put it in a
    tf.train.Checkpoint like any iterator."""

    def __init__(self, strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
        super().__init__(name="distributed_iterator")
        self._strategy = strategy
        # Tracked by tf.Module: a checkpoint of this object holds the dataset iterator's state.
        self.iterator = iter(dataset)

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        replicas = self._strategy.num_replicas_in_sync

        def replica_part(context: tf.distribute.experimental.ValueContext) -> Any:
            def part(tensor: tf.Tensor) -> tf.Tensor:
                size = tf.shape(tensor, out_type=tf.int64)[0]
                index = tf.constant(context.replica_id_in_sync_group, tf.int64)
                base, extra = size // replicas, size % replicas
                begin = index * base + tf.minimum(index, extra)
                length = base + tf.cast(index < extra, tf.int64)
                return tensor[begin : begin + length]

            return tf.nest.map_structure(part, batch)

        return self._strategy.experimental_distribute_values_from_function(replica_part)

    def get_next(self) -> Any:
        return next(self)


def distributed_iterator(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset) -> DistributedIterator:
    """What `iter(strategy.experimental_distribute_dataset(dataset))` gives (each global batch split
    over the replicas), from an iterator that tf.train.Checkpoint can save and restore.

    >>> iterator = dataservice.distributed_iterator(strategy, ds.batch(64))
    >>> checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator)
    >>> strategy.run(train_step, args=(next(iterator),))
    """
    return DistributedIterator(strategy, dataset)
