"""Elements as numpy structures, from the layout the dispatcher tells (no TensorFlow).

A client without TensorFlow (dataservice/reader.py) cannot decode TensorFlow's
encoding of an element spec, so the dispatcher also tells each dataset's
ElementLayout (common.proto; pipeline/element_layout.py derives it): every
component's dtype number and shape, and the structure that holds them. From it
this module makes the wire codec (the same column kinds a worker's
ElementCodec makes from the spec) and rebuilds each element of a received chunk
in its own structure: dicts, tuples, lists and named tuples of numpy arrays;
a ragged tensor as RaggedComponents (its flat values and row splits), a sparse
one as SparseComponents (indices, values, dense shape); strings as bytes (a
scalar) or object arrays of bytes, as tf.data's as_numpy_iterator() gives them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer.wire import WireCodec
from dataservice.v1 import common_pb2

# TensorFlow's DataType numbers (types.proto) and their numpy dtypes.
_NUMPY_DTYPES: dict[int, Any] = {
    1: np.float32,
    2: np.float64,
    3: np.int32,
    4: np.uint8,
    5: np.int16,
    6: np.int8,
    7: object,  # DT_STRING: bytes
    8: np.complex64,
    9: np.int64,
    10: np.bool_,
    17: np.uint16,
    18: np.complex128,
    19: np.float16,
    22: np.uint32,
    23: np.uint64,
}
DT_BFLOAT16 = 14


class RaggedComponents(NamedTuple):
    """A ragged tensor as its components: `flat_values` and the row splits of each ragged
    dimension, outermost first (tf.RaggedTensor.from_nested_row_splits rebuilds it)."""

    flat_values: np.ndarray
    nested_row_splits: tuple[np.ndarray, ...]

    @property
    def row_splits(self) -> np.ndarray:
        """The outermost row splits."""
        return self.nested_row_splits[0]

    def to_list(self) -> list:
        """The ragged tensor as nested Python lists of its values' rows."""
        rows: Any = list(self.flat_values)
        for splits in reversed(self.nested_row_splits):
            rows = [rows[int(start) : int(end)] for start, end in zip(splits[:-1], splits[1:])]
        return rows


class SparseComponents(NamedTuple):
    """A sparse tensor as its components (tf.sparse.SparseTensor's)."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray

    def to_dense(self) -> np.ndarray:
        dense = np.zeros(tuple(int(d) for d in self.dense_shape), dtype=self.values.dtype)
        if len(self.values):
            dense[tuple(self.indices.T)] = self.values
        return dense


def numpy_dtype(dtype_enum: int) -> np.dtype:
    """The numpy dtype of a TensorFlow DataType number (object for strings)."""
    if dtype_enum == DT_BFLOAT16:
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError("bfloat16 components need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    dtype = _NUMPY_DTYPES.get(dtype_enum)
    if dtype is None:
        raise ValueError(f"components of TensorFlow dtype number {dtype_enum} cannot be read without TensorFlow")
    return np.dtype(dtype)


def column_kind(component: common_pb2.ComponentLayout) -> chunk_lib.ColumnKind:
    """A component's column kind: as element_codec.column_kind makes it from the spec."""
    dtype = numpy_dtype(component.dtype)
    if component.unknown_rank:
        return chunk_lib.ColumnKind(dtype, None, None)
    shape = tuple(int(d) for d in component.shape)
    fixed = shape if all(d >= 0 for d in shape) else None
    return chunk_lib.ColumnKind(dtype, fixed, len(shape))


# Builds an element's node from its components' values.
_Build = Callable[[Sequence[Any]], Any]


class ElementStructure:
    """The codec of an element layout, and its elements rebuilt from received chunks."""

    def __init__(self, layout: common_pb2.ElementLayout):
        if not layout.components:
            raise ValueError("the dataset's element layout lists no components")
        self.layout = layout
        self.codec = WireCodec(
            [column_kind(component) for component in layout.components],
            [component.dtype for component in layout.components],
        )
        self._count = len(layout.components)
        self._build = self._node(layout.structure)

    def _component(self, index: int) -> int:
        if not 0 <= index < self._count:
            raise ValueError(f"the element layout names component {index} of {self._count}")
        return index

    def _node(self, node: common_pb2.StructureNode) -> _Build:
        kind = node.WhichOneof("node")
        if kind == "tensor":
            i = self._component(node.tensor)
            return lambda values: values[i]
        if kind == "none" or kind is None:
            return lambda values: None
        if kind == "ragged":
            first = self._component(node.ragged.first_component)
            last = self._component(first + node.ragged.ragged_rank)
            return lambda values: RaggedComponents(values[first], tuple(values[first + 1 : last + 1]))
        if kind == "sparse":
            first = self._component(node.sparse)
            self._component(first + 2)
            return lambda values: SparseComponents(values[first], values[first + 1], values[first + 2])
        if kind == "dict":
            keys = list(node.dict.keys)
            if len(keys) != len(node.dict.values):
                raise ValueError("the element layout's dict has as many keys as values")
            builds = [self._node(value) for value in node.dict.values]
            return lambda values: {key: build(values) for key, build in zip(keys, builds)}
        sequence = node.sequence
        builds = [self._node(item) for item in sequence.items]
        if sequence.kind == common_pb2.StructureSequence.KIND_LIST:
            return lambda values: [build(values) for build in builds]
        if sequence.kind == common_pb2.StructureSequence.KIND_NAMEDTUPLE:
            cls = collections.namedtuple(sequence.name or "Element", list(sequence.fields))  # type: ignore[misc]
            return lambda values: cls(*(build(values) for build in builds))
        return lambda values: tuple(build(values) for build in builds)

    @property
    def single_tensor(self) -> bool:
        return self.layout.structure.WhichOneof("node") == "tensor"

    def pack(self, components: list) -> Any:
        """One element from its components' values."""
        return self._build(components)

    def elements(self, chunk: chunk_lib.Chunk) -> Iterator[Any]:
        """The chunk's elements in order, each in the element's structure."""
        columns = [
            chunk_lib.column_elements(kind, column, chunk.num_elements)
            for kind, column in zip(chunk.kinds, chunk.columns)
        ]
        if self.single_tensor:
            return iter(columns[0])
        build = self._build
        return (build(values) for values in zip(*columns))
