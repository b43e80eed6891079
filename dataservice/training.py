"""Where a service dataset meets training: tf.distribute input contexts, DTensor
batches, and an estimate of whether the service would help at all.

A dataset from distribute() is an ordinary tf.data.Dataset, so
`strategy.experimental_distribute_dataset` works on it as it is. These helpers
cover the rest: mapping each input pipeline of
`strategy.distribute_datasets_from_function` onto the service, packing global
batches into DTensors sharded along a mesh's batch dimension, and the
"estimate the possible impact" measurement that the tf.data service guide
recommends before moving preprocessing off the host.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Dict, Iterator, Optional

import tensorflow as tf
from tensorflow.experimental import dtensor


def input_context_options(input_context: tf.distribute.InputContext, job_name: str,
                          coordinated: bool = False) -> Dict[str, Any]:
    """distribute() arguments for one input pipeline of `distribute_datasets_from_function`.

    All pipelines share the job `job_name`, so each element reaches one of them.
    `coordinated=True` makes each pipeline a consumer of coordinated reads
    (consumer_index = input_pipeline_id, num_consumers = num_input_pipelines):
    in every round all pipelines read from the same worker, which suits
    synchronous training (the dataset must then be infinite).
    """
    if not isinstance(job_name, str) or not job_name:
        raise ValueError(f"job_name must be a non-empty string, got {job_name!r}")
    options: Dict[str, Any] = {"job_name": job_name}
    if coordinated:
        options["consumer_index"] = input_context.input_pipeline_id
        options["num_consumers"] = input_context.num_input_pipelines
    return options


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
            raise ValueError(f"a global batch of {tensor.shape[0]} does not split evenly over the "
                             f"{shards} devices of mesh dimension {batch_dim!r}: batch with "
                             f"drop_remainder=True and a multiple of {shards}")
        layout = dtensor.Layout([batch_dim] + [dtensor.UNSHARDED] * (tensor.shape.rank - 1), mesh)
        pieces = tf.split(tensor, shards, axis=0)
        components = [pieces[location[batch_dim]] for location in mesh.local_device_locations()]
        return dtensor.pack(components, layout)

    return tf.nest.map_structure(pack, batch)


def dtensor_batches(dataset: tf.data.Dataset, mesh: dtensor.Mesh, batch_dim: str = "batch") -> Iterator[Any]:
    """Iterates `dataset` (global batches) yielding them packed with pack_batch."""
    for batch in dataset:
        yield pack_batch(batch, mesh, batch_dim)


@dataclasses.dataclass
class InputImpact:
    """What estimate_input_impact measured."""

    steps_per_s_real: float
    steps_per_s_ideal: float
    # Share of the step time spent waiting for input (0: none).
    input_wait_fraction: float
    input_bound: bool
    # Workers whose combined preprocessing would feed the ideal step rate, if the
    # pipeline's throughput on one worker is what this host achieves.
    suggested_workers: int

    def __str__(self) -> str:
        verdict = (f"input-bound: {self.input_wait_fraction:.0%} of each step waits for data; about "
                   f"{self.suggested_workers} dataservice workers would close the gap"
                   if self.input_bound else "not input-bound: moving preprocessing to the service would not "
                                            "speed training up")
        return (f"{self.steps_per_s_real:.1f} steps/s with the real input, {self.steps_per_s_ideal:.1f} with "
                f"cached input: {verdict}")


def estimate_input_impact(dataset: tf.data.Dataset, train_step: Callable[[Any], Any], steps: int = 50,
                          warmup_steps: int = 5, threshold: float = 0.9) -> InputImpact:
    """Measures steps/s with `dataset` and with `dataset.take(1).cache().repeat()` (input
    that costs nothing), as the tf.data service guide advises before adopting it.

    Training is input-bound when the real rate is below `threshold` times the
    ideal one; the suggested worker count is ideal/real rounded up (the host's
    own pipeline counting as one worker's worth of preprocessing).
    """
    if steps <= 0 or warmup_steps < 0:
        raise ValueError("steps must be positive and warmup_steps non-negative")

    def rate(ds: tf.data.Dataset) -> float:
        iterator = iter(ds)
        for _ in range(warmup_steps):
            _result(train_step(next(iterator)))
        start = time.perf_counter()
        for _ in range(steps):
            _result(train_step(next(iterator)))
        return steps / (time.perf_counter() - start)

    real = rate(dataset.repeat())
    ideal = rate(dataset.take(1).cache().repeat())
    wait = max(0.0, 1.0 - real / ideal)
    bound = real < threshold * ideal
    return InputImpact(real, ideal, wait, bound, max(1, math.ceil(ideal / real)) if bound else 1)


def _result(value: Optional[Any]) -> None:
    """Waits for a step's outputs, so that asynchronous execution does not hide its cost."""
    for tensor in tf.nest.flatten(value):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()
