"""The dispatcher itself, with no transport in it (as TensorFlow's dispatcher_impl.cc).

Each request method validates its request, turns the change it asks for into
Update messages and commits them (journal, then DispatcherState.apply) under
one lock, and returns the response proto or raises status.ServiceError. The
gRPC servicer over it only translates. What the core needs from outside is
injected: the clock (liveness and garbage collection read it), the journal,
the dataset store, and a WorkerNotifier through which new tasks and datasets
reach workers before their next heartbeat.

Liveness (when a client or worker was last heard from) is runtime
bookkeeping, not state: after a restart every peer is given a fresh timeout.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import tensorflow as tf

from dataservice import modes, read_keys, status
from dataservice.config import NEVER, DispatcherConfig
from dataservice.dispatcher import resume, status_report
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.journal import JournalWriter
from dataservice.dispatcher.load import LoadTracker
from dataservice.dispatcher.snapshots import SnapshotCoordinator
from dataservice.dispatcher.state import (
    ClientId,
    DatasetId,
    DispatcherState,
    IterationId,
    Job,
    Task,
    TaskId,
    WorkerAddress,
)
from dataservice.dispatcher.task_changes import TaskChanges
from dataservice.monitoring.logs import ids
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import policy, sharding, splits
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# Journal updates between two snapshots.
DEFAULT_SNAPSHOT_EVERY = 10_000
# Most splits one GetSplits answer hands out.
DEFAULT_MAX_SPLITS = 1024
# A range is at most 1/(this x unfinished tasks) of the splits left.
RANGE_SHARE_DIVISOR = 8
# Coordinated reads: the fewest rounds granted ahead of the clients, how many seconds of
# reading (at the rate the clients report) a grant covers, and how often the rate is measured.
MIN_ROUND_WINDOW = 16
ROUND_WINDOW_S = 4.0
ROUND_RATE_PERIOD_S = 0.5
# A restored iterator's tasks go to workers heard from within this many seconds, where there are any.
RESUME_RECENT_S = 3.0
_POLICY_NAMES = {v: k for k, v in common_pb2.ShardingPolicy.items()}
_TARGET_NAMES = {v: k for k, v in common_pb2.TargetWorkers.items()}


class WorkerNotifier(Protocol):
    """Tells workers at once what their next heartbeat would tell them anyway (best effort)."""

    def process_task(self, worker_address: str, task: common_pb2.TaskDef) -> None: ...

    def prepare_dataset(self, worker_address: str, dataset_id: str) -> None: ...


class NoNotifier:
    """Workers learn everything from their heartbeats."""

    def process_task(self, worker_address: str, task: common_pb2.TaskDef) -> None:
        pass

    def prepare_dataset(self, worker_address: str, dataset_id: str) -> None:
        pass


def split_range_size(remaining: int, unfinished_tasks: int, max_splits: int) -> int:
    """How many splits one GetSplits answer hands out: a small share of what is left, so that
    the last splits spread over the workers and a lost worker takes at most the one range it
    had started with it; at least 1, at most `max_splits`."""
    fair = max(1, remaining // (RANGE_SHARE_DIVISOR * max(1, unfinished_tasks)))
    return min(max_splits, fair)


class DispatcherCore:
    """The dispatcher's request handling and garbage collection; thread-safe."""

    def __init__(
        self,
        config: DispatcherConfig,
        address: str,
        *,
        journal: JournalWriter | None = None,
        state: DispatcherState | None = None,
        datasets: DatasetStore | None = None,
        notifier: WorkerNotifier | None = None,
        clock: Clock = time.monotonic,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ):
        self._config = config
        self._address = address
        self._journal = journal
        self._snapshot_every = snapshot_every
        self._since_snapshot = 0
        self._state = state or DispatcherState()
        self._datasets = datasets or DatasetStore(config.work_dir, config.graph_memory_bytes)
        self._notifier: WorkerNotifier = notifier or NoNotifier()
        self._clock = clock
        self._lock = threading.RLock()
        now = clock()
        self._client_seen: dict[ClientId, float] = {c: now for c in self._state.client_ids()}
        self._worker_seen: dict[WorkerAddress, float] = {w: now for w in self._state.alive_workers()}
        # Named iterations without clients, since when: ended after job_gc_timeout_ms.
        self._idle_since: dict[IterationId, float] = {}
        # Finished iterations without clients, since when (as first seen so; after a restart,
        # from the restart): dropped after iteration_retention_ms.
        self._retired_since: dict[IterationId, float] = {}
        # Coordinated reads: iteration -> (time, round, rounds/s) of the clients' reports.
        self._round_reports: dict[IterationId, tuple[float, int, float]] = {}
        # Clients' and workers' rates, for metrics and the worker recommendation.
        self._load = LoadTracker()
        # Which tasks changed when: client heartbeats answer with the changes only.
        self._task_changes = TaskChanges()
        self._started = now
        self._snapshots = SnapshotCoordinator(
            self._state,
            self._commit,
            self._lock,
            self._datasets,
            self._dataset,
            config.fault_tolerant_mode,
            config.worker_max_concurrent_snapshots,
            self._where(),
            snapshot_roots=config.snapshot_roots,
        )
        self._snapshots.repair_files()

    # ---- reading the state ---------------------------------------------------

    def summary(self) -> dict[str, int]:
        """Counts of datasets, workers, jobs, iterations, tasks and clients."""
        with self._lock:
            return self._state.summary()

    def validate(self) -> None:
        with self._lock:
            self._state.validate()

    def status(self) -> dict:
        """The status document (dispatcher/status_report.py): workers, datasets, jobs with their
        iterations and load, clients, and the elements/s history."""
        with self._lock:
            now = self._clock()
            info = status_report.DispatcherInfo(
                address=self._address,
                fault_tolerant_mode=self._config.fault_tolerant_mode,
                work_dir=self._config.work_dir,
                uptime_s=now - self._started,
                journal_appends=self._journal.appended if self._journal is not None else 0,
            )
            report = status_report.build(self._state, self._load, info, self._worker_seen, self._client_seen, now)
            report["snapshots"] = self._snapshots.status()
            return report

    def get_status(self, request: dispatcher_pb2.GetStatusRequest) -> dispatcher_pb2.GetStatusResponse:
        return dispatcher_pb2.GetStatusResponse(status_json=json.dumps(self.status()))

    # ---- committing changes ----------------------------------------------------

    def _commit(self, **change) -> None:
        """Journals, then applies, one Update. Call with self._lock held.

        A journal that cannot be written (disk full, I/O error) fails the request with
        UNAVAILABLE and nothing is applied: clients retry, and succeed once the disk does."""
        update = journal_pb2.Update(**change)
        if self._journal is not None:
            try:
                self._journal.append(update)
            except OSError as e:
                log.error("journal write failed, %s not made: %s", update.WhichOneof("kind"), e)
                raise status.unavailable(
                    f"{self._where()} cannot write its journal ({e.strerror or e}); the change was not made. "
                    "It is retried; free space on the work_dir's disk if this persists"
                ) from None
        self._state.apply(update)
        self._task_changes.record(update, self._state)
        if self._journal is not None:
            self._since_snapshot += 1
            if self._since_snapshot >= self._snapshot_every:
                # Keeps recovery time flat however long the dispatcher runs; written in the
                # background from the journal's own files, so requests do not wait for it. A
                # snapshot that fails loses nothing (the segments stay): the next one is tried later.
                try:
                    if self._journal.snapshot_in_background(_rebuild):
                        self._since_snapshot = 0
                except OSError as e:
                    self._since_snapshot = 0
                    log.error("starting a journal snapshot failed (the journal is whole; retried later): %s", e)

    def snapshot_soon(self) -> None:
        """Makes the next journaled change also write a snapshot (as every snapshot_every-th does)."""
        with self._lock:
            self._since_snapshot = self._snapshot_every

    def wait_for_snapshot(self, timeout_s: float) -> bool:
        """Waits for a snapshot being written to be on disk; False on timeout."""
        return self._journal is None or self._journal.wait_for_snapshot(timeout_s)

    def _where(self) -> str:
        return f"the dispatcher at {self._address}"

    # ---- datasets --------------------------------------------------------------

    def register_dataset(
        self, request: dispatcher_pb2.RegisterDatasetRequest
    ) -> dispatcher_pb2.RegisterDatasetResponse:
        if len(request.graph_def) > self._config.max_graph_bytes:
            raise status.ServiceError(
                status.Code.RESOURCE_EXHAUSTED,
                f"the dataset graph is {len(request.graph_def):,} bytes, over {self._where()}'s max_graph_bytes "
                f"({self._config.max_graph_bytes:,}): read large data from files in the pipeline rather than "
                "embedding it, or raise max_graph_bytes",
            )
        try:
            graph = graph_lib.parse_graph(request.graph_def)
            element_spec = graph_lib.decode_element_spec(request.metadata.element_spec)
            graph_lib.check_element_spec(element_spec)
        except graph_lib.InvalidDatasetError as e:
            raise status.invalid_argument(f"cannot register the dataset: {e}") from None
        except Exception as e:  # noqa: BLE001 - a malformed spec proto raises many kinds
            raise status.invalid_argument(f"cannot register the dataset: unreadable element_spec ({e})") from None
        if not self._config.allow_unsafe_ops:
            try:
                policy.check(graph)
            except policy.UnsafeDatasetError as e:
                log.warning("dataset refused: %s", e.op, extra=ids(dataset_id=request.requested_dataset_id))
                raise status.permission_denied(f"{self._where()} cannot register the dataset: {e}") from None
        try:
            graph_lib.dataset_from_graph(request.graph_def, element_spec)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            message = getattr(e, "message", str(e))
            raise status.invalid_argument(
                f"cannot register the dataset: its graph does not import ({message})"
            ) from None
        fingerprint = graph_lib.fingerprint(graph)
        requested = request.requested_dataset_id
        with self._lock:
            if requested:
                existing = self._state.dataset(requested)
                if existing is not None:
                    if existing.fingerprint != fingerprint:
                        raise status.already_exists(
                            f"dataset id {requested!r} is already registered with a different dataset"
                        )
                    dataset_id = DatasetId(requested)
                else:
                    dataset_id = self._register(DatasetId(requested), fingerprint, request)
            else:
                dataset_id = self._state.dataset_with_fingerprint(fingerprint) or self._register(
                    self._state.next_dataset_id(), fingerprint, request
                )
            workers = self._state.alive_workers() if request.prepare_workers else []
        for worker_address in workers:
            self._notifier.prepare_dataset(worker_address, dataset_id)
        return dispatcher_pb2.RegisterDatasetResponse(dataset_id=dataset_id)

    def _register(self, dataset_id: DatasetId, fingerprint: str, request) -> DatasetId:
        """Stores the graph durably, then journals the dataset. Call with self._lock held."""
        try:
            self._datasets.put(dataset_id, request.graph_def)
        except OSError as e:
            log.error("storing the graph of dataset %s failed: %s", dataset_id, e)
            raise status.unavailable(
                f"{self._where()} cannot store the dataset's graph in its work_dir ({e.strerror or e}); "
                "it was not registered. It is retried; free space on the work_dir's disk if this persists"
            ) from None
        self._commit(
            register_dataset=journal_pb2.RegisterDatasetUpdate(
                dataset_id=dataset_id, fingerprint=fingerprint, metadata=request.metadata
            )
        )
        log.info("dataset registered", extra=ids(dataset_id=dataset_id))
        return dataset_id

    def _dataset(self, dataset_id: str):
        if not dataset_id:
            raise status.invalid_argument("dataset_id must not be empty")
        dataset = self._state.dataset(dataset_id)
        if dataset is None:
            raise status.not_found(
                f"dataset id {dataset_id!r} is not registered with {self._where()}; "
                "register it with register_dataset() first"
            )
        return dataset

    def get_data_service_metadata(self, request: dispatcher_pb2.GetDataServiceMetadataRequest):
        with self._lock:
            return dispatcher_pb2.GetDataServiceMetadataResponse(metadata=self._dataset(request.dataset_id).metadata)

    def get_element_spec(self, request: dispatcher_pb2.GetElementSpecRequest):
        with self._lock:
            spec = self._dataset(request.dataset_id).metadata.element_spec
        return dispatcher_pb2.GetElementSpecResponse(element_spec=spec)

    def get_dataset_def(self, request: dispatcher_pb2.GetDatasetDefRequest):
        with self._lock:
            metadata = self._dataset(request.dataset_id).metadata
        graph_def = self._datasets.get(request.dataset_id)
        if graph_def is None:
            raise status.failed_precondition(
                f"the graph of dataset {request.dataset_id!r} is missing from the work_dir"
            )
        return dispatcher_pb2.GetDatasetDefResponse(graph_def=graph_def, metadata=metadata)

    # ---- jobs and iterations ---------------------------------------------------

    def get_or_create_job(self, request: dispatcher_pb2.GetOrCreateJobRequest):
        policy = request.processing_mode.sharding_policy
        if policy not in _POLICY_NAMES:
            raise status.invalid_argument(f"unknown sharding policy {policy}")
        if request.num_consumers < 0:
            raise status.invalid_argument(f"num_consumers must be >= 0, got {request.num_consumers}")
        if request.num_consumers and not request.job_name:
            raise status.invalid_argument("coordinated reads (num_consumers) need a job_name")
        with self._lock:
            dataset = self._dataset(request.dataset_id)
            # A known, finite cardinality is refused; an unknown one (a flat_map, a filter) is the
            # pipeline's to keep going, as in TensorFlow's service.
            if request.num_consumers and dataset.metadata.cardinality >= 0:
                raise status.failed_precondition(
                    f"coordinated reads (num_consumers) need an infinite dataset, but dataset {request.dataset_id!r} "
                    f"has cardinality {dataset.metadata.cardinality}: add .repeat() to the pipeline, so that no "
                    "consumer runs out of rounds before the others"
                )
            if request.use_cross_trainer_cache:
                problem = modes.cross_trainer_cache_problem(
                    request.job_name, request.num_consumers, dataset.metadata.cardinality
                )
                if problem:
                    raise status.invalid_argument(problem)
            existing = self._named_job(request)
        if existing is not None:
            return dispatcher_pb2.GetOrCreateJobResponse(job_id=existing)
        split_group_sizes = self._check_policy(policy, request.dataset_id, dataset.metadata)
        with self._lock:
            existing = self._named_job(request)  # created meanwhile by another client?
            if existing is not None:
                return dispatcher_pb2.GetOrCreateJobResponse(job_id=existing)
            job_id = self._create_job(request, split_group_sizes)
        log.info(
            "job created (%s)",
            status_report.PROCESSING_MODES.get(policy, policy),
            extra=ids(job_id=job_id, job_name=request.job_name, dataset_id=request.dataset_id),
        )
        return dispatcher_pb2.GetOrCreateJobResponse(job_id=job_id)

    def _create_job(self, request: dispatcher_pb2.GetOrCreateJobRequest, split_group_sizes: Sequence[int]) -> int:
        """Journals the job `request` asks for. Call with self._lock held."""
        job_id = self._state.next_id("job")
        self._commit(
            create_job=journal_pb2.CreateJobUpdate(
                job_id=job_id,
                dataset_id=request.dataset_id,
                processing_mode=request.processing_mode,
                job_name=request.job_name,
                num_consumers=request.num_consumers,
                target_workers=request.target_workers,
                split_group_sizes=split_group_sizes,
                use_cross_trainer_cache=request.use_cross_trainer_cache,
            )
        )
        return job_id

    def _check_policy(self, policy: int, dataset_id: str, metadata) -> list[int]:
        """Checks that the dataset can be processed under `policy` (outside the lock:
        it parses the graph); returns the split group sizes for distributed_epoch."""
        if policy == common_pb2.SHARDING_POLICY_OFF:
            return []
        graph_bytes = self._datasets.get(dataset_id)
        if graph_bytes is None:
            raise status.failed_precondition(f"the graph of dataset {dataset_id!r} is missing from the work_dir")
        if policy == common_pb2.SHARDING_POLICY_DYNAMIC:
            try:
                return splits.group_sizes(splits.find_sources(graph_lib.parse_graph(graph_bytes)))
            except (splits.UnsplittableDatasetError, graph_lib.InvalidDatasetError) as e:
                raise status.invalid_argument(str(e)) from None
        if not self._config.worker_addresses:
            raise status.failed_precondition(
                f"sharding policy {_POLICY_NAMES[policy]} needs a dispatcher configured with worker_addresses "
                "(the fixed list of workers whose index picks each worker's shard)"
            )
        try:
            sharding.shard(
                graph_lib.dataset_from_graph(graph_bytes, graph_lib.decode_element_spec(metadata.element_spec)),
                policy,
                len(self._config.worker_addresses),
                0,
            )
        except tf.errors.OpError as e:
            # TensorFlow's message ends with a dump of the whole source node: keep its first line.
            reason = re.sub(r"\{\{.*?\}\}\s*", "", e.message).split("\n")[0].strip()
            raise status.invalid_argument(
                f"cannot shard dataset {dataset_id!r} with policy {_POLICY_NAMES[policy]}: {reason} "
                "(FILE sharding needs a file-based source such as list_files or TFRecordDataset of a file list; "
                "DATA or FILE_OR_DATA shard any dataset)"
            ) from None
        return []

    def _named_job(self, request) -> int | None:
        """The id of the job named in the request, if it exists and matches it. Call with self._lock held."""
        job = self._state.job_named(request.dataset_id, request.job_name) if request.job_name else None
        if job is None:
            return None
        _check_same_job(job, request)
        return job.job_id

    def get_or_create_iteration(self, request: dispatcher_pb2.GetOrCreateIterationRequest):
        new_tasks: list[common_pb2.TaskDef] = []
        with self._lock:
            job = self._state.job(request.job_id)
            if job is None and self._state.was_dropped("job", request.job_id):
                raise status.not_found(f"job {request.job_id} {self._dropped_reason()}: create the job again")
            if job is None:
                raise status.not_found(
                    f"job {request.job_id} is not known to {self._where()} "
                    "(did the dispatcher restart without fault_tolerant_mode?)"
                )
            if request.repetition < 0:
                raise status.invalid_argument(f"repetition must be >= 0, got {request.repetition}")
            if job.use_cross_trainer_cache and request.repetition > 0:
                raise status.invalid_argument(
                    "Cross-trainer caching requires infinite datasets and disallows multiple repetitions of the "
                    f"same dataset. Got repetition {request.repetition + 1} (a pass over the dataset after the "
                    "first: iterate it once, or create the dataset again with another trainer_id)"
                )
            iteration_id = job.iterations.get(request.repetition)
            if iteration_id is None:
                iteration_id = self._state.next_id("iteration")
                self._commit(
                    create_iteration=journal_pb2.CreateIterationUpdate(
                        iteration_id=iteration_id,
                        job_id=job.job_id,
                        repetition=request.repetition,
                        read_key=read_keys.new_secret(),
                    )
                )
                log.info(
                    "iteration created (repetition %d)",
                    request.repetition,
                    extra=ids(job_id=job.job_id, iteration_id=iteration_id),
                )
                for worker_address in self._state.alive_workers():
                    new_tasks.append(self._create_task(IterationId(iteration_id), worker_address))
            client_id = self._acquire_client(IterationId(iteration_id))
            log.info("client joined", extra=ids(job_id=job.job_id, iteration_id=iteration_id, client_id=client_id))
        for task in new_tasks:
            self._notifier.process_task(task.worker_address, task)
        read_key = read_keys.client_key(self._state.iteration(iteration_id).read_key, client_id)
        return dispatcher_pb2.GetOrCreateIterationResponse(
            iteration_client_id=client_id, iteration_id=iteration_id, read_key=read_key
        )

    def _acquire_client(self, iteration_id: IterationId) -> ClientId:
        """Journals a new client of the iteration, heard from now. Call with self._lock held."""
        client_id = ClientId(self._state.next_id("client"))
        self._commit(
            acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(
                iteration_client_id=client_id, iteration_id=iteration_id
            )
        )
        self._client_seen[client_id] = self._clock()
        self._idle_since.pop(iteration_id, None)
        self._retired_since.pop(iteration_id, None)
        return client_id

    def resume_iteration(self, request: dispatcher_pb2.ResumeIterationRequest):
        """A new iteration continuing the one a restored iterator had saved (see resume.py), and a
        client of it. The saved tasks name the iteration; the job asked for must be theirs."""
        job_request = request.job
        if job_request.num_consumers:
            raise status.invalid_argument("an iterator with coordinated reads (num_consumers) cannot be resumed")
        if not request.progress:
            raise status.invalid_argument("the saved progress names no task")
        consumed: dict[int, int] = {}
        for p in request.progress:
            if p.elements < 0:
                raise status.invalid_argument(f"task {p.task_id}: elements must be >= 0, got {p.elements}")
            if p.task_id in consumed:
                raise status.invalid_argument(f"the saved progress names task {p.task_id} twice")
            consumed[p.task_id] = p.elements
        new_tasks: list[common_pb2.TaskDef] = []
        with self._lock:
            saved_tasks = [self._state.task(t) for t in consumed]
            unknown = [t for t, task in zip(consumed, saved_tasks) if task is None]
            dropped = [t for t in unknown if self._state.was_dropped("task", t)]
            if dropped:
                raise status.not_found(
                    f"the checkpoint was saved while reading task {dropped[0]}, whose iteration "
                    f"{self._dropped_reason()}: the saved input position is gone. Restore the checkpoint without "
                    "the iterator to start the input anew, or raise iteration_retention_ms to resume older "
                    "checkpoints"
                )
            if unknown:
                raise status.not_found(
                    f"the checkpoint was saved while reading task {unknown[0]}, which {self._where()} does not "
                    "know: the dispatcher restarted without fault_tolerant_mode or with another work_dir, so the "
                    "saved input position is lost. Restore the checkpoint without the iterator to start the input "
                    "anew, or run the dispatcher with fault_tolerant_mode=True and a persistent work_dir"
                )
            iteration_ids = sorted({t.iteration_id for t in saved_tasks})
            if len(iteration_ids) > 1:
                raise status.invalid_argument(f"the saved tasks belong to several iterations: {iteration_ids}")
            saved_iteration = self._state.iteration(iteration_ids[0])
            _check_receipts(saved_iteration.read_key, request.progress)
            saved_job = self._state.job_of(saved_iteration)
            _check_resumable(saved_job, job_request)
            dataset = self._dataset(job_request.dataset_id)  # still registered
            saved = self._state.tasks_of(saved_iteration)
            positions = resume.positions(saved, consumed)
            _check_positions(saved_job.sharding_policy, dataset.metadata.cardinality, positions, consumed)
            alive = self._state.alive_workers()
            # Workers heard from lately first: a worker killed with the trainer (a replaced pod) is
            # still alive here until worker_timeout_ms, and a task given to it would wait that long.
            now = self._clock()
            recent = [w for w in alive if now - self._worker_seen.get(w, -math.inf) <= RESUME_RECENT_S]
            alive = recent or alive
            if not alive:
                raise status.unavailable(
                    f"no worker is registered with {self._where()}: the restored iterator resumes once one is"
                )
            planned = resume.plan_tasks(saved_job.sharding_policy, saved, positions, alive)
            # A job of its own, anonymous: released with its one client.
            anonymous = dispatcher_pb2.GetOrCreateJobRequest()
            anonymous.CopyFrom(job_request)
            anonymous.job_name = ""
            job_id = self._create_job(anonymous, saved_job.split_group_sizes)
            iteration_id = IterationId(self._state.next_id("iteration"))
            self._commit(
                create_iteration=journal_pb2.CreateIterationUpdate(
                    iteration_id=iteration_id,
                    job_id=job_id,
                    repetition=saved_iteration.repetition,
                    resumes_iteration_id=saved_iteration.iteration_id,
                    read_key=read_keys.new_secret(),
                )
            )
            self._copy_splits(saved_iteration, iteration_id)
            for plan in planned:
                new_tasks.append(self._create_task(iteration_id, plan.worker_address, plan.skip_elements, plan.replay))
            client_id = self._acquire_client(iteration_id)
            log.info(
                "iteration resumed from iteration %d (repetition %d, %d elements consumed)",
                saved_iteration.iteration_id,
                saved_iteration.repetition,
                sum(consumed.values()),
                extra=ids(job_id=job_id, iteration_id=iteration_id, client_id=client_id),
            )
        for task in new_tasks:
            self._notifier.process_task(task.worker_address, task)
        return dispatcher_pb2.ResumeIterationResponse(
            iteration_client_id=client_id,
            iteration_id=iteration_id,
            repetition=saved_iteration.repetition,
            task_ids=[t.task_id for t in new_tasks],
            read_key=read_keys.client_key(self._state.iteration(iteration_id).read_key, client_id),
        )

    def _copy_splits(self, saved_iteration, iteration_id: IterationId) -> None:
        """Gives a resumed iteration the saved one's split positions and pool: the splits that no
        saved task received. Call with self._lock held."""
        for group, (repetition, end) in sorted(saved_iteration.split_positions.items()):
            self._commit(
                produce_splits=journal_pb2.ProduceSplitsUpdate(
                    iteration_id=iteration_id, split_group=group, repetition=repetition, begin=end, end=end
                )
            )
        for (group, repetition), pool in sorted(saved_iteration.returned_splits.items()):
            for begin, end in pool:
                self._commit(
                    return_splits=journal_pb2.ReturnSplitsUpdate(
                        iteration_id=iteration_id, split_group=group, repetition=repetition, begin=begin, end=end
                    )
                )

    def _create_task(
        self,
        iteration_id: IterationId,
        worker_address: str,
        skip_elements: int = 0,
        replay: Sequence[journal_pb2.SplitRange] = (),
    ) -> common_pb2.TaskDef:
        iteration = self._state.iteration(iteration_id)
        task_id = self._state.next_id("task")
        # Coordinated reads: no client may have read this round yet, so every
        # client adds the task to its rotation at the same round.
        coordinated = self._state.job_of(iteration).num_consumers > 0
        self._commit(
            create_task=journal_pb2.CreateTaskUpdate(
                task_id=task_id,
                iteration_id=iteration_id,
                worker_address=worker_address,
                starting_round=iteration.round_limit if coordinated else 0,
                skip_elements=skip_elements,
                replay=replay,
            )
        )
        log.info(
            "task created",
            extra=ids(job_id=iteration.job_id, iteration_id=iteration_id, task_id=task_id, worker=worker_address),
        )
        return self._task_def(self._state.task(task_id))

    def _task_def(self, task: Task) -> common_pb2.TaskDef:
        task_def = self._state.task_def(task, tuple(self._config.worker_addresses or ()))
        # Not state: what the job's other tasks measured, for the worker's first chunks.
        task_def.seconds_per_element = self._load.seconds_per_element(task_def.job_id) or 0.0
        return task_def

    # ---- clients ---------------------------------------------------------------

    def _client_iteration(self, client_id: int, read_key: str):
        """The iteration of the client `client_id`, which must present its read key."""
        iteration = self._state.iteration_of_client(client_id)
        if iteration is None:
            raise status.not_found(
                f"iteration client {client_id} is not known to {self._where()}: it was released, timed out, "
                "or the dispatcher restarted without fault_tolerant_mode"
            )
        if not read_keys.matches(read_key, iteration.read_key, client_id):
            raise status.permission_denied(
                f"iteration client {client_id}: the read key is wrong; only the client the dispatcher gave that id "
                "to may act for it"
            )
        return iteration

    def client_heartbeat(self, request: dispatcher_pb2.ClientHeartbeatRequest):
        _check_totals(
            "client heartbeat",
            elements_received=request.elements_received,
            bytes_received=request.bytes_received,
            wait_seconds=request.wait_seconds,
            consume_seconds=request.consume_seconds,
        )
        with self._lock:
            iteration = self._client_iteration(request.iteration_client_id, request.read_key)
            now = self._clock()
            self._client_seen[ClientId(request.iteration_client_id)] = now
            self._load.report_client(
                iteration.job_id,
                request.iteration_client_id,
                now,
                request.elements_received,
                request.bytes_received,
                request.wait_seconds,
                request.consume_seconds,
            )
            if self._state.job_of(iteration).num_consumers:
                self.extend_rounds(iteration.iteration_id, request.current_round, now)
            for task_id in request.consumed_tasks:
                self._record_consumed(iteration, task_id)
            response = dispatcher_pb2.ClientHeartbeatResponse(
                iteration_finished=iteration.finished,
                round_limit=iteration.round_limit,
                tasks_version=self._task_changes.version,
            )
            changed = self._task_changes.changed_since(iteration.iteration_id, request.tasks_version)
            for task, worker in self._state.task_infos(iteration, changed):
                response.tasks.add(
                    task_id=task.task_id,
                    worker_address=worker.address,
                    transfer_address=worker.transfer_address,
                    finished=task.finished,
                    starting_round=task.starting_round,
                    lost=task.lost,
                    worker_tags=worker.tags,
                )
        return response

    def _clients_finish_tasks(self, job: Job) -> bool:
        """parallel_epochs (not coordinated reads): a task is finished once a client of its
        iteration has consumed its end, not when its worker has sent it, so that a worker that
        registers while the client still reads buffered elements gets a task and is read too.
        (Not every client: consumers stepped in turn by one thread would wait on each other.)"""
        return job.sharding_policy == common_pb2.SHARDING_POLICY_OFF and not job.num_consumers

    def _record_consumed(self, iteration, task_id: int) -> None:
        task = self._state.task(task_id)
        if task is None or task.iteration_id != iteration.iteration_id:
            raise status.invalid_argument(
                f"consumed task {task_id} is not a task of iteration {iteration.iteration_id}"
            )
        if not task.finished and self._clients_finish_tasks(self._state.job_of(iteration)):
            self._commit(finish_task=journal_pb2.FinishTaskUpdate(task_id=task.task_id))
            self._log_task_finished(task)

    def _log_task_finished(self, task: Task) -> None:
        iteration = self._state.iteration(task.iteration_id)
        log.info(
            "task finished%s",
            " (iteration finished)" if iteration.finished else "",
            extra=ids(
                job_id=iteration.job_id,
                iteration_id=iteration.iteration_id,
                task_id=task.task_id,
                worker=task.worker_address,
            ),
        )

    def extend_rounds(self, iteration_id: int, current_round: int, now: float) -> None:
        """Coordinated reads: grants the iteration's clients rounds ahead of the most advanced of
        them, a few seconds' worth at the rate they read (at least MIN_ROUND_WINDOW), journaled
        only when half the grant is used."""
        if current_round < 0:
            raise status.invalid_argument(f"current_round must be >= 0, got {current_round}")
        with self._lock:
            iteration = self._state.iteration(iteration_id)
            key = iteration.iteration_id
            last_time, last_round, rate = self._round_reports.get(key, (now, current_round, 0.0))
            if now - last_time >= ROUND_RATE_PERIOD_S:
                rate = max(0, current_round - last_round) / (now - last_time)
                self._round_reports[key] = (now, max(current_round, last_round), rate)
            elif key not in self._round_reports:
                self._round_reports[key] = (now, current_round, 0.0)
            window = max(MIN_ROUND_WINDOW, int(rate * ROUND_WINDOW_S))
            if current_round + window // 2 >= iteration.round_limit:
                self._commit(
                    extend_rounds=journal_pb2.ExtendRoundsUpdate(iteration_id=key, round_limit=current_round + window)
                )

    def release_iteration_client(self, request: dispatcher_pb2.ReleaseIterationClientRequest):
        with self._lock:
            self._client_iteration(request.iteration_client_id, request.read_key)
            self._release_client(ClientId(request.iteration_client_id))
        return dispatcher_pb2.ReleaseIterationClientResponse()

    def _release_client(self, client_id: ClientId) -> None:
        iteration = self._state.iteration_of_client(client_id)
        self._commit(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=client_id))
        self._client_seen.pop(client_id, None)
        self._load.forget_client(client_id)
        log.info(
            "client left", extra=ids(job_id=iteration.job_id, iteration_id=iteration.iteration_id, client_id=client_id)
        )
        if iteration.client_ids or iteration.finished:
            return
        if self._state.job_of(iteration).job_name:
            # Another client may still join a named job: keep it until job_gc_timeout_ms.
            self._idle_since[iteration.iteration_id] = self._clock()
        else:
            self._commit(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=iteration.iteration_id))

    def get_workers(self, request: dispatcher_pb2.GetWorkersRequest):
        with self._lock:
            return dispatcher_pb2.GetWorkersResponse(
                workers=[
                    dispatcher_pb2.WorkerInfo(address=w.address, transfer_address=w.transfer_address)
                    for w in self._state.workers()
                ]
            )

    # ---- garbage collection ------------------------------------------------------

    def gc_interval_s(self) -> float:
        """How often collect_garbage() should run: a quarter of the shortest timeout it enforces."""
        config = self._config
        return min(config.job_gc_check_interval_ms, config.client_timeout_ms, config.worker_timeout_ms) / 4000

    def collect_garbage(self) -> None:
        """Removes workers silent for worker_timeout_ms (their unfinished tasks are lost and their
        unstarted split ranges return to the pool), releases clients silent for
        client_timeout_ms, ends named iterations nobody has read for job_gc_timeout_ms, and
        drops iterations finished without clients for iteration_retention_ms."""
        with self._lock:
            now = self._clock()
            for address, seen in list(self._worker_seen.items()):
                if now - seen > self._config.worker_timeout_ms / 1000:
                    lost = self._state.lost_tasks_of(address)
                    log.warning(
                        "worker missing for %.1f s: removed, tasks %s lost",
                        now - seen,
                        lost,
                        extra=ids(worker=address),
                    )
                    self._commit(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=address, lost_tasks=lost))
                    del self._worker_seen[address]
                    self._load.forget_worker(address)
                    self._snapshots.assignments.forget_worker(address)
            for client_id, seen in list(self._client_seen.items()):
                timed_out = now - seen > self._config.client_timeout_ms / 1000
                if timed_out and self._state.iteration_of_client(client_id) is not None:
                    log.info("client silent for %.1f s: released", now - seen, extra=ids(client_id=client_id))
                    self._release_client(client_id)
            for iteration_id, since in list(self._idle_since.items()):
                iteration = self._state.iteration(iteration_id)
                if iteration.client_ids or iteration.finished:
                    del self._idle_since[iteration_id]
                elif self._config.job_gc_timeout_ms != NEVER and now - since > self._config.job_gc_timeout_ms / 1000:
                    log.info(
                        "iteration without clients for %.1f s: ended",
                        now - since,
                        extra=ids(job_id=iteration.job_id, iteration_id=iteration_id),
                    )
                    self._commit(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=iteration_id))
                    del self._idle_since[iteration_id]
            self._drop_retired_iterations(now)

    def _drop_retired_iterations(self, now: float) -> None:
        """Drops the iterations finished without clients for iteration_retention_ms, and with
        the last iteration of a job the job (its name is free again, its rates forgotten).
        Call with self._lock held."""
        retention_ms = self._config.iteration_retention_ms
        if retention_ms == NEVER:
            return
        retired = {iteration.iteration_id for iteration in self._state.retired_iterations()}
        for iteration_id in list(self._retired_since):
            if iteration_id not in retired:  # a reader joined it again (a named job's repetition)
                del self._retired_since[iteration_id]
        for iteration_id in sorted(retired):
            since = self._retired_since.setdefault(iteration_id, now)
            if now - since <= retention_ms / 1000:
                continue
            job_id = self._state.iteration(iteration_id).job_id
            self._commit(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=iteration_id))
            del self._retired_since[iteration_id]
            self._round_reports.pop(iteration_id, None)
            self._idle_since.pop(iteration_id, None)
            job_dropped = self._state.job(job_id) is None
            if job_dropped:
                self._load.forget_job(job_id)
            log.info(
                "iteration dropped after %.0f s finished without clients%s",
                now - since,
                " (and its job)" if job_dropped else "",
                extra=ids(job_id=job_id, iteration_id=iteration_id),
            )

    def _dropped_reason(self) -> str:
        """Why an id in use once is not known any more, for NOT_FOUND messages."""
        return (
            "ended and was dropped after iteration_retention_ms "
            f"({self._config.iteration_retention_ms} ms) without clients"
        )

    # ---- workers -----------------------------------------------------------------

    def worker_heartbeat(self, request: dispatcher_pb2.WorkerHeartbeatRequest):
        address = WorkerAddress(request.worker_address)
        if not address:
            raise status.invalid_argument("worker_address must not be empty")
        allowed = self._config.worker_addresses
        if allowed and address not in allowed:
            raise status.failed_precondition(
                f"worker {address} is not in the dispatcher's worker_addresses {list(allowed)}: start it with "
                "one of those addresses (--worker_address) or restart the dispatcher with a list naming it"
            )
        with self._lock:
            self._worker_seen[address] = self._clock()
            known = self._state.worker(address)
            uid = request.worker_uid
            if known is not None and known.alive and uid and known.uid and known.uid != uid:
                # A new process at the address (a restarted pod keeps its name): the old one's
                # tasks are lost, their unstarted splits go back to the pool.
                lost = self._state.lost_tasks_of(address)
                log.warning("worker restarted: tasks %s of its previous process lost", lost, extra=ids(worker=address))
                self._commit(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=address, lost_tasks=lost))
                self._load.forget_worker(address)
                self._snapshots.assignments.forget_worker(address)
                known = self._state.worker(address)
            tags = sorted(set(request.worker_tags))
            if known is None or not known.alive or (uid and not known.uid) or known.tags != tags:
                # New, back after it was lost, learning its uid (journaled before uids were), or
                # restarted with other tags.
                self._commit(
                    register_worker=journal_pb2.RegisterWorkerUpdate(
                        worker_address=address,
                        transfer_address=request.transfer_address or address,
                        worker_uid=uid,
                        worker_tags=tags,
                    )
                )
                log.info("worker registered", extra=ids(worker=address))
                for iteration in list(self._state.unfinished_iterations()):
                    if not self._state.iteration_has_task_on(iteration, address):
                        self._create_task(iteration.iteration_id, address)
            self._record_task_loads(address, request.task_loads)
            active = {t.task_id: t for t in self._state.active_tasks_of_worker(address)}
            current = set(request.current_tasks)
            chunks, chunks_to_drop = self._snapshots.heartbeat(address, request.current_snapshot_chunks)
            return dispatcher_pb2.WorkerHeartbeatResponse(
                new_tasks=[self._task_def(t) for tid, t in sorted(active.items()) if tid not in current],
                tasks_to_delete=sorted(current - set(active)),
                snapshot_chunks=chunks,
                snapshot_chunks_to_drop=chunks_to_drop,
            )

    def _record_task_loads(self, address: WorkerAddress, loads) -> None:
        """Takes the worker's production totals per task into the load tracker. Reports of tasks
        that are not this worker's (ended, or hostile) are left out, not an error: a worker may
        report a task the dispatcher has just dropped."""
        now = self._clock()
        for load in loads:
            _check_totals(
                f"worker heartbeat (task {load.task_id})",
                elements_produced=load.elements_produced,
                bytes_produced=load.bytes_produced,
                processing_seconds=load.processing_seconds,
            )
            task = self._state.task(load.task_id)
            if task is None or task.worker_address != address:
                continue
            job_id = self._state.iteration(task.iteration_id).job_id
            self._load.report_task(
                job_id,
                address,
                task.task_id,
                now,
                load.elements_produced,
                load.bytes_produced,
                load.processing_seconds,
            )

    def worker_update(self, request: dispatcher_pb2.WorkerUpdateRequest):
        with self._lock:
            if self._state.worker(request.worker_address) is None:
                raise status.not_found(f"worker {request.worker_address!r} is not registered with {self._where()}")
            for task_id in request.finished_tasks:
                task = self._state.task(task_id)
                if task is None and self._state.was_dropped("task", task_id):
                    continue  # finished long ago: retention dropped it
                if task is None:
                    raise status.not_found(f"task {task_id} is not known to {self._where()}")
                if task.worker_address != request.worker_address:
                    raise status.invalid_argument(
                        f"task {task_id} belongs to worker {task.worker_address}, not {request.worker_address}"
                    )
                clients_finish = self._clients_finish_tasks(
                    self._state.job_of(self._state.iteration(task.iteration_id))
                )
                if not task.finished and not clients_finish:
                    self._commit(finish_task=journal_pb2.FinishTaskUpdate(task_id=task_id))
                    self._log_task_finished(task)
        return dispatcher_pb2.WorkerUpdateResponse()

    # ---- distributed_save ------------------------------------------------------------

    def snapshot(self, request: dispatcher_pb2.SnapshotRequest) -> dispatcher_pb2.SnapshotResponse:
        return self._snapshots.start(request)

    def commit_snapshot_chunk(self, request: dispatcher_pb2.CommitSnapshotChunkRequest):
        return self._snapshots.commit(request)

    # ---- distributed_epoch splits --------------------------------------------------

    def get_splits(self, request: dispatcher_pb2.GetSplitsRequest) -> dispatcher_pb2.GetSplitsResponse:
        """The next range of splits for a task's source: a retry of the same (group, repetition,
        index) gets the same range; asking for range k+1 says that range k started; ranges
        returned by lost workers go out first; otherwise a fair share of what is left."""
        if request.repetition < 0 or request.max_splits < 0:
            raise status.invalid_argument("repetition and max_splits must be >= 0")
        with self._lock:
            iteration = self._state.iteration(request.iteration_id)
            if iteration is None:
                raise status.not_found(f"iteration {request.iteration_id} is not known to {self._where()}")
            job = self._state.job_of(iteration)
            if job.sharding_policy != common_pb2.SHARDING_POLICY_DYNAMIC:
                raise status.failed_precondition(
                    f"iteration {request.iteration_id} is not a distributed_epoch iteration: it has no splits"
                )
            if not 0 <= request.split_group < len(job.split_group_sizes):
                raise status.invalid_argument(
                    f"split group {request.split_group} out of range: the pipeline has {len(job.split_group_sizes)}"
                )
            task = self._state.task(request.task_id)
            if task is None or task.iteration_id != iteration.iteration_id:
                raise status.invalid_argument(
                    f"task {request.task_id} is not a task of iteration {iteration.iteration_id}"
                )
            return self._next_splits(job, iteration, task.task_id, request)

    def _next_splits(self, job: Job, iteration, task_id: TaskId, request) -> dispatcher_pb2.GetSplitsResponse:
        group, repetition, index = request.split_group, request.repetition, request.index
        key = (task_id, group, repetition, index)
        if index > 0 and (task_id, group, repetition, index - 1) in iteration.outstanding_splits:
            self._commit(
                start_splits=journal_pb2.StartSplitsUpdate(
                    iteration_id=iteration.iteration_id,
                    task_id=task_id,
                    split_group=group,
                    repetition=repetition,
                    index=index - 1,
                )
            )
        if key in iteration.outstanding_splits:  # a retry: the same answer again
            begin, end = iteration.outstanding_splits[key]
            return dispatcher_pb2.GetSplitsResponse(begin=begin, end=end)
        if iteration.finished or self._state.task(task_id).finished:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)

        def hand_out(begin: int, end: int, from_pool: bool, replayed: bool = False) -> dispatcher_pb2.GetSplitsResponse:
            self._commit(
                produce_splits=journal_pb2.ProduceSplitsUpdate(
                    iteration_id=iteration.iteration_id,
                    split_group=group,
                    repetition=repetition,
                    begin=begin,
                    end=end,
                    task_id=task_id,
                    index=index,
                    from_pool=from_pool,
                    replayed=replayed,
                )
            )
            return dispatcher_pb2.GetSplitsResponse(begin=begin, end=end)

        replay = self._state.task(task_id).replay.get((group, repetition), [])
        if index < len(replay):
            return hand_out(*replay[index], from_pool=False, replayed=True)

        pool = iteration.returned_splits.get((group, repetition))
        if pool:
            return hand_out(*pool[0], from_pool=True)
        current, begin = self._state.split_position(iteration, group)
        if repetition < current:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)
        if repetition > current:
            begin = 0
        remaining = job.split_group_sizes[group] - begin
        if remaining <= 0:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)
        count = split_range_size(
            remaining, self._state.unfinished_task_count(iteration), request.max_splits or DEFAULT_MAX_SPLITS
        )
        return hand_out(begin, begin + count, from_pool=False)


def _check_totals(what: str, **totals: float) -> None:
    """Reported totals are finite and not negative."""
    for name, value in totals.items():
        if not math.isfinite(value) or value < 0:
            raise status.invalid_argument(f"{what}: {name} must be a finite number >= 0, got {value}")


def _rebuild(updates: list[journal_pb2.Update]) -> list[journal_pb2.Update]:
    """The updates that rebuild the state `updates` make (a snapshot's content)."""
    return DispatcherState.replay(updates).to_updates()


def _check_positions(sharding_policy: int, cardinality: int, positions: dict[int, int], named: Iterable[int]) -> None:
    """INVALID_ARGUMENT for a checkpoint whose positions (resume.positions; `named`: the tasks the
    checkpoint names) the journal says are impossible: a task past the end of a dataset of known
    cardinality (every task's stream is at most one pass; in distributed_epoch all tasks together
    are). Receipts (_check_receipts) bound each task by what it sent; this bound also holds for
    the elements a resumed task skipped before its stream began."""
    if cardinality < 0:
        return
    for task_id in named:
        if positions[task_id] > cardinality:
            raise status.invalid_argument(
                f"the checkpoint says its consumer had gone {positions[task_id]} elements into task {task_id}, "
                f"but the dataset has {cardinality}: the checkpoint is not of this dataset, or was altered"
            )
    if sharding_policy == common_pb2.SHARDING_POLICY_DYNAMIC and sum(positions.values()) > cardinality:
        raise status.invalid_argument(
            f"the checkpoint says its consumer had taken {sum(positions.values())} elements of an epoch of "
            f"{cardinality} (distributed_epoch): the checkpoint is not of this dataset, or was altered"
        )


def _check_receipts(secret: str, progress: Iterable[dispatcher_pb2.TaskProgress]) -> None:
    """INVALID_ARGUMENT for a saved position that no receipt of its task covers (read_keys.py):
    a consumer cannot have taken more of a task than the task's worker sent it."""
    for p in progress:
        if p.elements == 0:
            continue
        if not read_keys.receipt_matches(p.receipt, secret, p.task_id, p.receipt_elements):
            raise status.invalid_argument(
                f"the checkpoint's position in task {p.task_id} ({p.elements} elements) carries no valid receipt "
                "from the task's worker: the checkpoint was altered, or saved by a client too old to keep receipts"
            )
        if p.elements > p.receipt_elements:
            raise status.invalid_argument(
                f"the checkpoint says its consumer had taken {p.elements} elements of task {p.task_id}, but the "
                f"task's receipt covers {p.receipt_elements}: the checkpoint was altered"
            )


def _check_resumable(saved: Job, request: dispatcher_pb2.GetOrCreateJobRequest) -> None:
    """A restored iterator must read what the saved one read; the error names every mismatch."""
    mismatches = []
    if saved.dataset_id != request.dataset_id:
        mismatches.append(
            f"the saved iterator read dataset {saved.dataset_id!r}, this one reads dataset {request.dataset_id!r} "
            "(the same pipeline definition registers as the same dataset)"
        )
    if saved.sharding_policy != request.processing_mode.sharding_policy:
        mismatches.append(
            f"the saved iterator read in processing mode {_POLICY_NAMES[saved.sharding_policy]}, this one in "
            f"{_POLICY_NAMES.get(request.processing_mode.sharding_policy, request.processing_mode.sharding_policy)}"
        )
    if mismatches:
        raise status.failed_precondition(
            "cannot restore the iterator into a different pipeline: " + "; ".join(mismatches)
        )


def _check_same_job(job: Job, request: dispatcher_pb2.GetOrCreateJobRequest) -> None:
    """A request for an existing named job must ask for the same job; the error names every mismatch."""
    mismatches = []
    if job.sharding_policy != request.processing_mode.sharding_policy:
        mismatches.append(
            f"processing mode {_POLICY_NAMES[job.sharding_policy]} vs "
            f"{_POLICY_NAMES[request.processing_mode.sharding_policy]}"
        )
    if job.num_consumers != request.num_consumers:
        mismatches.append(f"num_consumers {job.num_consumers} vs {request.num_consumers}")
    if job.target_workers != request.target_workers:
        mismatches.append(
            f"target_workers {_TARGET_NAMES[job.target_workers]} vs {_TARGET_NAMES[request.target_workers]}"
        )
    if job.use_cross_trainer_cache != request.use_cross_trainer_cache:
        enabled = {True: "enabled", False: "disabled"}
        mismatches.append(
            f"cross-trainer cache {enabled[job.use_cross_trainer_cache]} vs {enabled[request.use_cross_trainer_cache]}"
        )
    if mismatches:
        raise status.invalid_argument(
            f"job {job.job_name!r} already exists with different arguments: " + "; ".join(mismatches)
        )
