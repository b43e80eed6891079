"""DTensor: global batches packed as DTensors sharded along a mesh's batch dimension
(what the DTensor tutorial's repack_batch does, for any structure)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor


def pack_batch(batch: Any, mesh: dtensor.Mesh, batch_dim: str = "batch") -> Any:
    """A (nested) global batch as DTensors: every tensor split along its first axis over
    the mesh dimension `batch_dim`, each shard packed onto the device that owns it.

    Single-client meshes only (the seed's `repack_batch`, for any structure).
    """
    if batch_dim not in mesh.dim_names:
        raise ValueError(f"the mesh has no dimension {batch_dim!r} (it has {list(mesh.dim_names)})")
    shards = mesh.dim_size(batch_dim)

    def pack(tensor: tf.Tensor) -> tf.Tensor:
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank == 0:
            raise ValueError("a scalar has no batch dimension to shard")
        if tensor.shape[0] % shards:
            raise ValueError(
                f"a global batch of {tensor.shape[0]} does not split evenly over the "
                f"{shards} devices of mesh dimension {batch_dim!r}: batch with "
                f"drop_remainder=True and a multiple of {shards}"
            )
        layout = dtensor.Layout([batch_dim] + [dtensor.UNSHARDED] * (tensor.shape.rank - 1), mesh)
        pieces = tf.split(tensor, shards, axis=0)
        components = [pieces[location[batch_dim]] for location in mesh.local_device_locations()]
        return dtensor.pack(components, layout)

    return tf.nest.map_structure(pack, batch)


def dtensor_batches(dataset: tf.data.Dataset, mesh: dtensor.Mesh, batch_dim: str = "batch") -> Iterator[Any]:
    """Iterates `dataset` (global batches) yielding them packed with pack_batch."""
    for batch in dataset:
        yield pack_batch(batch, mesh, batch_dim)
