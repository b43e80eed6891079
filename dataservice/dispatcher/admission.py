"""Dataset admission: what the dispatcher checks before a pipeline is registered, and before
a job may process it in a sharding policy.

A registered graph is untrusted code that every worker will run, so it must parse, declare an
element spec the service can carry, pass the op policy (pipeline/policy.py) and import into
TensorFlow; a job's policy must be one the pipeline can be processed in (a split source for
distributed_epoch, a shardable source for static sharding). These are the only checks that
need TensorFlow, which is why they live here and not in the rest of the core.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

import tensorflow as tf

from dataservice import status
from dataservice.dispatcher.context import CoreContext
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.state import DatasetId
from dataservice.modes import POLICY_NAMES
from dataservice.monitoring.logs import ids
from dataservice.pipeline import element_layout, policy, sharding, splits
from dataservice.pipeline import graph as graph_lib
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2

log = logging.getLogger(__name__)


class DatasetNotifier(Protocol):
    """Tells workers to build a dataset before a task of it arrives (best effort)."""

    def prepare_dataset(self, worker_address: str, dataset_id: str) -> None: ...


class DatasetAdmission:
    """RegisterDataset and the reads of registered datasets; the checks of a job's policy."""

    def __init__(self, ctx: CoreContext, datasets: DatasetStore, notifier: DatasetNotifier):
        self._ctx = ctx
        self._datasets = datasets
        self._notifier = notifier

    def register(self, request: dispatcher_pb2.RegisterDatasetRequest) -> dispatcher_pb2.RegisterDatasetResponse:
        ctx = self._ctx
        if len(request.graph_def) > ctx.config.max_graph_bytes:
            raise status.error(
                status.Code.RESOURCE_EXHAUSTED,
                f"the dataset graph is {len(request.graph_def):,} bytes, over {ctx.where}'s max_graph_bytes "
                f"({ctx.config.max_graph_bytes:,}): read large data from files in the pipeline rather than "
                "embedding it, or raise max_graph_bytes",
            )
        fingerprint = self._check_graph(request)
        requested = request.requested_dataset_id
        with ctx.lock:
            if requested:
                existing = ctx.state.dataset(requested)
                if existing is not None:
                    if existing.metadata.element_spec != request.metadata.element_spec:
                        # TensorFlow's words, which its tests match.
                        raise status.invalid_argument(
                            f"Datasets with the same ID should have the same structure: dataset id {requested!r} "
                            "is registered with elements of another structure; register this dataset under "
                            "another id"
                        )
                    if existing.fingerprint != fingerprint:
                        raise status.already_exists(
                            f"dataset id {requested!r} is already registered with a different dataset"
                        )
                    dataset_id = DatasetId(requested)
                else:
                    dataset_id = self._store(DatasetId(requested), fingerprint, request)
            else:
                dataset_id = ctx.state.dataset_with_fingerprint(fingerprint) or self._store(
                    ctx.state.next_dataset_id(), fingerprint, request
                )
            workers = ctx.state.alive_workers() if request.prepare_workers else []
        for worker_address in workers:
            self._notifier.prepare_dataset(worker_address, dataset_id)
        return dispatcher_pb2.RegisterDatasetResponse(dataset_id=dataset_id)

    def _check_graph(self, request: dispatcher_pb2.RegisterDatasetRequest) -> str:
        """INVALID_ARGUMENT or PERMISSION_DENIED for a graph the service must not run (outside
        the lock: it parses and imports the graph); the graph's fingerprint otherwise."""
        try:
            graph = graph_lib.parse_graph(request.graph_def)
            element_spec = graph_lib.decode_element_spec(request.metadata.element_spec)
            graph_lib.check_element_spec(element_spec)
        except graph_lib.InvalidDatasetError as e:
            raise status.invalid_argument(f"cannot register the dataset: {e}") from None
        except Exception as e:  # noqa: BLE001 - a malformed spec proto raises many kinds
            raise status.invalid_argument(f"cannot register the dataset: unreadable element_spec ({e})") from None
        if not self._ctx.config.allow_unsafe_ops:
            try:
                policy.check(graph)
            except policy.UnsafeDatasetError as e:
                log.warning("dataset refused: %s", e.op, extra=ids(dataset_id=request.requested_dataset_id))
                raise status.permission_denied(f"{self._ctx.where} cannot register the dataset: {e}") from None
        try:
            graph_lib.dataset_from_graph(request.graph_def, element_spec)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            message = getattr(e, "message", str(e))
            raise status.invalid_argument(
                f"cannot register the dataset: its graph does not import ({message})"
            ) from None
        return graph_lib.fingerprint(graph)

    def _store(self, dataset_id: DatasetId, fingerprint: str, request) -> DatasetId:
        """Stores the graph durably, then journals the dataset. Call with the lock held."""
        ctx = self._ctx
        try:
            self._datasets.put(dataset_id, request.graph_def)
        except OSError as e:
            log.error("storing the graph of dataset %s failed: %s", dataset_id, e)
            raise status.unavailable(
                f"{ctx.where} cannot store the dataset's graph in its work_dir ({e.strerror or e}); "
                "it was not registered. It is retried; free space on the work_dir's disk if this persists"
            ) from None
        ctx.commit(
            register_dataset=journal_pb2.RegisterDatasetUpdate(
                dataset_id=dataset_id, fingerprint=fingerprint, metadata=request.metadata
            )
        )
        log.info("dataset registered", extra=ids(dataset_id=dataset_id))
        return dataset_id

    def metadata(self, request: dispatcher_pb2.GetDataServiceMetadataRequest):
        """The dataset's metadata and its element layout (for clients without TensorFlow); asked
        by job_name alone, those of the one dataset that has a job of that name."""
        with self._ctx.lock:
            dataset_id = request.dataset_id or self._dataset_of_job(request.job_name)
            metadata = self._ctx.dataset(dataset_id).metadata
        response = dispatcher_pb2.GetDataServiceMetadataResponse(metadata=metadata, dataset_id=dataset_id)
        try:
            spec = graph_lib.decode_element_spec(metadata.element_spec)
            response.element_layout.CopyFrom(element_layout.element_layout(spec))
        except (ValueError, TypeError, tf.errors.OpError) as e:
            # Left empty: a reader without TensorFlow says why it cannot read this dataset.
            log.debug("dataset %s has no element layout: %s", dataset_id, e)
        return response

    def _dataset_of_job(self, job_name: str) -> str:
        if not job_name:
            raise status.invalid_argument("GetDataServiceMetadata needs a dataset_id or a job_name")
        datasets = self._ctx.state.datasets_with_job_named(job_name)
        if not datasets:
            raise status.not_found(f"no job named {job_name!r}: create it by reading a dataset with that job_name")
        if len(datasets) > 1:
            raise status.invalid_argument(
                f"datasets {', '.join(map(repr, datasets))} each have a job named {job_name!r}: give the dataset_id"
            )
        return datasets[0]

    def element_spec(self, request: dispatcher_pb2.GetElementSpecRequest):
        with self._ctx.lock:
            spec = self._ctx.dataset(request.dataset_id).metadata.element_spec
        return dispatcher_pb2.GetElementSpecResponse(element_spec=spec)

    def dataset_def(self, request: dispatcher_pb2.GetDatasetDefRequest):
        with self._ctx.lock:
            metadata = self._ctx.dataset(request.dataset_id).metadata
        return dispatcher_pb2.GetDatasetDefResponse(graph_def=self._graph(request.dataset_id), metadata=metadata)

    def _graph(self, dataset_id: str) -> bytes:
        graph_bytes = self._datasets.get(dataset_id)
        if graph_bytes is None:
            raise status.failed_precondition(f"the graph of dataset {dataset_id!r} is missing from the work_dir")
        return graph_bytes

    def check_policy(self, sharding_policy: int, dataset_id: str, metadata: common_pb2.DatasetMetadata) -> list[int]:
        """Checks that the dataset can be processed under `sharding_policy` (outside the lock: it
        parses the graph); returns the split group sizes for distributed_epoch."""
        if sharding_policy == common_pb2.SHARDING_POLICY_OFF:
            return []
        graph_bytes = self._graph(dataset_id)
        if sharding_policy == common_pb2.SHARDING_POLICY_DYNAMIC:
            try:
                return splits.group_sizes(splits.find_sources(graph_lib.parse_graph(graph_bytes)))
            except (splits.UnsplittableDatasetError, graph_lib.InvalidDatasetError) as e:
                raise status.invalid_argument(str(e)) from None
        worker_addresses = self._ctx.config.worker_addresses
        if not worker_addresses:
            raise status.failed_precondition(
                f"sharding policy {POLICY_NAMES[sharding_policy]} needs a dispatcher configured with "
                "worker_addresses (the fixed list of workers whose index picks each worker's shard)"
            )
        try:
            sharding.shard(
                graph_lib.dataset_from_graph(graph_bytes, graph_lib.decode_element_spec(metadata.element_spec)),
                sharding_policy,
                len(worker_addresses),
                0,
            )
        except tf.errors.OpError as e:
            # TensorFlow's message ends with a dump of the whole source node: keep its first line.
            reason = re.sub(r"\{\{.*?\}\}\s*", "", e.message).split("\n")[0].strip()
            raise status.invalid_argument(
                f"cannot shard dataset {dataset_id!r} with policy {POLICY_NAMES[sharding_policy]}: {reason} "
                "(FILE sharding needs a file-based source such as list_files or TFRecordDataset of a file list; "
                "DATA or FILE_OR_DATA shard any dataset)"
            ) from None
        return []
