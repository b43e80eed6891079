"""PyTorch: the service as a torch IterableDataset whose DataLoader workers share one job.

    dataset = ServiceIterableDataset("grpc://dispatcher:5050", dataset_id, "distributed_epoch")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, pin_memory=True)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for x, y in loader:
            ...

Each DataLoader worker process (or the main process, with num_workers=0)
reads with a NumpyReader of its own, as a consumer of one shared job (its
name made once, here, unless given), so each element goes to one of them: in
distributed_epoch each element of an epoch is read once in all. The pipeline
batches on the service's workers, so the DataLoader gets batch_size=None.
Arrays become tensors without a copy (torch.from_numpy over the received
buffers); strings stay bytes; ragged and sparse components become
RaggedComponents and SparseComponents of tensors. The readers are made in the
worker processes, so no gRPC channel crosses a fork; this module makes no RPC
in the process that builds the DataLoader.

set_epoch(k), as DistributedSampler's and Hugging Face's IterableDataset's,
makes the next pass read repetition k of the job: every consumer of an epoch
must read the same repetition, and a DataLoader's workers are new copies of
this object each epoch (unless persistent_workers=True, where each pass of a
worker reads the next repetition, as the main process does with
num_workers=0). A pass over a repetition that an earlier epoch read to its end
reads nothing, as a tf.data service job read again under the same repetition
does; a worker may also read nothing when the others took a small epoch's
elements first. No TensorFlow is imported.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dataservice.client.numpy_elements import RaggedComponents, SparseComponents
from dataservice.client.read_options import ReadOptions
from dataservice.reader import NumpyReader, dataset_id_argument


def to_torch(element: Any) -> Any:
    """An element of NumpyReader with its arrays as tensors sharing their memory."""
    if isinstance(element, np.ndarray | np.generic):
        array = np.asarray(element)
        if array.dtype == object:
            return array
        with warnings.catch_warnings():
            # A received message's buffer is read-only: torch warns that the tensor over it must
            # not be written. Batches are read, then moved (to shared or pinned memory, a device).
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    if isinstance(element, RaggedComponents):
        return RaggedComponents(to_torch(element.flat_values), tuple(to_torch(s) for s in element.nested_row_splits))
    if isinstance(element, SparseComponents):
        return SparseComponents(*(to_torch(part) for part in element))
    if isinstance(element, dict):
        return {key: to_torch(value) for key, value in element.items()}
    if isinstance(element, tuple) and hasattr(element, "_fields"):
        return type(element)(*(to_torch(value) for value in element))
    if isinstance(element, tuple | list):
        return type(element)(to_torch(value) for value in element)
    return element


class ServiceIterableDataset(IterableDataset):
    """The elements of a registered dataset, read by each DataLoader worker as a consumer of
    one shared job (see the module docstring). Arguments as NumpyReader's, but for
    consumer_index and num_consumers: DataLoader workers come and go each epoch, so they
    share a job instead of reading rounds of a coordinated one."""

    def __init__(
        self,
        service: str | tuple[str, str],
        dataset_id: str | bytes | int | None = None,
        processing_mode: str = "parallel_epochs",
        job_name: str | None = None,
        target_workers: str = "AUTO",
        **reader_options: Any,
    ):
        super().__init__()
        for coordinated in ("consumer_index", "num_consumers"):
            if coordinated in reader_options:
                raise ValueError(
                    f"{coordinated}: DataLoader workers come and go each epoch, so they share a job "
                    "instead of reading coordinated rounds; read those with NumpyReader"
                )
        for owned in ("state", "repetition"):
            if owned in reader_options:
                raise ValueError(f"{owned}: each pass's repetition comes from set_epoch()")
        dataset_id = dataset_id_argument(dataset_id, job_name, "ServiceIterableDataset")
        options = {
            name: reader_options.pop(name, None)
            for name in (
                "max_outstanding_requests",
                "data_transfer_protocol",
                "cross_trainer_cache",
                "dispatcher_timeout_ms",
                "stream_timeout_ms",
            )
        }
        if reader_options:
            raise TypeError(f"unexpected arguments: {sorted(reader_options)}")
        # Checked here, in the process that builds the DataLoader (no RPC), rather than in
        # each worker when the first epoch starts.
        ReadOptions(
            processing_mode=processing_mode,
            job_name=job_name,
            consumer_index=None,
            num_consumers=None,
            target_workers=target_workers,
            **options,
        )
        self.service = service
        self.dataset_id = dataset_id
        self.processing_mode = processing_mode
        # One name for the consumers of every DataLoader worker (and every epoch's iteration).
        self.job_name = job_name or f"torch-{uuid.uuid4().hex}"
        self.target_workers = target_workers
        self.reader_options = options
        self.epoch = 0
        self._passes = 0

    def set_epoch(self, epoch: int) -> None:
        """The job's repetition that the next pass reads, in every DataLoader worker."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = epoch
        self._passes = 0

    def __iter__(self) -> Iterator[Any]:
        # set_epoch's epoch for a new copy (a DataLoader worker); the next one for each further
        # pass of the same object (a persistent worker, or the main process).
        repetition = self.epoch + self._passes
        self._passes += 1
        reader = NumpyReader(
            self.service,
            self.dataset_id,
            self.processing_mode,
            job_name=self.job_name,
            target_workers=self.target_workers,
            repetition=repetition,
            **self.reader_options,
        )
        try:
            for element in reader:
                yield to_torch(element)
        finally:
            reader.close()

    def __repr__(self) -> str:
        worker = get_worker_info()
        where = f", DataLoader worker {worker.id}" if worker is not None else ""
        return f"ServiceIterableDataset({self.dataset_id!r}, {self.processing_mode!r}, job {self.job_name!r}{where})"
