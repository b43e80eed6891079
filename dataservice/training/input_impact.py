"""Whether the service would help at all: the "estimate the possible impact"
measurement that the tf.data service guide recommends before moving
preprocessing off the host."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf


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
        verdict = (
            f"input-bound: {self.input_wait_fraction:.0%} of each step waits for data; about "
            f"{self.suggested_workers} dataservice workers would close the gap"
            if self.input_bound
            else "not input-bound: moving preprocessing to the service would not speed training up"
        )
        return (
            f"{self.steps_per_s_real:.1f} steps/s with the real input, {self.steps_per_s_ideal:.1f} with "
            f"cached input: {verdict}"
        )


def estimate_input_impact(
    dataset: tf.data.Dataset,
    train_step: Callable[[Any], Any],
    steps: int = 50,
    warmup_steps: int = 5,
    threshold: float = 0.9,
) -> InputImpact:
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


def _result(value: Any | None) -> None:
    """Waits for a step's outputs, so that asynchronous execution does not hide its cost."""
    for tensor in tf.nest.flatten(value):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()
