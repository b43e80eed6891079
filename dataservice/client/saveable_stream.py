"""The service's elements as a tf.data pipeline whose iterator tf.train.Checkpoint can save.

tf.data saves an iterator by asking each dataset op of the pipeline for its
state, and a Python generator has none to give (from_generator cannot be
saved). So the elements reach tf.data through ops that can:

    range(inf)
      .scan(state, step)            call k: the reader's next chunk, with the reader's progress
                                    after it (elements taken per task, and each task's latest
                                    receipt); the state: a token naming the iterator's reader
                                    (made at the first call) and that progress. At the end of
                                    the data the call raises StopIteration, which ends the scan
                                    (tf_internal.ending_scan)
      .unbatch() or                 the chunk's elements (chunk_layout.py)
      .flat_map(elements)

Few ops and functions, and no dataset made per iterator before its first
chunk: making a tf.data iterator costs milliseconds per function it optimizes
and instantiates, which is most of a service dataset's time to its first
element. So the scan's own call ends the data, rather than an empty chunk
and a take_while (a function more); unbatch and flat_map, once their input
has ended, never call it again, also when restored from a checkpoint taken
after the end.

The scan's state is what a checkpoint needs to resume: per task of the
iteration, the elements that went past the scan (what the flat_map and
later ops still hold, tf.data saves with them). A restored iterator calls
fetch with a token this process has no reader for (a new process) or with a
call number its reader did not expect (restored in the same process): fetch
then opens a reader on a new iteration continuing from the restored state
it is given (ResumeIteration; see dispatcher/resume.py) and answers with
that reader's first chunk.

A reader is closed when its data ends, or when the iterator is destroyed: the
token is a numpy array that TensorFlow adopts without copying, so the tensor
holding it lives as long as the scan's state, and a weakref finalizer on the
array closes the reader. A restored iterator's token comes from the
checkpoint; there the progress arrays stand in for it: the scan holds the
latest as its state for as long as the iterator lives.
"""

from __future__ import annotations

import logging
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from dataservice import tf_internal
from dataservice.client.chunk_layout import ChunkLayout
from dataservice.client.reader import IterationReader
from dataservice.rpc.dispatcher_client import TaskPosition
from dataservice.transfer import chunk as chunk_lib

log = logging.getLogger(__name__)


class Repetitions:
    """The dataset's passes so far: each pass (a repeat() after distribute) reads the next
    repetition of its job. A resumed pass moves the count past the repetition it resumed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0

    def take(self) -> int:
        with self._lock:
            value, self._next = self._next, self._next + 1
            return value

    def passed(self, repetition: int) -> None:
        with self._lock:
            self._next = max(self._next, repetition + 1)


class _Slot:
    """One iterator's reader in this process, and how far tf.data has called for it."""

    def __init__(self, repetition: int, calls: int = 0):
        self.repetition = repetition
        self.calls = calls
        self.reader: IterationReader | None = None
        self.chunks: Iterator[tuple[chunk_lib.Chunk, list[tuple[int, int]]]] | None = None
        # Elements handed to tf.data per task (the progress a checkpoint saves).
        self.handed: dict[int, int] = {}
        self.token_alive = True
        self.closed = False
        # A restored iterator's reader: the scan's state (the progress arrays fetch returned last)
        # is what tells that the iterator is gone; how many were handed out.
        self.tracked_progress = False
        self.progress_seq = 0
        # Where the token this process made lives (TensorFlow adopts it, so the iterator's calls
        # bring the same buffer back); a restored iterator's token is a buffer of its own.
        self.created_address: int | None = None

    def progress(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(task ids, elements taken, elements their receipts cover, the receipts)."""
        tasks = sorted(self.handed)
        positions = [self.reader.position(t, self.handed[t]) for t in tasks] if self.reader is not None else []
        task_ids, taken, covered = (chunk_lib.aligned_empty((len(tasks),), np.int64) for _ in range(3))
        task_ids[:] = tasks
        taken[:] = [self.handed[t] for t in tasks]
        covered[:] = [p.receipt_elements for p in positions]
        receipts = np.array([p.receipt.encode() for p in positions], dtype=object)
        return task_ids, taken, covered, receipts

    def close(self) -> None:
        self.closed = True
        if self.reader is not None:
            self.reader.close()


ReaderFactory = Callable[[int, Sequence[TaskPosition] | None], IterationReader]


class SaveableStream:
    """Builds the pipeline for one service dataset and serves its fetch and resume calls.

    `open_reader(repetition, resume_from)` opens an IterationReader: on repetition
    `repetition` of the job, or (resume_from given) on a new iteration continuing
    from saved positions. Chunks waiting together are joined up to
    `merge` = (elements, bytes) (IterationReader.chunks).
    """

    def __init__(
        self,
        layout: ChunkLayout,
        open_reader: ReaderFactory,
        merge: tuple[int, int],
        before_first: Callable[[], None] = lambda: None,
    ):
        self._layout = layout
        self._open_reader = open_reader
        self._merge = merge
        self._before_first = before_first
        self._repetitions = Repetitions()
        self._lock = threading.Lock()
        # Slots by (token handle, address of the token's buffer as the iterator's calls bring it;
        # None until the first call after the one that made the token). Two iterators can bring
        # the same handle: one restored from a checkpoint of the other, while the other lives.
        self._slots: dict[tuple[int, int | None], _Slot] = {}

    # ---- the pipeline ----------------------------------------------------------

    def dataset(self) -> tf.data.Dataset:
        """The service dataset: its elements in their own structure, from ops tf.data can save."""
        layout = self._layout
        progress_types = [tf.int64, tf.int64, tf.int64, tf.string]  # Slot.progress
        types = [tf.int64, *progress_types, *layout.types]

        def step(state, k):
            token, progress = state[0], list(state[1:])
            out = tf.numpy_function(self._fetch, [token, k, *progress], types, stateful=True)
            token, progress, arrays = out[0], out[1:5], out[5:]
            token.set_shape([2])
            for array in progress:
                array.set_shape([None])
            for array, shape in zip(arrays, layout.shapes):
                array.set_shape(shape)
            chunk = layout.pack_batched(arrays) if layout.unbatched else tuple(arrays)
            return (token, *progress), chunk

        start = (tf.zeros([2], tf.int64), *(tf.zeros([0], dtype) for dtype in progress_types))
        chunks = tf_internal.ending_scan(tf.data.Dataset.range(2**62), start, step)
        if layout.unbatched:
            elements = chunks.unbatch()
        else:
            elements = chunks.flat_map(lambda *arrays: layout.elements(arrays))
        # No stateless map after the scan: tf.data would run it in parallel, reading ahead of the
        # consumer, and a parallel_epochs task counts as consumed when fetch is called past its end.
        options = tf.data.Options()
        # fetch talks to the service: state outside tf.data, which the scan's progress stands for.
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        # No prefetch appended behind the user's back: its buffer would go into every checkpoint
        # (it grows as autotune sees fit) and it reads ahead of the consumer. The reader's streams
        # already fetch ahead; a .prefetch() the user adds works as usual.
        options.experimental_optimization.inject_prefetch = False
        return elements.with_options(options)

    # ---- called by tf.data -------------------------------------------------------

    def _new_token(self, calls: int) -> np.ndarray:
        """A token naming a new reader slot, which expects call number `calls` next."""
        handle = secrets.randbits(62) + 1
        repetition = self._repetitions.take()
        slot = _Slot(repetition, calls=calls)
        # Aligned, so that TensorFlow adopts the array rather than copying it: the array then lives
        # as long as the iterator that holds the token.
        token = chunk_lib.aligned_empty((2,), np.int64)
        token[:] = (handle, repetition)
        slot.created_address = _address(token)
        with self._lock:
            self._slots[(handle, None)] = slot
        weakref.finalize(token, self._token_released, slot)
        return token

    def _progress(self, slot: _Slot) -> tuple[np.ndarray, ...]:
        """The slot's progress for the scan. For a restored iterator's reader, whose token is not
        this process's, the arrays (adopted by TensorFlow, held as the scan's state) stand in for
        the token: when the latest of them is released, the iterator is gone."""
        progress = slot.progress()
        if slot.tracked_progress and len(progress[1]):  # (an empty array has no buffer to adopt)
            slot.progress_seq += 1
            weakref.finalize(progress[1], self._progress_released, slot, slot.progress_seq)
        return progress

    def _progress_released(self, slot: _Slot, seq: int) -> None:
        if seq == slot.progress_seq:
            self._discard(slot)

    def _token_released(self, slot: _Slot) -> None:
        slot.token_alive = False
        if slot.reader is None and not slot.closed:
            return  # not started: TensorFlow copied the token; the reader will not be tracked
        self._discard(slot)

    def _discard(self, slot: _Slot) -> None:
        with self._lock:
            for key in [key for key, held in self._slots.items() if held is slot]:
                del self._slots[key]
        slot.close()

    def _slot_of(self, handle: int, address: int, call: int) -> _Slot | None:
        """The slot of the iterator that brings token `handle` at `address` for call `call`;
        None if none is this iterator's (a restored one). A slot whose iterator has not brought
        its token back yet is claimed by the first call that brings it from the buffer this
        process made (or from any, if TensorFlow copied the token and let that buffer go)."""
        with self._lock:
            slot = self._slots.get((handle, address))
            if slot is not None:
                return slot
            fresh = self._slots.get((handle, None))
            if (
                fresh is not None
                and fresh.calls == call
                and not fresh.closed
                and (address == fresh.created_address or not fresh.token_alive)
            ):
                del self._slots[(handle, None)]
                self._slots[(handle, address)] = fresh
                return fresh
            return None

    def _fetch(self, token: np.ndarray, k: np.int64, *saved: np.ndarray):
        """Call `k` of an iterator: (token, *progress, *chunk arrays); StopIteration at the end
        of the data (`saved`: the progress the scan holds, Slot.progress). The first
        call makes the iterator's token; a call with a token or number this process does not
        expect is a restored iterator's, whose reader resumes from the saved progress."""
        handle, repetition, call = int(token[0]), int(token[1]), int(k)
        address = _address(token)
        if handle == 0:
            token = self._new_token(calls=call)
            handle, address = int(token[0]), _address(token)
            with self._lock:
                slot: _Slot | None = self._slots.get((handle, None))
        else:
            slot = self._slot_of(handle, address, call)
        if slot is None or slot.calls != call or slot.closed:
            if slot is not None:
                self._discard(slot)
            slot = self._resume(handle, address, repetition, call, *saved)
        elif slot.reader is None:
            self._before_first()
            slot.reader = self._open_reader(slot.repetition, None)
            slot.chunks = slot.reader.chunks_with_origin(*self._merge)
        slot.calls += 1
        return (token, *self._next(slot))

    def _next(self, slot: _Slot):
        """The progress after the next chunk, and its arrays; StopIteration at the end, which
        ends the scan (and so the data) without a call more."""
        if slot.chunks is None:
            raise RuntimeError("an iterator's slot was read before its reader opened")
        taken = next(slot.chunks, None)
        if taken is None:
            self._discard(slot)
            raise StopIteration
        chunk, parts = taken
        for task_id, count in parts:
            slot.handed[task_id] = slot.handed.get(task_id, 0) + count
        return (*self._progress(slot), *self._layout.arrays(chunk))

    def _resume(
        self,
        handle: int,
        address: int,
        repetition: int,
        k: int,
        tasks: np.ndarray,
        counts: np.ndarray,
        covered: np.ndarray,
        receipts: np.ndarray,
    ) -> _Slot:
        """The slot of a restored iterator (call `k` of it), its reader open on a new iteration
        continuing from the saved progress."""
        self._repetitions.passed(repetition)
        slot = _Slot(repetition, calls=k)
        slot.token_alive = False
        slot.tracked_progress = True
        progress = [
            TaskPosition(t, n, c, r.decode() if isinstance(r, bytes) else str(r))
            for t, n, c, r in zip(tasks.tolist(), counts.tolist(), covered.tolist(), receipts.tolist())
        ]
        # Nothing taken yet (saved before the first element): the repetition starts anew.
        slot.reader = self._open_reader(repetition, progress or None)
        slot.chunks = slot.reader.chunks_with_origin(*self._merge)
        slot.handed = {t: 0 for t in slot.reader.session.resumed_tasks}
        with self._lock:
            old = self._slots.get((handle, address))
            self._slots[(handle, address)] = slot
        if old is not None:
            old.close()
        return slot


def _address(array: np.ndarray) -> int:
    """Where the array's data lives: the same for every call of one iterator, whose token
    tensor TensorFlow hands over without a copy."""
    return int(array.__array_interface__["data"][0])
