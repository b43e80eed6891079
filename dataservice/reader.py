"""NumpyReader: a trainer reads the service with numpy alone, no TensorFlow in its process.

Many trainers run in JAX or PyTorch and still preprocess in tf.data. The
service's wire format is its own (transfer/wire.py), so reading it needs no
TensorFlow: this module and everything it imports never import it (a test
reads in a process where importing TensorFlow fails). The pipeline is
registered by a process that has TensorFlow (register_dataset(), distribute(),
or `data-server register`); the dispatcher tells a reader each component's
dtype and shape and the element's structure (client/numpy_elements.py).

    from dataservice.reader import NumpyReader

    reader = NumpyReader("grpc://dispatcher:5050", dataset_id, "distributed_epoch")
    for element in reader:          # one pass (an epoch); iterate again for the next
        ...

The arguments mean what distribute()'s and from_dataset_id()'s mean, and the
reads are the same: the same jobs (named jobs are shared with TensorFlow
clients reading the same dataset), coordinated reads, target_workers,
compression, TLS (grpc+tls:// and the CA variables) and the auth token
(DATASERVICE_AUTH_TOKEN). Errors are dataservice.errors classes, named as
tf.errors names them.

A checkpoint is state_dict(): a small dict of plain values (ints, strings and
lists of them) that torch.save and Orbax store as they are;
NumpyReader(..., state=saved) or load_state_dict(saved) before the next pass
continues from it through the same ResumeIteration path as a TensorFlow
checkpoint (exactly once in distributed_epoch).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from dataservice import status
from dataservice.client.coordinated_reader import CoordinatedReader
from dataservice.client.numpy_elements import ElementStructure, RaggedComponents, SparseComponents
from dataservice.client.read_options import LARGE_ELEMENT_BYTES, MERGE_BYTES, MERGE_ELEMENTS, ReadOptions
from dataservice.client.reader import IterationReader
from dataservice.client.session import JobSpec
from dataservice.modes import ShardingPolicy, wire_sharding_policy
from dataservice.rpc import addresses
from dataservice.rpc.dispatcher_client import DispatcherClient, TaskPosition
from dataservice.transfer import allocator

__all__ = ["NumpyReader", "RaggedComponents", "SparseComponents"]

# state_dict()'s format, checked by load_state_dict().
STATE_FORMAT = "dataservice.NumpyReader/1"


class _Pass:
    """One pass over the data (an iteration of the job) and how far its consumer has read:
    elements handed out per task, counted as they are handed."""

    def __init__(self, reader: IterationReader | CoordinatedReader, repetition: int):
        self.reader = reader
        self.repetition = repetition
        self.handed: dict[int, int] = {}
        # The chunk being handed out: where its elements came from, and how many went out.
        self.parts: list[tuple[int, int]] = []
        self.in_chunk = 0
        self.finished = False

    def chunk_done(self) -> None:
        for task_id, count in self.parts:
            self.handed[task_id] = self.handed.get(task_id, 0) + count
        self.parts, self.in_chunk = [], 0

    def positions(self) -> list[TaskPosition]:
        handed = dict(self.handed)
        left = self.in_chunk
        for task_id, count in self.parts:
            taken = min(count, left)
            handed[task_id] = handed.get(task_id, 0) + taken
            left -= taken
        reader = self.reader
        if not isinstance(reader, IterationReader):
            raise TypeError("coordinated reads keep no positions")
        return [reader.position(task_id, handed[task_id]) for task_id in sorted(handed)]

    def close(self) -> None:
        self.reader.close()


class NumpyReader:
    """The elements of a registered dataset (or of a named job) as numpy structures.

    `service`: "grpc://host:port" (or grpc+tls://), or (protocol, address) as
    distribute() takes it. `dataset_id`: what register_dataset() returned; None
    reads the dataset of the job named `job_name`. Each iteration over the
    reader is one pass: the next repetition of its job, as a tf.data dataset
    read again; `repetition` is the one the first pass reads (an epoch number,
    for consumers of a shared job that start anew each epoch, in processes of
    their own). See the module docstring for the rest.
    """

    def __init__(
        self,
        service: str | tuple[str, str],
        dataset_id: str | bytes | int | None = None,
        processing_mode: str | ShardingPolicy = "parallel_epochs",
        job_name: str | None = None,
        consumer_index: int | None = None,
        num_consumers: int | None = None,
        target_workers: str = "AUTO",
        *,
        max_outstanding_requests: int | None = None,
        data_transfer_protocol: str | None = None,
        cross_trainer_cache: Any = None,
        dispatcher_timeout_ms: int | None = None,
        stream_timeout_ms: int | None = None,
        state: dict | None = None,
        repetition: int = 0,
    ):
        self._target = addresses.parse_service(service)
        self._options = ReadOptions(
            processing_mode,
            job_name,
            consumer_index,
            num_consumers,
            max_outstanding_requests,
            data_transfer_protocol,
            cross_trainer_cache,
            target_workers,
            dispatcher_timeout_ms,
            stream_timeout_ms,
        )
        dataset_id = dataset_id_argument(dataset_id, job_name, "NumpyReader")
        if not isinstance(repetition, int) or isinstance(repetition, bool) or repetition < 0:
            raise ValueError(f"repetition must be a non-negative integer, got {repetition!r}")
        with DispatcherClient(
            self._target.address, self._options.timeout_s, shared=True, tls=self._target.tls
        ) as dispatcher:
            response = dispatcher.dataset_metadata(dataset_id or "", "" if dataset_id else job_name or "")
        self.dataset_id: str = response.dataset_id or dataset_id or ""
        if not response.element_layout.components:
            raise status.FailedPreconditionError(
                f"the dispatcher at {self._target.address} did not describe the elements of dataset "
                f"{self.dataset_id!r} (a structure only TensorFlow can read: dicts with keys that are not "
                "strings, or components other than dense, ragged and sparse tensors); read it with "
                "dataservice.from_dataset_id"
            )
        self.structure = ElementStructure(response.element_layout)
        self.cardinality = response.metadata.cardinality
        self._compression = response.metadata.compression
        self._options.check_cardinality(self.cardinality)
        self._job = JobSpec(
            self.dataset_id,
            wire_sharding_policy(self._options.sharding_policy),
            job_name,
            num_consumers,
            self._options.target_workers,
            self._options.trainer_id,
        )
        self._budget = self._options.element_budget(self.structure.codec)
        self._lock = threading.Lock()
        self._next_repetition = repetition
        self._resume_from: list[TaskPosition] | None = None
        self._pass: _Pass | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_pass, [None])
        if state is not None:
            self.load_state_dict(state)

    # ---- reading -----------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """A pass over the data: the next repetition of the job, or the pass a loaded state
        saved, continued. Starting a pass ends the one before it."""
        if self._closed:
            raise ValueError("the reader is closed")
        with self._lock:
            self._end_pass()
            resume_from, self._resume_from = self._resume_from, None
            repetition = self._next_repetition
            self._next_repetition += 1
        if self.structure.codec.element_bytes >= LARGE_ELEMENT_BYTES:
            allocator.keep_freed_memory_in_client()
        reader: IterationReader | CoordinatedReader
        if self._options.num_consumers is not None:
            reader = CoordinatedReader(
                self._target.address,
                self._job,
                repetition,
                self.structure.codec,
                self._options.consumer_index,
                self._options.timeout_s,
                self._compression,
                tls=self._target.tls,
                stream_timeout_s=self._options.stream_timeout_s,
            )
        else:
            reader = IterationReader(
                self._target.address,
                self._job,
                repetition,
                self.structure.codec,
                self._budget,
                self._options.timeout_s,
                self._compression,
                self._options.data_transfer_protocol,
                tls=self._target.tls,
                resume_from=resume_from,
                stream_timeout_s=self._options.stream_timeout_s,
            )
            if resume_from:
                # A resumed iteration's tasks are new; the next pass follows the saved one's.
                repetition = reader.session.repetition
                with self._lock:
                    self._next_repetition = max(self._next_repetition, repetition + 1)
        current = _Pass(reader, repetition)
        with self._lock:
            self._pass = current
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _close_pass, [current])
        return self._elements(current)

    def _elements(self, current: _Pass) -> Iterator[Any]:
        structure = self.structure
        reader = current.reader
        try:
            if isinstance(reader, IterationReader):
                for task_id in reader.session.resumed_tasks:
                    current.handed.setdefault(task_id, 0)
                chunks = reader.chunks_with_origin(MERGE_ELEMENTS, MERGE_BYTES)
                for chunk, parts in chunks:
                    current.parts = parts
                    for element in structure.elements(chunk):
                        current.in_chunk += 1
                        yield element
                    current.chunk_done()
            else:
                for chunk in reader:
                    yield from structure.elements(chunk)
            current.finished = True
        finally:
            reader.close()

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.close()
            self._pass = None

    def close(self) -> None:
        """Ends the current pass (releasing this client at the dispatcher); the reader is done."""
        with self._lock:
            self._closed = True
            self._end_pass()

    def __enter__(self) -> NumpyReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- checkpoints -------------------------------------------------------

    def state_dict(self) -> dict:
        """Where the reader stands, as plain values: load it into a new reader (of the same
        dataset and job arguments, in this process or another) to continue from here."""
        if self._options.num_consumers is not None:
            raise status.FailedPreconditionError(
                "coordinated reads (consumer_index, num_consumers) cannot be saved, as TensorFlow's cannot"
            )
        with self._lock:
            current = self._pass
            if self._resume_from is not None:  # loaded, not yet read
                positions, repetition = list(self._resume_from), self._next_repetition
            elif current is None or current.finished:
                positions, repetition = [], self._next_repetition
            else:
                positions, repetition = current.positions(), current.repetition
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "dataset_id": self.dataset_id,
            "job_name": self._job.job_name,
            "repetition": repetition,
        }
        state["tasks"] = [p.task_id for p in positions]
        state["elements"] = [p.elements for p in positions]
        state["receipt_elements"] = [p.receipt_elements for p in positions]
        state["receipts"] = [p.receipt for p in positions]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Makes the next pass continue from `state` (state_dict() of a reader of the same
        dataset and job arguments)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a NumpyReader state (format {STATE_FORMAT!r}): {state!r:.200}")
        if state.get("dataset_id") != self.dataset_id or state.get("job_name", "") != self._job.job_name:
            raise ValueError(
                f"the state was saved reading dataset {state.get('dataset_id')!r} (job {state.get('job_name')!r}); "
                f"this reader reads dataset {self.dataset_id!r} (job {self._job.job_name!r})"
            )
        try:
            repetition = int(state["repetition"])
            lists = [list(state[key]) for key in ("tasks", "elements", "receipt_elements", "receipts")]
            positions = [
                TaskPosition(int(task), int(elements), int(covered), str(receipt))
                for task, elements, covered, receipt in zip(*lists, strict=True)
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a malformed NumpyReader state: {e}") from None
        if repetition < 0 or any(p.task_id < 0 or p.elements < 0 for p in positions):
            raise ValueError("a NumpyReader state with negative counts")
        if self._options.num_consumers is not None:
            raise status.FailedPreconditionError("coordinated reads (consumer_index, num_consumers) cannot be resumed")
        with self._lock:
            self._end_pass()
            self._next_repetition = repetition
            # Nothing read yet (saved before the first element): the repetition starts anew.
            self._resume_from = positions or None


def dataset_id_argument(dataset_id: str | bytes | int | None, job_name: str | None, reader: str) -> str | None:
    """The dataset id as a string (register_dataset() returns bytes; ids are numbers), or None
    where `job_name` names the job to read; ValueError for a missing or empty one."""
    if isinstance(dataset_id, bytes):
        dataset_id = dataset_id.decode()
    if isinstance(dataset_id, int) and not isinstance(dataset_id, bool):
        dataset_id = str(dataset_id)
    if dataset_id is None and job_name is None:
        raise ValueError(f"{reader} needs a dataset_id, or the job_name of a job that reads one")
    if dataset_id is not None and (not isinstance(dataset_id, str) or not dataset_id):
        raise ValueError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    return dataset_id


def _close_pass(holder: list) -> None:
    """The reader was collected: end its pass (a finalizer, holding no reference to it)."""
    current = holder[0]
    if current is not None:
        current.close()
