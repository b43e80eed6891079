"""Chunks: consecutive elements of one element spec, held column by column.

The data path moves elements many at a time, so that the per-call costs of
Python (an IteratorGetNext, a lock, a message, a numpy_function call into
tf.data) are paid per chunk and not per element. A chunk holds one column per
component of the element spec (tf.nest.flatten with composites expanded):

- a fixed-shape numeric component: `values` is [n, *shape], the elements
  stacked (as TensorFlow's `batch` gives them);
- a variable-shape numeric component: `values` is 1-D, the elements' values
  back to back in C order, and `shapes` is [n, rank], each element's shape
  (for a component of unknown rank: 1-D, each element's rank then its dims);
- a string component: `values` is 1-D uint8, the strings' bytes back to back,
  and `lengths` each string's length (in the element's C order); `shapes` as
  above when the component's shape is not fixed.

Everything is numpy and nothing here imports TensorFlow: the worker fills
chunks from its pipeline, the wire codec (wire.py) sends their buffers as
they are, and the client hands the received columns to tf.data, which
rebuilds the elements in its own graph (client/chunk_layout.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# TensorFlow adopts a numpy array's memory as a tensor's when it is aligned to this
# (EIGEN_MAX_ALIGN_BYTES); otherwise it copies the array as tf.data takes it.
TF_ALIGNMENT = 64


@dataclasses.dataclass(frozen=True)
class ColumnKind:
    """What a component's column looks like: its numpy dtype (object for strings), its
    per-element shape when every element has the same one (None: each element's shape travels),
    and its rank (None: unknown, each element's rank travels with its shape)."""

    dtype: np.dtype
    fixed_shape: tuple | None
    rank: int | None

    @property
    def is_string(self) -> bool:
        return self.dtype == object

    @property
    def values_per_element(self) -> int:
        """Values (or strings) of one element of a fixed shape."""
        return int(np.prod(self.fixed_shape, dtype=np.int64))


@dataclasses.dataclass
class Column:
    values: np.ndarray
    lengths: np.ndarray | None = None
    shapes: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.values.nbytes


class Chunk:
    """`num_elements` consecutive elements as columns (see the module docstring)."""

    __slots__ = ("_element_nbytes", "columns", "kinds", "num_elements")

    def __init__(self, kinds: Sequence[ColumnKind], num_elements: int, columns: list[Column]):
        self.kinds = kinds
        self.num_elements = num_elements
        self.columns = columns
        self._element_nbytes: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return sum(column.nbytes for column in self.columns)

    def element_nbytes(self) -> np.ndarray:
        """Each element's bytes (int64 [n]), over all its components."""
        if self._element_nbytes is None:
            total = np.zeros(self.num_elements, np.int64)
            for kind, column in zip(self.kinds, self.columns):
                total += np.diff(_value_offsets(kind, column, self.num_elements, in_bytes=True))
            self._element_nbytes = total
        return self._element_nbytes

    def slice(self, start: int, stop: int) -> Chunk:
        """Elements [start, stop) as a chunk whose columns are views of this one's."""
        if start == 0 and stop >= self.num_elements:
            return self
        stop = min(stop, self.num_elements)
        columns = [
            _slice_column(kind, column, self.num_elements, start, stop)
            for kind, column in zip(self.kinds, self.columns)
        ]
        return Chunk(self.kinds, stop - start, columns)

    def split(self) -> list[Chunk]:
        """One chunk per element."""
        if self.num_elements == 1:
            return [self]
        return [self.slice(i, i + 1) for i in range(self.num_elements)]


def element_counts(kind: ColumnKind, column: Column, num_elements: int) -> np.ndarray:
    """Values (strings, for a string column) of each element ([n] int64)."""
    if kind.fixed_shape is not None:
        return np.full(num_elements, kind.values_per_element, np.int64)
    if kind.rank is not None:
        return np.prod(column.shapes.reshape(num_elements, kind.rank), axis=1, dtype=np.int64)
    return np.array([int(np.prod(s, dtype=np.int64)) for s in shape_list(kind, column, num_elements)], np.int64)


def shape_list(kind: ColumnKind, column: Column, num_elements: int) -> list[tuple]:
    """Each element's shape."""
    if kind.fixed_shape is not None:
        return [kind.fixed_shape] * num_elements
    if kind.rank is not None:
        return [tuple(row) for row in column.shapes.reshape(num_elements, kind.rank).tolist()]
    records, out, i = column.shapes.tolist(), [], 0
    for _ in range(num_elements):
        rank = records[i]
        out.append(tuple(records[i + 1 : i + 1 + rank]))
        i += 1 + rank
    return out


def _offsets(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _value_offsets(kind: ColumnKind, column: Column, num_elements: int, in_bytes: bool = False) -> np.ndarray:
    """Where each element's values start in `column.values` ([n + 1]; in values, or in bytes
    with `in_bytes`); for strings, where each element's strings start in `column.lengths`
    unless `in_bytes`."""
    offsets = _offsets(element_counts(kind, column, num_elements))
    if kind.is_string:
        return _offsets(column.lengths)[offsets] if in_bytes else offsets
    return offsets * column.values.dtype.itemsize if in_bytes else offsets


def _slice_shapes(kind: ColumnKind, column: Column, num_elements: int, start: int, stop: int) -> np.ndarray | None:
    if kind.fixed_shape is not None:
        return None
    if kind.rank is not None:
        return column.shapes.reshape(num_elements, kind.rank)[start:stop]
    record_ends = _offsets(np.array([len(s) + 1 for s in shape_list(kind, column, num_elements)], np.int64))
    return column.shapes[record_ends[start] : record_ends[stop]]


def _slice_column(kind: ColumnKind, column: Column, num_elements: int, start: int, stop: int) -> Column:
    if kind.fixed_shape is not None and not kind.is_string:
        return Column(column.values[start:stop])
    shapes = _slice_shapes(kind, column, num_elements, start, stop)
    offsets = _value_offsets(kind, column, num_elements)
    first, last = int(offsets[start]), int(offsets[stop])
    if kind.is_string:
        lengths = column.lengths[first:last]
        byte_start = int(column.lengths[:first].sum())
        return Column(column.values[byte_start : byte_start + int(lengths.sum())], lengths, shapes)
    return Column(column.values[first:last], None, shapes)


def concatenate(chunks: Sequence[Chunk]) -> Chunk:
    """The chunks' elements as one chunk, in TF_ALIGNMENT-aligned memory (one copy)."""
    if len(chunks) == 1:
        return chunks[0]
    kinds = chunks[0].kinds
    columns = []
    for i, kind in enumerate(kinds):
        parts = [c.columns[i] for c in chunks]
        values = aligned_concatenate([p.values for p in parts])
        lengths = np.concatenate([p.lengths for p in parts]) if kind.is_string else None
        shapes = None
        if kind.fixed_shape is None:
            shapes = np.concatenate([p.shapes.reshape(-1) if kind.rank is None else p.shapes for p in parts])
        columns.append(Column(values, lengths, shapes))
    return Chunk(kinds, sum(c.num_elements for c in chunks), columns)


def aligned_concatenate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays joined along their first axis, at an address TensorFlow adopts without copying."""
    out = aligned_empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
    return np.concatenate(arrays, out=out)


def aligned_empty(shape: tuple, dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialized array at a TF_ALIGNMENT-aligned address."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + TF_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % TF_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def aligned(array: np.ndarray) -> np.ndarray:
    """`array`, copied to TF_ALIGNMENT-aligned memory unless it is there already.

    TensorFlow would copy an unaligned array anyway, on the tf.data thread that
    hands elements to the training loop; copying where the array is made takes
    that copy off the consumer's path."""
    if array.ctypes.data % TF_ALIGNMENT == 0 or array.nbytes == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def element_shape(kind: ColumnKind, array: np.ndarray) -> np.ndarray | None:
    """The `shapes` of a one-element column holding `array` (None for a fixed shape)."""
    if kind.fixed_shape is not None:
        return None
    if kind.rank is None:
        return np.array([array.ndim, *array.shape], np.int64)
    return np.array(array.shape, np.int64).reshape(1, array.ndim)


def strings_column(strings: np.ndarray, shapes: np.ndarray | None = None) -> Column:
    """A string component's column from an object array of bytes (the elements' strings, in
    order) and the elements' `shapes` (None for a fixed shape)."""
    flat = strings.reshape(-1)
    lengths = np.fromiter(map(len, flat), np.int64, len(flat))
    values = np.frombuffer(b"".join(flat), np.uint8)
    return Column(values, lengths, shapes)


def element_columns(kinds: Sequence[ColumnKind], components: Sequence[np.ndarray]) -> Chunk:
    """One element (its components as numpy arrays) as a chunk of one."""
    columns = []
    for kind, array in zip(kinds, components):
        if kind.is_string:
            columns.append(strings_column(np.asarray(array, dtype=object), element_shape(kind, array)))
        elif kind.fixed_shape is not None:
            columns.append(Column(array[np.newaxis]))
        else:
            columns.append(Column(array.reshape(-1), None, element_shape(kind, array)))
    return Chunk(kinds, 1, columns)


def column_elements(kind: ColumnKind, column: Column, num_elements: int) -> list:
    """Each element's value in one column, as numpy gives them: views of the column's values
    (numpy scalars for scalars), strings as bytes (a scalar) or object arrays of bytes."""
    if not kind.is_string:
        if kind.fixed_shape is not None:
            return list(column.values)
        offsets = _value_offsets(kind, column, num_elements).tolist()
        values = column.values
        return [
            values[offsets[i] : offsets[i + 1]].reshape(shape)
            for i, shape in enumerate(shape_list(kind, column, num_elements))
        ]
    data = column.values.tobytes()
    ends = np.cumsum(column.lengths).tolist()
    strings = [data[start:end] for start, end in zip([0, *ends[:-1]], ends)]
    if kind.fixed_shape == ():
        return strings
    out = []
    offsets = _value_offsets(kind, column, num_elements).tolist()
    for i, shape in enumerate(shape_list(kind, column, num_elements)):
        array = np.empty(offsets[i + 1] - offsets[i], dtype=object)
        array[:] = strings[offsets[i] : offsets[i + 1]]
        out.append(array.reshape(shape))
    return out


def element_at(chunk: Chunk, index: int) -> list[np.ndarray]:
    """Element `index` of the chunk as numpy arrays, one per component (strings as object arrays)."""
    one = chunk.slice(index, index + 1)
    out = []
    for kind, column in zip(one.kinds, one.columns):
        (shape,) = shape_list(kind, column, 1)
        if kind.is_string:
            data = column.values.tobytes()
            strings = np.empty(len(column.lengths), dtype=object)
            start = 0
            for i, length in enumerate(column.lengths.tolist()):
                strings[i] = data[start : start + length]
                start += length
            out.append(strings.reshape(shape))
        elif kind.fixed_shape is not None:
            out.append(column.values[0])
        else:
            out.append(column.values.reshape(shape))
    return out
