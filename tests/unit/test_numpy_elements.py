"""Element layouts: a TensorFlow element spec told without TensorFlow, and elements rebuilt from
it (client/numpy_elements.py) exactly as the workers' ElementCodec encoded them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import nested_pipeline

from dataservice.client.numpy_elements import ElementStructure, RaggedComponents, SparseComponents, numpy_dtype
from dataservice.pipeline.element_layout import UnsupportedLayout, element_layout
from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer.element_codec import ElementCodec
from dataservice.transfer.wire import FrameBuffers, frame
from dataservice.v1 import common_pb2, worker_pb2


def _through_the_wire(dataset: tf.data.Dataset) -> list:
    """Encodes the dataset's elements as a worker does (one chunk), sends them as a frame, and
    rebuilds them from the spec's layout."""
    codec = ElementCodec(dataset.element_spec)
    chunks = [codec.element_chunk(tf.nest.flatten(e, expand_composites=True)) for e in dataset]
    proto, buffers = codec.encode(chunks)
    response = worker_pb2.StreamElementsResponse()
    response.chunks.add().CopyFrom(proto)
    data = frame(response, buffers)
    structure = ElementStructure(element_layout(dataset.element_spec))
    assert structure.codec.kinds == codec.kinds and structure.codec.dtype_enums == codec.dtype_enums
    received = worker_pb2.StreamElementsResponse()
    size = int.from_bytes(data[:4], "little")
    received.ParseFromString(data[4 : 4 + size])
    decoded = structure.codec.decode(received.chunks[0], FrameBuffers(data, 4 + size, 8))
    return list(structure.elements(decoded))


def test_nested_ragged_sparse_and_string_elements_come_back_as_tf_data_gives_them():
    dataset = nested_pipeline(7)
    got = _through_the_wire(dataset)
    assert len(got) == 7
    for i, (mine, theirs) in enumerate(zip(got, dataset.as_numpy_iterator())):
        assert sorted(mine) == sorted(theirs)
        assert mine["id"] == theirs["id"] == i and isinstance(mine["id"], np.int64)
        assert mine["name"] == theirs["name"] == str(i).encode()
        assert mine["words"].dtype == object and list(mine["words"]) == list(theirs["words"])
        assert isinstance(mine["ragged"], RaggedComponents)
        # (as_numpy_iterator gives a ragged tensor as an object array of its rows)
        assert mine["ragged"].to_list() == [np.asarray(row).tolist() for row in theirs["ragged"]]
        np.testing.assert_array_equal(mine["ragged"].row_splits, [0, i % 4, 2 * (i % 4)])
        assert isinstance(mine["sparse"], SparseComponents)
        dense = np.zeros([2, 5], np.float32)
        dense[0, i % 5] = i
        np.testing.assert_array_equal(mine["sparse"].to_dense(), dense)
        np.testing.assert_array_equal(mine["sparse"].dense_shape, [2, 5])
        assert type(mine["pair"]).__name__ == "Pair" and mine["pair"]._fields == ("left", "right")
        np.testing.assert_array_equal(mine["pair"].left, theirs["pair"].left)
        assert mine["pair"].right.dtype == np.float64 and mine["pair"].right.shape == (i % 3, 2)
        assert isinstance(mine["flags"], tuple) and mine["flags"][0] == (i % 2 == 0)
        assert mine["flags"][1].dtype == np.float16 and mine["flags"][1] == i
        np.testing.assert_array_equal(mine["image"], theirs["image"])


def test_a_single_tensor_of_unknown_rank_and_a_tuple_of_images():
    unknown = tf.data.Dataset.range(4).map(
        lambda i: tf.numpy_function(lambda n: np.ones([int(n) + 1] * (int(n) % 3 + 1), np.uint8), [i], tf.uint8)
    )
    got = _through_the_wire(unknown)
    assert [g.shape for g in got] == [(1,), (2, 2), (3, 3, 3), (4,)]
    images = tf.data.Dataset.range(3).map(lambda i: (tf.fill([i + 1, 2, 3], tf.cast(i, tf.uint8)), i % 2 == 0))
    got = _through_the_wire(images)
    assert [(g[0].shape, bool(g[1])) for g in got] == [((1, 2, 3), True), ((2, 2, 3), False), ((3, 2, 3), True)]


def test_what_a_layout_cannot_tell_is_refused():
    with pytest.raises(UnsupportedLayout, match="dict keys must be strings"):
        element_layout({1: tf.TensorSpec([], tf.int64)})
    with pytest.raises(UnsupportedLayout, match="DatasetSpec"):
        element_layout(tf.data.DatasetSpec(tf.TensorSpec([], tf.int64)))
    with pytest.raises(ValueError, match="dtype number 20"):  # DT_RESOURCE
        numpy_dtype(20)
    # A layout naming a component it does not list (a dispatcher that lies) is refused, not indexed.
    layout = common_pb2.ElementLayout(components=[common_pb2.ComponentLayout(dtype=9)])
    layout.structure.tensor = 3
    with pytest.raises(ValueError, match="names component 3 of 1"):
        ElementStructure(layout)


def test_column_elements_are_views_of_the_received_values():
    kind = chunk_lib.ColumnKind(np.dtype(np.float32), (4,), 1)
    values = chunk_lib.aligned(np.arange(12, dtype=np.float32).reshape(3, 4))
    rows = chunk_lib.column_elements(kind, chunk_lib.Column(values), 3)
    assert all(np.shares_memory(row, values) for row in rows)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "needs a dataset_id, or the job_name"),
        ({"dataset_id": ""}, "dataset_id must be a non-empty string"),
        ({"dataset_id": "1", "repetition": -1}, "repetition must be a non-negative integer"),
        ({"dataset_id": "1", "processing_mode": "sometimes"}, "processing_mode"),
        ({"dataset_id": "1", "consumer_index": 0}, "given together"),
        ({"dataset_id": "1", "max_outstanding_requests": 0}, "max_outstanding_requests"),
    ],
)
def test_reader_arguments_are_checked_before_any_rpc(kwargs, message):
    from dataservice.reader import NumpyReader

    # No dispatcher listens there: an RPC would fail with UnavailableError, not ValueError.
    with pytest.raises(ValueError, match=message):
        NumpyReader("grpc://localhost:1", dispatcher_timeout_ms=1000, **kwargs)
