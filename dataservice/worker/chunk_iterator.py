"""Iterates a task's pipeline in chunks (transfer/chunk.py), with one call into Python per chunk.

Every call from Python into a tf.data iterator costs more than a cheap
pipeline spends on an element: IteratorGetNext is an asynchronous kernel, so
each call hands over to one of TensorFlow's threads and back. Inside tf.data,
a dataset op asks its input for elements with plain C++ calls. So a task of
small fixed-shape elements iterates its pipeline followed by `batch(1)` and
`rebatch(sizes)`: the pipeline's own ops collect each chunk, and the worker
calls into the iterator once per chunk.

Chunk sizes follow a schedule fixed when the iterator is made: 1, 2, 4, ...
up to a cap, then the cap. The first element leaves at once, and the cap
keeps a chunk's production within about CHUNK_SECONDS at the rate the worker
measured for the dataset before (ProductionRate: the pipeline's own time,
without a distributed_epoch task's waits for its splits), and within CHUNK_BYTES;
a dataset not measured yet gets UNMEASURED_CAP. A slow pipeline therefore
gets chunks of one element and a fast one chunks of hundreds.

Elements of MiB size, of no fixed shape, or composite (ragged, sparse) are
taken one a call: one call costs little beside producing such an element,
and batching would copy it (or, for varying shapes, needs a function call
per element inside tf.data, which costs as much as the call from Python).
The wire codec still sends consecutive elements together, as one chunk.

TensorFlow's batching drops the elements it has collected when its input
fails, so an error in the middle of a chunk loses that chunk's elements
before it: a client gets every element of the chunks before, then the error.

A task's pipeline ends without an error crossing into Python: every
OutOfRangeError an eager op raises keeps a few hundred bytes inside
TensorFlow (its rendezvous for the failed step) for the life of the process,
so a worker that ends task after task for weeks would grow by that much per
task. The iterator reads its chunks followed by an end marker, a chunk of one
more dimension than any real one, and stops at the marker without asking for
more; composite elements, whose structure has no such marker, are read
through an Optional, which ends with an empty value instead of an error.

The iterator is an object rather than a generator so that its owner decides
when the pipeline's tf.data iterator is destroyed: with autotune on, that
destruction can block for a second or more (TensorFlow waits for its model
optimization), and the end of a task must not wait for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from dataservice import tf_internal
from dataservice.transfer.chunk import Chunk
from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker.rates import MedianRate

# Fixed-size elements of at least this many bytes are taken one a call (no batching copy).
PER_ELEMENT_BYTES = 256 * 1024
# What one chunk of small elements holds at most.
CHUNK_BYTES = 4 * 1024 * 1024
MAX_CHUNK_ELEMENTS = 1024
# A chunk's production time that the cap aims at: what batching may add to an element's latency.
CHUNK_SECONDS = 0.005
# The cap for a dataset whose rate neither this worker nor the dispatcher has measured yet: a
# compromise between a Python call per 16 elements of a cheap pipeline and 16 elements of
# latency for a slow one, until the first measurements come (tasks that start later use them).
UNMEASURED_CAP = 16
# Chunks at the cap in the schedule before it starts again at 1 (rebatch cycles through it).
_CAPPED_CHUNKS = 256


class ProductionRate(MedianRate):
    """How long a dataset's pipeline takes per element on this worker (rates.MedianRate over
    its chunks), shared by its tasks."""

    def __init__(self) -> None:
        super().__init__()
        self._suggested: float | None = None

    def suggest(self, seconds_per_element: float) -> None:
        """A rate measured elsewhere (the job's other workers, through the dispatcher), taken
        only while this worker has measured none of its own."""
        if seconds_per_element > 0:
            self._suggested = seconds_per_element

    @property
    def seconds_per_element(self) -> float | None:
        measured = self.measured()
        return self._suggested if measured is None else measured

    def chunk_cap(self, element_bytes: int) -> int:
        """Elements a chunk may hold: within CHUNK_SECONDS at the measured rate, CHUNK_BYTES
        (for elements of known size) and MAX_CHUNK_ELEMENTS."""
        per_element = self.seconds_per_element
        cap = UNMEASURED_CAP if per_element is None else int(CHUNK_SECONDS / max(per_element, 1e-9))
        if element_bytes:
            cap = min(cap, CHUNK_BYTES // element_bytes)
        # A power of two: tasks at nearby rates share a cap, and so their chunked pipeline.
        return 1 << (max(1, min(cap, MAX_CHUNK_ELEMENTS)).bit_length() - 1)


def chunk_schedule(cap: int) -> list[int]:
    """Chunk sizes 1, 2, 4, ... below `cap`, then `cap` (_CAPPED_CHUNKS times)."""
    sizes = []
    size = 1
    while size < cap:
        sizes.append(size)
        size *= 2
    return sizes + [cap] * _CAPPED_CHUNKS


def batches_in_graph(codec: ElementCodec) -> bool:
    """Whether the pipeline's own ops collect the task's chunks (else one element a call)."""
    return codec.plain and codec.fixed_shapes and codec.element_bytes < PER_ELEMENT_BYTES


def _end_rank(chunks: tf.data.Dataset) -> int | None:
    """The rank of the chunks' first component, where every component's rank is known (else
    None: no end marker can be told apart)."""
    ranks = [spec.shape.rank for spec in tf.nest.flatten(chunks.element_spec)]
    return None if None in ranks else ranks[0]


def _end_marker(spec: object) -> tf.data.Dataset:
    """One element of the chunks' structure whose every component is empty and has one more
    dimension than the chunks' own."""
    return tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda s: tf.zeros([0] * (s.shape.rank + 1), s.dtype), spec)
    )


@dataclasses.dataclass(frozen=True)
class ChunkedDataset:
    """A pipeline followed by what collects its chunks and the end marker: what a ChunkIterator
    iterates. Built once per pipeline and chunk cap where the pipeline object is reused
    (parallel_epochs tasks): TensorFlow keeps some bytes for every dataset object it makes and
    for the first iterator of each, for the life of the process."""

    # Held for as long as any iterator of `chunks`: the pipeline, or what it needs kept alive (a
    # task's lease on a splits.SplitPipeline).
    source: Any
    chunks: tf.data.Dataset
    in_graph: bool
    cap: int
    # The rank of a real chunk's first component (the end marker has one more); None where the
    # chunks carry no marker and are read through an Optional.
    chunk_rank: int | None
    # Seconds the pipeline has waited so far for input from outside (a distributed_epoch task's
    # splits, from the dispatcher), where it does: not the pipeline's own work, so no part of
    # the production rate that sizes chunks.
    waited_s: Callable[[], float] | None = None


def chunk_cap(codec: ElementCodec, rate: ProductionRate, max_chunk: int = MAX_CHUNK_ELEMENTS) -> int:
    """The chunk cap a task of the dataset gets now (1 where the pipeline's ops do not batch)."""
    return min(rate.chunk_cap(codec.element_bytes), max_chunk) if batches_in_graph(codec) else 1


def chunked_dataset(
    dataset: tf.data.Dataset, codec: ElementCodec, cap: int, waited_s: Callable[[], float] | None = None
) -> ChunkedDataset:
    in_graph = batches_in_graph(codec)
    if in_graph and cap > 1:
        chunks = dataset.batch(1).rebatch(chunk_schedule(cap))
    elif in_graph:
        chunks = dataset.batch(1)
    else:
        chunks = dataset
    chunk_rank = _end_rank(chunks) if codec.plain else None
    if chunk_rank is not None:
        try:
            chunks = chunks.concatenate(_end_marker(chunks.element_spec))
        except (TypeError, ValueError, tf.errors.OpError):  # a dtype tf.zeros cannot make
            chunk_rank = None
    return ChunkedDataset(dataset, chunks, in_graph, cap if in_graph else 1, chunk_rank, waited_s)


class ChunkIterator:
    """The elements of a chunked dataset (chunked_dataset) as chunks; `rate` is the dataset's,
    which the iterator both reads (for its schedule) and updates."""

    def __init__(self, chunked: ChunkedDataset, codec: ElementCodec, rate: ProductionRate | None = None):
        self._codec = codec
        self._rate = rate or ProductionRate()
        self._chunked = chunked
        self.in_graph = chunked.in_graph
        self.cap = chunked.cap
        self._chunk_rank = chunked.chunk_rank
        self._iterator = iter(chunked.chunks)
        resource = tf_internal.iterator_resource(self._iterator)
        self._resource: tf.Tensor | None = resource if self._chunk_rank is not None else None
        self._types = [spec.dtype for spec in codec.component_specs]
        # The marker relaxes the chunks' shapes to unknown ranks, and IteratorGetNext checks them.
        self._shapes = [tf.TensorShape(None)] * len(self._types)
        # The first chunk's time includes the pipeline's start (buffers filling, files opening): not a rate.
        self._started = False
        # peek(): the next chunk, or the exception that computing it raised.
        self._peeked: tuple[Chunk | None, BaseException | None] | None = None

    @classmethod
    def over(
        cls,
        dataset: tf.data.Dataset,
        codec: ElementCodec,
        rate: ProductionRate | None = None,
        max_chunk: int = MAX_CHUNK_ELEMENTS,
        waited_s: Callable[[], float] | None = None,
    ) -> ChunkIterator:
        """An iterator over `dataset` chunked afresh; `max_chunk` caps the chunks (a task that
        must not produce far ahead of its readers, as the cross-trainer cache's); `waited_s` as
        ChunkedDataset's."""
        rate = rate or ProductionRate()
        return cls(chunked_dataset(dataset, codec, chunk_cap(codec, rate, max_chunk), waited_s), codec, rate)

    def __iter__(self) -> ChunkIterator:
        return self

    def peek(self) -> None:
        """Computes the next chunk now; __next__ returns it (or raises its error) later."""
        if self._peeked is None:
            try:
                self._peeked = (self._compute_next(), None)
            except Exception as e:  # noqa: BLE001 - StopIteration or the pipeline's error, raised by __next__
                self._peeked = (None, e)

    def __next__(self) -> Chunk:
        if self._peeked is not None:
            chunk, error = self._peeked
            self._peeked = None
            if error is not None:
                raise error
            assert chunk is not None  # (a peek holds a chunk or the error instead)
            return chunk
        return self._compute_next()

    def _compute_next(self) -> Chunk:
        started = time.perf_counter()
        waited_s = self._chunked.waited_s
        waited_before = waited_s() if waited_s is not None else 0.0
        if self._resource is None:
            optional = self._iterator.get_next_as_optional()
            if not optional.has_value():
                raise StopIteration
            tensors = tf.nest.flatten(optional.get_value(), expand_composites=True)
        else:
            tensors = tf_internal.iterator_get_next(self._resource, self._types, self._shapes)
            if tensors[0].shape.rank != self._chunk_rank:
                raise StopIteration
        chunk = self._codec.batch_chunk(tensors) if self.in_graph else self._codec.element_chunk(tensors)
        if self._started:
            producing_s = time.perf_counter() - started
            if waited_s is not None:
                producing_s -= waited_s() - waited_before
            if producing_s > 0:
                self._rate.record(chunk.num_elements, producing_s)
        self._started = True
        return chunk
