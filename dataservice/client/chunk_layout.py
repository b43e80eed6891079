"""How received chunks enter tf.data: a few arrays per chunk, the elements rebuilt in the graph.

The client hands tf.data each chunk (transfer/chunk.py) as flat numpy arrays,
in one numpy_function call per chunk, and tf.data rebuilds the elements with
its own ops, so no Python runs per element:

- a fixed-shape numeric component: its stacked values, [n, *shape];
- a string component: all its bytes as one scalar string and each string's
  length; `tf.strings.substr` cuts them apart;
- a component of no fixed shape: its values back to back and each element's
  shape (for an unknown rank: each element's rank and its dims); a ragged
  tensor of row lengths cuts them into elements, and a map reshapes each
  (a function call per element, in TensorFlow's C++).

Small elements of fixed shapes are stacked, and tf.data's `unbatch` takes
them apart (it copies each, which costs less than a slice for small ones);
every other chunk goes through `from_tensor_slices`, whose slices of an
aligned chunk are views of it (no copy of large elements).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer.element_codec import ElementCodec

# Fixed-size elements below this size are handed out by `unbatch` (a copy each); larger ones are
# slices of their chunk.
UNBATCH_BELOW_BYTES = 4096


class ChunkLayout:
    """The arrays of one element spec's chunks, and the graph functions that turn them back
    into elements."""

    def __init__(self, codec: ElementCodec):
        self.codec = codec
        self.kinds = codec.kinds
        self.element_spec = codec.element_spec
        self._composite = not codec.plain
        # First the chunk's element count, then each component's arrays.
        types: list[tf.DType] = [tf.int64]
        shapes: list[tf.TensorShape] = [tf.TensorShape([])]
        for spec, kind in zip(codec.component_specs, self.kinds):
            if kind.is_string:
                types += [tf.string, tf.int64]
                shapes += [tf.TensorShape([]), tf.TensorShape([None])]
            else:
                types.append(spec.dtype)
                if kind.fixed_shape is not None:
                    shapes.append(tf.TensorShape([None]).concatenate(spec.shape))
                else:
                    shapes.append(tf.TensorShape([None]))
            if kind.fixed_shape is None:
                if kind.rank is not None:
                    types.append(tf.int64)
                    shapes.append(tf.TensorShape([None, kind.rank]))
                else:
                    types += [tf.int64, tf.int64]
                    shapes += [tf.TensorShape([None]), tf.TensorShape([None])]
        self.types = types
        self.shapes = shapes
        # Every element comes out of the chunk's slices as it is. Else each is finished by a map:
        # a slice of a ragged batch is typed as ragged even when its rank is one, and composites
        # are rebuilt from their components.
        self._sliced_as_is = codec.fixed_shapes and not self._composite
        # Stacked small elements: unbatch them.
        self.unbatched = codec.fixed_shapes and self._sliced_as_is and _element_bytes(codec) < UNBATCH_BELOW_BYTES

    # ---- Python side: a chunk's arrays -------------------------------------

    def arrays(self, chunk: chunk_lib.Chunk) -> list[np.ndarray]:
        """The chunk's arrays, in `types` order."""
        out: list[np.ndarray] = [np.array(chunk.num_elements, np.int64)]
        for kind, column in zip(self.kinds, chunk.columns):
            if kind.is_string:
                out += [np.array(column.values.tobytes(), dtype=object), _present(column.lengths, "lengths")]
            else:
                out.append(column.values)
            if kind.fixed_shape is None:
                if kind.rank is not None:
                    out.append(_present(column.shapes, "shapes").reshape(-1, kind.rank))
                else:
                    shapes = chunk_lib.shape_list(kind, column, chunk.num_elements)
                    out += [
                        np.array([len(s) for s in shapes], np.int64),
                        np.array([d for s in shapes for d in s], np.int64),
                    ]
        return out

    # ---- graph side: elements from a chunk's arrays ------------------------

    def batched(self, arrays: Sequence[tf.Tensor]) -> list[Any]:
        """Per component, the chunk's elements as one tensor with a leading dimension of the
        elements, or, for components of no fixed shape, a ragged tensor of their values and
        each element's shape beside it."""
        out: list[Any] = []
        count = arrays[0]
        i = 1
        for kind in self.kinds:
            if kind.is_string:
                joined, lengths = arrays[i], arrays[i + 1]
                starts = tf.cumsum(lengths, exclusive=True)
                values = tf.strings.substr(joined, starts, lengths)
                i += 2
            else:
                values = arrays[i]
                i += 1
            if kind.fixed_shape is not None:
                if kind.is_string:
                    values = tf.reshape(values, [count, *kind.fixed_shape])
                out.append(values)
                continue
            if kind.rank is not None:
                shapes = arrays[i]
                i += 1
                sizes = tf.reduce_prod(shapes, axis=1)
            else:
                ranks, dims = arrays[i], arrays[i + 1]
                i += 2
                shapes = tf.RaggedTensor.from_row_lengths(dims, ranks)
                sizes = tf.reduce_prod(shapes, axis=1)
            out.append((tf.RaggedTensor.from_row_lengths(values, sizes), shapes))
        return out

    def _finish(self, *items: Any) -> Any:
        """One element from its slices of batched(): rows reshaped, composites rebuilt."""
        components = []
        for kind, spec, item in zip(self.kinds, self.codec.component_specs, items):
            if kind.fixed_shape is None:
                row, shape = item
                component = tf.reshape(row, shape)
                component.set_shape(spec.shape)  # the dimensions every element shares
                components.append(component)
            else:
                components.append(item)
        return tf.nest.pack_sequence_as(self.element_spec, components, expand_composites=self._composite)

    def pack_batched(self, arrays: Sequence[tf.Tensor]) -> Any:
        """For `unbatched` layouts: the chunk as the element structure with a leading dimension."""
        return tf.nest.pack_sequence_as(self.element_spec, self.batched(arrays))

    def elements(self, arrays: Sequence[tf.Tensor]) -> tf.data.Dataset:
        """The chunk's elements as a dataset (for flat_map)."""
        batched = self.batched(arrays)
        if self._sliced_as_is:
            return tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(self.element_spec, batched))
        return tf.data.Dataset.from_tensor_slices(tuple(batched)).map(self._finish)


def _element_bytes(codec: ElementCodec) -> int:
    """Bytes of a fixed-shape element, strings counted by their number (an estimate)."""
    return sum(kind.values_per_element * (kind.dtype.itemsize if not kind.is_string else 16) for kind in codec.kinds)


def _present(array: np.ndarray | None, what: str) -> np.ndarray:
    """A column's `what` array, which its kind always has (wire.py decodes it)."""
    if array is None:
        raise ValueError(f"a column of this kind arrived without its {what}")
    return array
