"""The datasets a worker has built, and the first iterators it prepared ahead of tasks.

Starting a task's pipeline costs a GetDatasetDef round trip, importing the
graph, and at the first iterator TensorFlow's static optimizations of the
pipeline (more for the first iterator of a dataset object than for later
ones; README, "Figures behind the defaults"). So a worker keeps the datasets it
has built: parallel_epochs tasks iterate the same dataset object again, as a
local training loop iterates one dataset every epoch (`cache()` behaves as
it does locally). Its chunked form (chunk_iterator.ChunkedDataset) is kept too, per
chunk cap: TensorFlow keeps a few hundred bytes for each dataset object made
and each first iterator of one, for the life of the process, and a worker runs
task after task for weeks. distributed_epoch tasks each need a dataset of their
own (over their own split ranges): the pipeline is rebuilt over the splits
once (splits.SplitPipeline), chunked and finalized once per chunk cap (its
static optimizations applied: graph.finalized_template), and each task's
dataset is made from a copy of that graph. A pipeline with a seeded shuffle
needs a dataset object per task in parallel_epochs too: each task gets a
copy of its own whose seeds derive from the task's repetition
(pipeline/seeds.py), so that epochs reshuffle as they do locally and a task
that replays another shuffles the same way, made from the pipeline chunked
and finalized once per chunk cap likewise. And when the dispatcher
announces that a client is about to read a dataset whole (parallel_epochs),
the worker builds the dataset, makes its first iterator and computes its
first element at once, in the background, so that the first task of the
dataset starts with an element ready. Prepared iterators that no task takes
are dropped after PREPARED_TTL_S.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import seeds, splits
from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker.chunk_iterator import (
    MAX_CHUNK_ELEMENTS,
    ChunkedDataset,
    ChunkIterator,
    ProductionRate,
    chunk_cap,
    chunked_dataset,
)
from dataservice.worker.split_fetcher import SplitRate

log = logging.getLogger(__name__)

MAX_DATASETS = 16
MAX_PREPARED = 4
PREPARED_TTL_S = 60.0
# How long a task waits for a preparation of its dataset that is under way.
PREPARE_WAIT_S = 10.0

# (graph_def, element_spec) of a registered dataset.
DatasetDef = tuple[bytes, Any]
# How a split pipeline is chunked: ChunkedDataset's in_graph, cap and chunk_rank.
_ChunkForm = tuple[bool, int, int | None]
_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


class _Entry:
    def __init__(self, graph_def: bytes, element_spec: Any):
        self.graph_def = graph_def
        self.element_spec = element_spec
        self.codec = ElementCodec(element_spec)
        # How fast its pipeline runs on this worker: sizes the chunks of its next tasks.
        self.rate = ProductionRate()
        self.whole: tf.data.Dataset | None = None
        # The whole dataset chunked, by chunk cap (a few powers of two).
        self.whole_chunked: dict[int, ChunkedDataset] = {}
        # Where the pipeline has seed generators: the whole pipeline chunked and finalized once,
        # by chunk cap, the template of each task's reseeded copy (with its graph serialized),
        # with how it is chunked.
        self.seeded_chunked: dict[int, tuple[graph_lib.Template, bytes, _ChunkForm]] = {}
        # A seeded shuffle or random source: each task builds its own copy (pipeline/seeds.py).
        self.seeded = seeds.has_seed_generators(graph_lib.parse_graph(graph_def))
        # The sources distributed_epoch splits, found when its first task comes.
        self.split_sources: list[splits.Source] | None = None
        # How fast its pipeline goes through splits here: sizes its tasks' ranges.
        self.split_rate = SplitRate()
        # The pipeline rebuilt over dynamic splits (under None, kept as _kept keeps things), and
        # that pipeline chunked, by chunk cap, with how it is chunked.
        self.split_pipeline: dict[None, splits.SplitPipeline] = {}
        self.chunked_pipelines: dict[int, tuple[splits.FinishedPipeline, _ChunkForm]] = {}


# Names each task's seed generators apart from every other copy's in this process.
_instances = itertools.count()


def task_graph(graph_def: bytes, repetition: int) -> bytes:
    """The graph for one task of repetition `repetition`: its seed generators its own."""
    return seeds.reseed(graph_def, f"copy{next(_instances)}", repetition)


class DatasetCache:
    def __init__(
        self,
        fetch_def: Callable[[str], DatasetDef],
        max_datasets: int = MAX_DATASETS,
        max_prepared: int = MAX_PREPARED,
        prepared_ttl_s: float = PREPARED_TTL_S,
    ):
        self._fetch_def = fetch_def
        self._max_datasets = max_datasets
        self._max_prepared = max_prepared
        self._prepared_ttl_s = prepared_ttl_s
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        # dataset id -> (when prepared, the iterator), oldest first.
        self._prepared: collections.OrderedDict[str, tuple[float, ChunkIterator]] = collections.OrderedDict()
        self._preparing: dict[str, concurrent.futures.Future] = {}
        # Prepares datasets and destroys unused iterators (which can block: see chunk_iterator).
        self._background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="datasets")

    def _entry(self, dataset_id: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(dataset_id)
            if entry is not None:
                self._entries.move_to_end(dataset_id)
                return entry
        graph_def, element_spec = self._fetch_def(dataset_id)
        with self._lock:
            entry = self._entries.setdefault(dataset_id, _Entry(graph_def, element_spec))
            self._entries.move_to_end(dataset_id)
            while len(self._entries) > self._max_datasets:
                self._entries.popitem(last=False)
            return entry

    def definition(self, dataset_id: str) -> DatasetDef:
        """The dataset's graph and element spec (fetched from the dispatcher once)."""
        entry = self._entry(dataset_id)
        return entry.graph_def, entry.element_spec

    def task_definition(self, dataset_id: str, repetition: int) -> DatasetDef:
        """definition() for one task of repetition `repetition`: where the pipeline has seed
        generators, a copy of the graph with its own (the graph as it is otherwise)."""
        entry = self._entry(dataset_id)
        graph_def = task_graph(entry.graph_def, repetition) if entry.seeded else entry.graph_def
        return graph_def, entry.element_spec

    def codec(self, dataset_id: str) -> ElementCodec:
        return self._entry(dataset_id).codec

    def rate(self, dataset_id: str) -> ProductionRate:
        """How fast the dataset's pipeline runs on this worker."""
        return self._entry(dataset_id).rate

    def split_rate(self, dataset_id: str) -> SplitRate:
        """How fast the dataset's pipeline goes through its splits on this worker."""
        return self._entry(dataset_id).split_rate

    def chunk_iterator(
        self,
        dataset_id: str,
        dataset: tf.data.Dataset,
        max_chunk: int = MAX_CHUNK_ELEMENTS,
        waited_s: Callable[[], float] | None = None,
    ) -> ChunkIterator:
        """An iterator over `dataset` (a pipeline of the dataset `dataset_id`) in chunks sized by
        the dataset's measured rate, of at most `max_chunk` elements; `waited_s`, where the
        dataset waits for splits, counts those waits (a splits.TaskLease's)."""
        entry = self._entry(dataset_id)
        if dataset is not entry.whole:
            return ChunkIterator.over(dataset, entry.codec, entry.rate, max_chunk, waited_s)
        cap = chunk_cap(entry.codec, entry.rate, max_chunk)
        chunked = self._kept(entry.whole_chunked, cap, lambda: chunked_dataset(dataset, entry.codec, cap))
        return ChunkIterator(chunked, entry.codec, entry.rate)

    def whole_dataset(self, dataset_id: str) -> tf.data.Dataset:
        """The whole pipeline, built once and reused by every task that runs it whole."""
        entry = self._entry(dataset_id)
        with self._lock:
            whole = entry.whole
        if whole is None:
            whole = graph_lib.dataset_from_graph(entry.graph_def, entry.element_spec)
            with self._lock:
                whole = entry.whole = entry.whole or whole
        return whole

    def task_dataset(self, dataset_id: str, repetition: int) -> tf.data.Dataset:
        """The whole pipeline for a task of repetition `repetition`: the shared dataset object,
        or, where the pipeline has seed generators, a copy of its own."""
        if not self._entry(dataset_id).seeded:
            return self.whole_dataset(dataset_id)
        return graph_lib.dataset_from_graph(*self.task_definition(dataset_id, repetition))

    def split_sources(self, dataset_id: str) -> list[splits.Source]:
        """The sources of the dataset's pipeline that distributed_epoch splits."""
        entry = self._entry(dataset_id)
        if entry.split_sources is None:
            entry.split_sources = splits.find_sources(graph_lib.parse_graph(entry.graph_def))
        return entry.split_sources

    def split_dataset(
        self, dataset_id: str, repetition: int, supply: splits.RangeSupply
    ) -> tuple[tf.data.Dataset, splits.TaskLease]:
        """A task's dataset over the split ranges `supply` yields (and what to keep referenced
        while it is iterated), with seeds of its own where the pipeline has seed generators."""
        pipeline, _ = self._split_pipeline(dataset_id, None)
        return pipeline.dataset(supply, self._reseeding(dataset_id, repetition))

    def split_iterator(
        self, dataset_id: str, repetition: int, supply: splits.RangeSupply, max_chunk: int = MAX_CHUNK_ELEMENTS
    ) -> ChunkIterator:
        """split_dataset's elements in chunks, from a pipeline rebuilt once and chunked once per
        chunk cap: a task makes one dataset object, not one per chunking op."""
        entry = self._entry(dataset_id)
        pipeline, form = self._split_pipeline(dataset_id, chunk_cap(entry.codec, entry.rate, max_chunk))
        assert form is not None
        chunks, lease = pipeline.dataset(supply, self._reseeding(dataset_id, repetition))
        chunked = ChunkedDataset(lease, chunks, *form, waited_s=lease.waited_s)
        return ChunkIterator(chunked, entry.codec, entry.rate)

    def _reseeding(self, dataset_id: str, repetition: int) -> Callable[[bytes], bytes] | None:
        if not self._entry(dataset_id).seeded:
            return None
        return lambda graph_def: task_graph(graph_def, repetition)

    def _split_pipeline(self, dataset_id: str, cap: int | None) -> tuple[splits.FinishedPipeline, _ChunkForm | None]:
        """The dataset's pipeline rebuilt over dynamic splits (once), chunked by `cap` (None: as
        it is; each cap once), with how it is chunked."""
        entry = self._entry(dataset_id)
        sources = self.split_sources(dataset_id)
        pipeline = self._kept(
            entry.split_pipeline, None, lambda: splits.SplitPipeline(entry.graph_def, entry.element_spec, sources)
        )
        if cap is None:
            return pipeline.plain, None

        def finish() -> tuple[splits.FinishedPipeline, _ChunkForm]:
            forms: list[ChunkedDataset] = []

            def chunk(rebuilt: tf.data.Dataset) -> tf.data.Dataset:
                forms.append(chunked_dataset(rebuilt, entry.codec, cap))
                return forms[0].chunks

            finished = pipeline.finished(chunk, finalize=True)
            return finished, (forms[0].in_graph, forms[0].cap, forms[0].chunk_rank)

        return self._kept(entry.chunked_pipelines, cap, finish)

    def _kept(self, kept: dict[_Key, _Value], key: _Key, build: Callable[[], _Value]) -> _Value:
        """kept[key], built where missing: outside the lock (building imports graphs), and the
        first one built is the one kept."""
        with self._lock:
            value = kept.get(key)
        if value is None:
            value = build()
            with self._lock:
                value = kept.setdefault(key, value)
        return value

    def whole_iterator(
        self, dataset_id: str, repetition: int = 0, max_chunk: int = MAX_CHUNK_ELEMENTS
    ) -> ChunkIterator:
        """A fresh iterator of the whole pipeline: the prepared one if there is one and it fits
        (waiting for a preparation under way rather than doing the same work beside it)."""
        if (repetition and self._entry(dataset_id).seeded) or max_chunk < MAX_CHUNK_ELEMENTS:
            # Prepared iterators shuffle as repetition 0 does, and chunk as any task may.
            return self._new_whole_iterator(dataset_id, repetition, max_chunk)
        with self._lock:
            preparing = self._preparing.get(dataset_id)
        if preparing is not None:
            concurrent.futures.wait([preparing], timeout=PREPARE_WAIT_S)
        with self._lock:
            prepared = self._prepared.pop(dataset_id, None)
        if prepared is not None:
            return prepared[1]
        return self._new_whole_iterator(dataset_id, repetition, max_chunk)

    def _new_whole_iterator(self, dataset_id: str, repetition: int, max_chunk: int) -> ChunkIterator:
        entry = self._entry(dataset_id)
        if not entry.seeded:
            return self.chunk_iterator(dataset_id, self.whole_dataset(dataset_id), max_chunk)
        # A copy of its own per task, made from a graph finalized once per chunk cap (the
        # copies' seeds differ, so no dataset object is shared, but their optimization is).
        cap = chunk_cap(entry.codec, entry.rate, max_chunk)

        def finish() -> tuple[graph_lib.Template, bytes, _ChunkForm]:
            chunked = chunked_dataset(self.whole_dataset(dataset_id), entry.codec, cap)
            template = graph_lib.finalized_template(chunked.chunks)
            form = (chunked.in_graph, chunked.cap, chunked.chunk_rank)
            return template, template.graph.SerializeToString(), form

        template, graph_bytes, form = self._kept(entry.seeded_chunked, cap, finish)
        chunks = template.dataset(task_graph(graph_bytes, repetition))
        return ChunkIterator(ChunkedDataset(None, chunks, *form), entry.codec, entry.rate)

    # ---- preparing ahead of tasks -----------------------------------------

    def prepare_soon(self, dataset_id: str) -> None:
        """Prepares the dataset's first iterator and element in the background."""
        with self._lock:
            if dataset_id in self._prepared or dataset_id in self._preparing:
                return
            try:
                self._preparing[dataset_id] = self._background.submit(self._prepare, dataset_id)
            except RuntimeError:  # stopping
                pass

    def _prepare(self, dataset_id: str) -> None:
        iterator: ChunkIterator | None = None
        try:
            iterator = self._new_whole_iterator(dataset_id, 0, MAX_CHUNK_ELEMENTS)
            iterator.peek()
        except Exception as e:  # noqa: BLE001 - a task of this dataset will report it
            log.info("could not prepare dataset %s ahead of its tasks: %s", dataset_id, e)
        with self._lock:
            self._preparing.pop(dataset_id, None)
            if iterator is None:
                return
            self._prepared[dataset_id] = (time.monotonic(), iterator)
            dropped = [
                self._prepared.popitem(last=False)[1][1] for _ in range(len(self._prepared) - self._max_prepared)
            ]
        self._drop(dropped)
        log.info("prepared dataset %s ahead of its first task", dataset_id)

    @property
    def prepared(self) -> list[str]:
        """The datasets with a prepared iterator that no task has taken yet, oldest first."""
        with self._lock:
            return list(self._prepared)

    def wait_prepared(self, timeout_s: float) -> None:
        """Waits up to `timeout_s` for the preparations under way."""
        with self._lock:
            pending = list(self._preparing.values())
        concurrent.futures.wait(pending, timeout=timeout_s)

    def expire(self) -> None:
        """Drops prepared iterators that no task took within the TTL."""
        deadline = time.monotonic() - self._prepared_ttl_s
        with self._lock:
            expired = [k for k, (when, _) in self._prepared.items() if when < deadline]
            dropped = [self._prepared.pop(k)[1] for k in expired]
        self._drop(dropped)

    def _drop(self, iterators: list[ChunkIterator]) -> None:
        if iterators:
            try:
                self._background.submit(iterators.clear)
            except RuntimeError:
                iterators.clear()

    def stop(self) -> None:
        with self._lock:
            dropped = [iterator for _, iterator in self._prepared.values()]
            self._prepared.clear()
        self._drop(dropped)
        self._background.shutdown(wait=False, cancel_futures=True)
