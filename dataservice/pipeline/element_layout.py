"""A TensorFlow element spec as an ElementLayout (common.proto), for clients without TensorFlow.

The dispatcher derives it from the element spec a dataset was registered with
and tells it beside the dataset's metadata: a reader without TensorFlow
(dataservice/reader.py) makes its wire codec and rebuilds elements from it
(client/numpy_elements.py). Components are numbered as tf.nest.flatten with
composites expanded numbers them, which is the order the workers send them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from dataservice.v1 import common_pb2


class UnsupportedLayout(ValueError):
    """An element spec a client without TensorFlow cannot be told (the message says what)."""


def element_layout(element_spec: Any) -> common_pb2.ElementLayout:
    """The layout of `element_spec`. Raises UnsupportedLayout for structures it cannot tell:
    dict keys that are not strings, or type specs other than dense, ragged and sparse tensors."""
    layout = common_pb2.ElementLayout()
    for spec in tf.nest.flatten(element_spec, expand_composites=True):
        component = layout.components.add(dtype=spec.dtype.as_datatype_enum)
        if spec.shape.rank is None:
            component.unknown_rank = True
        else:
            component.shape.extend(-1 if d is None else d for d in spec.shape.as_list())
    next_component = [0]
    layout.structure.CopyFrom(_node(element_spec, next_component))
    if next_component[0] != len(layout.components):
        raise UnsupportedLayout(
            f"the structure accounts for {next_component[0]} of the spec's {len(layout.components)} components"
        )
    return layout


def _take(next_component: list[int], count: int) -> int:
    first = next_component[0]
    next_component[0] += count
    return first


def _node(spec: Any, next_component: list[int]) -> common_pb2.StructureNode:
    node = common_pb2.StructureNode()
    if spec is None:
        node.none = True
    elif isinstance(spec, tf.TensorSpec):
        node.tensor = _take(next_component, 1)
    elif isinstance(spec, tf.RaggedTensorSpec):
        count = len(tf.nest.flatten(spec, expand_composites=True))
        node.ragged.first_component = _take(next_component, count)
        node.ragged.ragged_rank = count - 1
    elif isinstance(spec, tf.SparseTensorSpec):
        node.sparse = _take(next_component, 3)
    elif isinstance(spec, Mapping):
        if not all(isinstance(key, str) for key in spec):
            raise UnsupportedLayout(f"dict keys must be strings to read without TensorFlow, got {list(spec)}")
        for key in sorted(spec):  # tf.nest's order
            node.dict.keys.append(key)
            node.dict.values.append(_node(spec[key], next_component))
    elif isinstance(spec, tuple) and hasattr(spec, "_fields"):
        node.sequence.kind = common_pb2.StructureSequence.KIND_NAMEDTUPLE
        node.sequence.name = type(spec).__name__
        node.sequence.fields.extend(spec._fields)
        node.sequence.items.extend(_node(item, next_component) for item in spec)
    elif isinstance(spec, tuple | list):
        if isinstance(spec, list):
            node.sequence.kind = common_pb2.StructureSequence.KIND_LIST
        node.sequence.SetInParent()
        node.sequence.items.extend(_node(item, next_component) for item in spec)
    else:
        raise UnsupportedLayout(f"elements holding {type(spec).__name__} cannot be read without TensorFlow")
    return node
