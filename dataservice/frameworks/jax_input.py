"""JAX: global batches from the service as jax.Arrays sharded over a mesh's batch axis.

The JAX counterpart of dtensor_batches (training/dtensor_input.py): each batch
that a NumpyReader hands out (the pipeline batches on the workers) becomes,
leaf by leaf, one jax.Array split along its first axis over the mesh axis
`batch_axis` and replicated over the others, through
jax.make_array_from_process_local_data. In a multi-process job each process
reads its own part of the global batch (its own consumer of a shared job, or
its own share of a distributed_epoch), and the arrays span every process's
devices. No TensorFlow is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def batch_sharding(mesh: Mesh, batch_axis: str = "batch") -> NamedSharding:
    """The sharding of a batch: its first axis over `batch_axis`, the rest replicated."""
    if batch_axis not in mesh.axis_names:
        raise ValueError(f"the mesh has no axis {batch_axis!r} (it has {list(mesh.axis_names)})")
    return NamedSharding(mesh, PartitionSpec(batch_axis))


def shard_batch(batch: Any, mesh: Mesh, batch_axis: str = "batch") -> Any:
    """The batch (a structure of numpy arrays: this process's part of the global batch) as
    jax.Arrays sharded along their first axis over the mesh axis `batch_axis`."""
    sharding = batch_sharding(mesh, batch_axis)
    shards = mesh.shape[batch_axis] // jax.process_count() or 1

    def shard(array: Any) -> jax.Array:
        array = np.asarray(array)
        if array.ndim == 0:
            raise ValueError("a scalar has no batch axis to shard: batch the pipeline on the workers")
        if array.dtype == object:
            raise ValueError("strings cannot become jax.Arrays: turn them into numbers in the pipeline")
        if array.shape[0] % shards:
            raise ValueError(
                f"a batch of {array.shape[0]} does not split evenly over the {shards} devices of mesh axis "
                f"{batch_axis!r} in this process: batch with drop_remainder=True and a multiple of {shards}"
            )
        return jax.make_array_from_process_local_data(sharding, array)

    return jax.tree.map(shard, batch)


def jax_batches(batches: Iterable[Any], mesh: Mesh, batch_axis: str = "batch") -> Iterator[Any]:
    """Iterates `batches` (a NumpyReader over a batched pipeline, say), yielding each as
    shard_batch makes it."""
    for batch in batches:
        yield shard_batch(batch, mesh, batch_axis)
