"""The wire codec of a TensorFlow element spec, and its tensors as chunks (workers).

wire.py's WireCodec needs only each component's column kind and dtype number;
ElementCodec derives them from a tf.data element spec (tf.nest.flatten with
composites expanded) and turns what a pipeline's iterator gives into chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dataservice import tf_internal
from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer.wire import Components, WireCodec


def column_kind(spec: tf.TypeSpec) -> chunk_lib.ColumnKind:
    """The column kind of one component's spec (a tf.TensorSpec, composites expanded)."""
    return chunk_lib.ColumnKind(
        np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype),
        tuple(spec.shape.as_list()) if spec.shape.is_fully_defined() else None,
        spec.shape.rank,
    )


class ElementCodec(WireCodec):
    """Encodes and decodes the chunks of one element spec."""

    def __init__(self, element_spec: Any):
        self.element_spec = element_spec
        self.component_specs: list[tf.TensorSpec] = tf.nest.flatten(element_spec, expand_composites=True)
        super().__init__(
            [column_kind(spec) for spec in self.component_specs],
            [spec.dtype.as_datatype_enum for spec in self.component_specs],
        )
        # The element is plain tensors (no ragged or sparse components).
        self.plain = all(type(spec) is tf.TensorSpec for spec in tf.nest.flatten(element_spec))
        self._single_tensor = isinstance(element_spec, tf.TensorSpec)

    # ---- from the pipeline (workers) --------------------------------------

    def to_components(self, element: Any) -> Components:
        """An element from a tf.data iterator as numpy arrays, one per component."""
        if self._single_tensor:
            return self.tensors_to_components([element])
        return self.tensors_to_components(tf.nest.flatten(element, expand_composites=True))

    def tensors_to_components(self, tensors: Sequence[tf.Tensor]) -> Components:
        """The element's component tensors (flattened, composites expanded) as numpy arrays.

        Numeric arrays are views of the tensors' own memory, which they keep alive:
        `numpy()` copies every array (so that callers may write to it), and a worker
        only reads and sends them."""
        return [
            np.asarray(t.numpy(), dtype=object) if kind.is_string else tf_internal.tensor_memory(t)
            for t, kind in zip(tensors, self.kinds)
        ]

    def element_chunk(self, tensors: Sequence[tf.Tensor]) -> chunk_lib.Chunk:
        """One element's component tensors as a chunk of one."""
        return chunk_lib.element_columns(self.kinds, self.tensors_to_components(tensors))

    def batch_chunk(self, tensors: Sequence[tf.Tensor]) -> chunk_lib.Chunk:
        """A batch of elements of fixed shapes (each component's tensor stacked, as the
        pipeline's `batch` gives them) as a chunk."""
        columns = []
        for t, kind in zip(tensors, self.kinds):
            if kind.is_string:
                columns.append(chunk_lib.strings_column(t.numpy()))
            else:
                columns.append(chunk_lib.Column(tf_internal.tensor_memory(t)))
        return chunk_lib.Chunk(self.kinds, int(tensors[0].shape[0]), columns)
