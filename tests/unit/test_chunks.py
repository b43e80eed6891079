"""Chunks: slicing, splitting and joining columns of every kind; the worker's chunk schedule and
the task buffer that hands out parts of chunks."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from dataservice.transfer import chunk as chunk_lib
from dataservice.transfer.chunk import element_at, element_columns
from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker import chunk_iterator
from dataservice.worker.chunk_iterator import ChunkIterator, ProductionRate, chunk_schedule
from dataservice.worker.task_runner import TaskRunner

SPEC = (
    tf.TensorSpec([2], tf.int32),  # fixed numeric
    tf.TensorSpec([None, 2], tf.float32),  # varying, known rank
    tf.TensorSpec([], tf.string),  # fixed string
    tf.TensorSpec([None], tf.string),  # varying strings
    tf.TensorSpec(None, tf.int64),  # unknown rank
)


def _element(i: int):
    return [
        np.array([i, -i], np.int32),
        np.arange(i * 2, dtype=np.float32).reshape(i, 2),
        np.array(b"s" * i, dtype=object),
        np.array([b"x" * j for j in range(i)], dtype=object),
        np.full([1] * (i % 3), i, np.int64),
    ]


def _joined(n: int) -> chunk_lib.Chunk:
    codec = ElementCodec(SPEC)
    return chunk_lib.concatenate([element_columns(codec.kinds, _element(i)) for i in range(n)])


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
        assert x.tolist() == y.tolist()


def test_joined_elements_come_back_one_by_one():
    chunk = _joined(6)
    assert chunk.num_elements == 6
    for i in range(6):
        _same(element_at(chunk, i), _element(i))
    assert all(c.values.ctypes.data % chunk_lib.TF_ALIGNMENT == 0 for c in chunk.columns if c.values.nbytes)


@pytest.mark.parametrize("start, stop", [(0, 6), (0, 1), (2, 5), (5, 6), (3, 3)])
def test_slices_are_the_elements_in_their_range(start, stop):
    part = _joined(6).slice(start, stop)
    assert part.num_elements == stop - start
    for i in range(stop - start):
        _same(element_at(part, i), _element(start + i))


def test_split_and_element_bytes_add_up():
    chunk = _joined(5)
    sizes = chunk.element_nbytes()
    assert int(sizes.sum()) == chunk.nbytes
    pieces = chunk.split()
    assert [p.nbytes for p in pieces] == sizes.tolist()
    _same(element_at(chunk_lib.concatenate(pieces), 4), _element(4))


def test_schedule_ramps_from_one_to_the_cap():
    assert chunk_schedule(1)[:3] == [1, 1, 1]
    assert chunk_schedule(100)[:9] == [1, 2, 4, 8, 16, 32, 64, 100, 100]


def test_the_cap_follows_the_measured_rate_and_the_byte_budget():
    rate = ProductionRate()
    assert rate.chunk_cap(element_bytes=8) == chunk_iterator.UNMEASURED_CAP
    rate.record(100, 100 * 1e-6)  # 1 us an element: as many as MAX_CHUNK_ELEMENTS
    assert rate.chunk_cap(element_bytes=8) == chunk_iterator.MAX_CHUNK_ELEMENTS
    assert rate.chunk_cap(element_bytes=1 << 20) == chunk_iterator.CHUNK_BYTES >> 20
    slow = ProductionRate()
    slow.record(1, 0.01)  # 10 ms an element: one a chunk
    assert slow.chunk_cap(element_bytes=8) == 1


def test_one_slow_chunk_does_not_shrink_the_chunks_of_a_fast_pipeline():
    rate = ProductionRate()
    for _ in range(ProductionRate.WINDOW - 1):
        rate.record(512, 512 * 2e-6)
    rate.record(16, 0.005)  # a chunk that waited 5 ms for the GIL: 300 us an element
    assert rate.chunk_cap(element_bytes=8) == chunk_iterator.MAX_CHUNK_ELEMENTS
    for _ in range(ProductionRate.WINDOW // 2 + 1):  # the pipeline did slow down: followed
        rate.record(1, 0.01)
    assert rate.chunk_cap(element_bytes=8) == 1


def test_a_suggested_rate_stands_only_until_this_worker_measures():
    rate = ProductionRate()
    rate.suggest(0.01)
    assert rate.chunk_cap(element_bytes=8) == 1
    rate.record(1000, 1000 * 1e-6)
    rate.suggest(0.01)
    assert rate.chunk_cap(element_bytes=8) == chunk_iterator.MAX_CHUNK_ELEMENTS


def test_small_fixed_elements_are_batched_in_the_pipeline():
    rate = ProductionRate()
    rate.record(1000, 1000 * 2e-6)
    dataset = tf.data.Dataset.range(5000).map(lambda i: (i, tf.strings.as_string(i)))
    iterator = ChunkIterator.over(dataset, ElementCodec(dataset.element_spec), rate)
    assert iterator.in_graph and iterator.cap == chunk_iterator.MAX_CHUNK_ELEMENTS
    chunks = list(iterator)
    sizes = [c.num_elements for c in chunks]
    assert sizes[:4] == [1, 2, 4, 8] and max(sizes) == iterator.cap
    assert sum(sizes) == 5000
    values = np.concatenate([c.columns[0].values for c in chunks])
    assert values.tolist() == list(range(5000))
    assert element_at(chunks[-1], chunks[-1].num_elements - 1)[1] == b"4999"


@pytest.mark.parametrize(
    "dataset",
    [
        tf.data.Dataset.range(5).map(lambda i: tf.fill([65536], tf.cast(i, tf.float32))),  # 256 KiB each
        tf.data.Dataset.range(5).map(lambda i: tf.range(i)),  # varying shapes
        tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3], [], [4], [5]])),
    ],
)
def test_large_varying_and_composite_elements_are_taken_one_a_call(dataset):
    iterator = ChunkIterator.over(dataset, ElementCodec(dataset.element_spec))
    assert not iterator.in_graph
    assert [c.num_elements for c in iterator] == [1] * 5


def _runner(chunks, **kwargs) -> TaskRunner:
    codec = ElementCodec(SPEC)
    runner = TaskRunner(1, lambda: iter(chunks), codec, **kwargs)
    return runner


def test_take_splits_chunks_by_count_and_bytes_and_keeps_order():
    chunks = [_joined(4), _joined(4)]
    runner = _runner(chunks)
    taken, done = runner.take(3, 1 << 30, timeout_s=5)
    assert sum(c.num_elements for c in taken) == 3 and not done
    # A byte budget smaller than one element still gives one element.
    taken2, _ = runner.take(100, 1, timeout_s=5)
    assert sum(c.num_elements for c in taken2) == 1
    rest, done = runner.take(100, 1 << 30, timeout_s=5, linger_s=1)
    got = [element_at(c, i) for c in taken + taken2 + rest for i in range(c.num_elements)]
    assert len(got) == 8 and done
    for i, element in enumerate(got):
        _same(element, _element(i % 4))


def test_the_buffer_bounds_elements_not_chunks():
    """A producer of large chunks waits when the next chunk would overfill the buffer (unless it is empty)."""
    produced = threading.Event()

    def chunks():
        for _ in range(3):
            yield _joined(4)
        produced.set()

    runner = TaskRunner(1, chunks, ElementCodec(SPEC), buffer_elements=6)
    assert not produced.wait(0.5)
    assert runner.buffered()[0] == 4
    runner.take(4, 1 << 30, timeout_s=5)
    runner.take(4, 1 << 30, timeout_s=5)
    assert produced.wait(5)
    runner.stop()
