"""tf.distribute: mapping each input pipeline of `strategy.distribute_datasets_from_function`
onto the service (a dataset from distribute() is an ordinary tf.data.Dataset, so
`strategy.experimental_distribute_dataset` works on it as it is)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def input_context_options(
    input_context: tf.distribute.InputContext, job_name: str, coordinated: bool = False
) -> dict[str, Any]:
    """distribute() arguments for one input pipeline of `distribute_datasets_from_function`.

    All pipelines share the job `job_name`, so each element reaches one of them.
    `coordinated=True` makes each pipeline a consumer of coordinated reads
    (consumer_index = input_pipeline_id, num_consumers = num_input_pipelines):
    in every round all pipelines read from the same worker, which suits
    synchronous training (the dataset must then be infinite).
    """
    if not isinstance(job_name, str) or not job_name:
        raise ValueError(f"job_name must be a non-empty string, got {job_name!r}")
    options: dict[str, Any] = {"job_name": job_name}
    if coordinated:
        options["consumer_index"] = input_context.input_pipeline_id
        options["num_consumers"] = input_context.num_input_pipelines
    return options
