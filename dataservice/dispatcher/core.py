"""The dispatcher itself, with no transport in it (as TensorFlow's dispatcher_impl.cc).

Each request method validates its request, turns the change it asks for into
Update messages and commits them (journal, then DispatcherState.apply) under
one lock, and returns the response proto or raises status.ServiceError. The
gRPC servicer over it only translates. What the core needs from outside is
injected: the clock (liveness and garbage collection read it), the journal,
the dataset store, and a WorkerNotifier through which new tasks and datasets
reach workers before their next heartbeat.

The core keeps jobs, iterations, clients and workers; the rest is split along
its seams, each part given the same context (context.py: state, lock, commit,
clock): dataset admission (admission.py, the one part that needs TensorFlow:
built on first use, or by load_tensorflow() in the background as the server
starts, so that the dispatcher serves workers and clients before it has
imported TensorFlow, seconds sooner),
split hand-out (split_handout.py), coordinated reads' rounds (rounds.py),
liveness and garbage collection (liveness.py) and distributed_save
(snapshots.py).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from dataservice import modes, read_keys, status
from dataservice.config import DispatcherConfig
from dataservice.dispatcher import resume, status_report, worker_index
from dataservice.dispatcher.context import DEFAULT_COMPACT_EVERY, Clock, Committer, CoreContext, dispatcher_at
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.dispatcher.journal import JournalWriter
from dataservice.dispatcher.liveness import Liveness
from dataservice.dispatcher.load import LoadTracker
from dataservice.dispatcher.rounds import RoundGrants
from dataservice.dispatcher.snapshots import SnapshotCoordinator
from dataservice.dispatcher.split_handout import SplitHandout
from dataservice.dispatcher.state import (
    ClientId,
    DispatcherState,
    IterationId,
    Job,
    Task,
    WorkerAddress,
)
from dataservice.dispatcher.task_changes import TaskChanges
from dataservice.modes import POLICY_NAMES
from dataservice.monitoring.logs import ids
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2

if TYPE_CHECKING:
    from dataservice.dispatcher.admission import DatasetAdmission

log = logging.getLogger(__name__)

# A restored iterator's tasks go to workers heard from within this many seconds, where there are any.
RESUME_RECENT_S = 3.0
_TARGET_NAMES = {v: k.removeprefix("TARGET_WORKERS_") for k, v in common_pb2.TargetWorkers.items()}


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
        compact_every: int = DEFAULT_COMPACT_EVERY,
    ):
        self._config = config
        self._state = state or DispatcherState()
        self._notifier: WorkerNotifier = notifier or NoNotifier()
        self._clock = clock
        self._lock = threading.RLock()
        # Which tasks changed when: client heartbeats answer with the changes only.
        self._task_changes = TaskChanges()
        self._committer = Committer(self._state, journal, self._task_changes, dispatcher_at(address), compact_every)
        self._ctx = CoreContext(config, address, self._state, self._lock, self._committer, clock)
        self._started = clock()
        # Clients' and workers' rates, for metrics and the worker recommendation.
        self._load = LoadTracker()
        datasets = datasets or DatasetStore(config.work_dir, config.graph_memory_bytes)
        self._datasets = datasets
        self._admission_part: DatasetAdmission | None = None
        self._admission_lock = threading.Lock()
        self._splits = SplitHandout(self._ctx)
        self._rounds = RoundGrants(self._ctx)
        self._snapshots = SnapshotCoordinator(
            self._ctx,
            datasets,
            config.worker_max_concurrent_snapshots,
            snapshot_roots=config.snapshot_roots,
        )
        self._snapshots.repair_files()
        self._liveness = Liveness(
            self._ctx,
            forget_worker=self._forget_worker,
            forget_client=self._load.forget_client,
            forget_iteration=self._rounds.forget,
            forget_job=self._load.forget_job,
        )

    @property
    def _admission(self) -> DatasetAdmission:
        with self._admission_lock:
            if self._admission_part is None:
                from dataservice.dispatcher.admission import DatasetAdmission  # imports TensorFlow

                self._admission_part = DatasetAdmission(self._ctx, self._datasets, self._notifier)
            return self._admission_part

    def load_tensorflow(self) -> None:
        """Imports TensorFlow and builds what needs it (dataset admission), which the first
        registration would otherwise wait for: the server calls it in the background as it starts."""
        self._admission  # noqa: B018 (built for its side effect)

    def _forget_worker(self, address: WorkerAddress) -> None:
        self._load.forget_worker(address)
        self._snapshots.assignments.forget_worker(address)

    # ---- reading the state ---------------------------------------------------

    @property
    def state(self) -> DispatcherState:
        """The state, to read (tests, tools); it changes only through requests."""
        return self._state

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
                address=self._ctx.address,
                fault_tolerant_mode=self._config.fault_tolerant_mode,
                work_dir=self._config.work_dir,
                uptime_s=now - self._started,
                journal_appends=self._committer.appended,
            )
            report = status_report.build(
                self._state, self._load, info, self._liveness.worker_seen, self._liveness.client_seen, now
            )
            report["snapshots"] = self._snapshots.status()
            return report

    def get_status(self, request: dispatcher_pb2.GetStatusRequest) -> dispatcher_pb2.GetStatusResponse:
        return dispatcher_pb2.GetStatusResponse(status_json=json.dumps(self.status()))

    # ---- journal compaction --------------------------------------------------

    def compact_journal_soon(self) -> None:
        """Makes the next journaled change also compact the journal (as every compact_every-th does)."""
        with self._lock:
            self._committer.compact_soon()

    def wait_for_journal_compaction(self, timeout_s: float) -> bool:
        """Waits for a compaction being written to be on disk; False on timeout."""
        return self._committer.wait_for_compaction(timeout_s)

    # ---- datasets (admission.py) ---------------------------------------------------

    def register_dataset(
        self, request: dispatcher_pb2.RegisterDatasetRequest
    ) -> dispatcher_pb2.RegisterDatasetResponse:
        return self._admission.register(request)

    def get_data_service_metadata(self, request: dispatcher_pb2.GetDataServiceMetadataRequest):
        return self._admission.metadata(request)

    def get_element_spec(self, request: dispatcher_pb2.GetElementSpecRequest):
        return self._admission.element_spec(request)

    def get_dataset_def(self, request: dispatcher_pb2.GetDatasetDefRequest):
        return self._admission.dataset_def(request)

    # ---- jobs and iterations ---------------------------------------------------

    def get_or_create_job(self, request: dispatcher_pb2.GetOrCreateJobRequest):
        policy = request.processing_mode.sharding_policy
        if policy not in POLICY_NAMES:
            raise status.invalid_argument(f"unknown sharding policy {policy}")
        if request.num_consumers < 0:
            raise status.invalid_argument(f"num_consumers must be >= 0, got {request.num_consumers}")
        if request.num_consumers and not request.job_name:
            raise status.invalid_argument("coordinated reads (num_consumers) need a job_name")
        with self._lock:
            dataset = self._ctx.dataset(request.dataset_id)
            if request.num_consumers:
                problem = modes.coordinated_reads_problem(
                    dataset.metadata.cardinality, f"dataset {request.dataset_id!r}"
                )
                if problem:
                    raise status.failed_precondition(problem)
            if request.use_cross_trainer_cache:
                problem = modes.cross_trainer_cache_problem(
                    request.job_name, request.num_consumers, dataset.metadata.cardinality
                )
                if problem:
                    raise status.invalid_argument(problem)
            existing = self._named_job(request)
        if existing is not None:
            return dispatcher_pb2.GetOrCreateJobResponse(job_id=existing)
        split_group_sizes = self._admission.check_policy(policy, request.dataset_id, dataset.metadata)
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
        self._committer(
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

    def _named_job(self, request) -> int | None:
        """The id of the job named in the request, if it exists and matches it. Call with self._lock held."""
        job = self._state.job_named(request.dataset_id, request.job_name) if request.job_name else None
        if job is None or self._liveness.job_collected(job):
            # A job nobody read for job_gc_timeout_ms is gone, as in TensorFlow's service: its
            # name makes a new job.
            return None
        _check_same_job(job, request)
        return job.job_id

    def get_or_create_iteration(self, request: dispatcher_pb2.GetOrCreateIterationRequest):
        new_tasks: list[common_pb2.TaskDef] = []
        with self._lock:
            job = self._state.job(request.job_id)
            if job is None and self._state.was_dropped("job", request.job_id):
                raise status.not_found(f"job {request.job_id} {self._ctx.dropped_reason()}: create the job again")
            if job is None:
                raise status.not_found(
                    f"job {request.job_id} is not known to {self._ctx.where} "
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
                self._committer(
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
        read_key = read_keys.client_key(self._state.known_iteration(iteration_id).read_key, client_id)
        return dispatcher_pb2.GetOrCreateIterationResponse(
            iteration_client_id=client_id, iteration_id=iteration_id, read_key=read_key
        )

    def _acquire_client(self, iteration_id: IterationId) -> ClientId:
        """Journals a new client of the iteration, heard from now. Call with self._lock held."""
        client_id = ClientId(self._state.next_id("client"))
        self._committer(
            acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(
                iteration_client_id=client_id, iteration_id=iteration_id
            )
        )
        self._liveness.client_joined(client_id, iteration_id)
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
                    f"{self._ctx.dropped_reason()}: the saved input position is gone. Restore the checkpoint without "
                    "the iterator to start the input anew, or raise iteration_retention_ms to resume older "
                    "checkpoints"
                )
            if unknown:
                raise status.not_found(
                    f"the checkpoint was saved while reading task {unknown[0]}, which {self._ctx.where} does not "
                    "know: the dispatcher restarted without fault_tolerant_mode or with another work_dir, so the "
                    "saved input position is lost. Restore the checkpoint without the iterator to start the input "
                    "anew, or run the dispatcher with fault_tolerant_mode=True and a persistent work_dir"
                )
            iteration_ids = sorted({t.iteration_id for t in saved_tasks if t is not None})
            if len(iteration_ids) > 1:
                raise status.invalid_argument(f"the saved tasks belong to several iterations: {iteration_ids}")
            saved_iteration = self._state.known_iteration(iteration_ids[0])
            resume.check_receipts(saved_iteration.read_key, request.progress)
            saved_job = self._state.job_of(saved_iteration)
            resume.check_resumable(saved_job, job_request)
            dataset = self._ctx.dataset(job_request.dataset_id)  # still registered
            saved = self._state.tasks_of(saved_iteration)
            positions = resume.positions(saved, consumed)
            resume.check_positions(saved_job.sharding_policy, dataset.metadata.cardinality, positions, consumed)
            alive = self._state.alive_workers()
            # Workers heard from lately first: a worker killed with the trainer (a replaced pod) is
            # still alive here until worker_timeout_ms, and a task given to it would wait that long.
            recent = self._liveness.workers_heard_within(alive, RESUME_RECENT_S)
            alive = recent or alive
            if not alive:
                raise status.unavailable(
                    f"no worker is registered with {self._ctx.where}: the restored iterator resumes once one is"
                )
            planned = resume.plan_tasks(saved_job.sharding_policy, saved, positions, alive)
            # A job of its own, anonymous: released with its one client.
            anonymous = dispatcher_pb2.GetOrCreateJobRequest()
            anonymous.CopyFrom(job_request)
            anonymous.job_name = ""
            job_id = self._create_job(anonymous, saved_job.split_group_sizes)
            iteration_id = IterationId(self._state.next_id("iteration"))
            self._committer(
                create_iteration=journal_pb2.CreateIterationUpdate(
                    iteration_id=iteration_id,
                    job_id=job_id,
                    repetition=saved_iteration.repetition,
                    resumes_iteration_id=saved_iteration.iteration_id,
                    read_key=read_keys.new_secret(),
                )
            )
            self._splits.copy_positions(saved_iteration, iteration_id)
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
            read_key=read_keys.client_key(self._state.known_iteration(iteration_id).read_key, client_id),
        )

    def _create_task(
        self,
        iteration_id: IterationId,
        worker_address: str,
        skip_elements: int = 0,
        replay: Sequence[journal_pb2.SplitRange] = (),
    ) -> common_pb2.TaskDef:
        iteration = self._state.known_iteration(iteration_id)
        task_id = self._state.next_id("task")
        # Coordinated reads: no client may have read this round yet, so every
        # client adds the task to its rotation at the same round.
        coordinated = self._state.job_of(iteration).num_consumers > 0
        self._committer(
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
        return self._task_def(self._state.known_task(task_id))

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
                f"iteration client {client_id} is not known to {self._ctx.where}: it was released, timed out, "
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
            self._liveness.client_heard(ClientId(request.iteration_client_id))
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
                self._rounds.extend(iteration.iteration_id, request.current_round, now)
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
            self._committer(finish_task=journal_pb2.FinishTaskUpdate(task_id=task.task_id))
            self._log_task_finished(task)

    def _log_task_finished(self, task: Task) -> None:
        iteration = self._state.known_iteration(task.iteration_id)
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

    def release_iteration_client(self, request: dispatcher_pb2.ReleaseIterationClientRequest):
        with self._lock:
            self._client_iteration(request.iteration_client_id, request.read_key)
            self._liveness.release_client(ClientId(request.iteration_client_id))
        return dispatcher_pb2.ReleaseIterationClientResponse()

    def get_workers(self, request: dispatcher_pb2.GetWorkersRequest):
        with self._lock:
            return dispatcher_pb2.GetWorkersResponse(
                workers=[
                    dispatcher_pb2.WorkerInfo(address=w.address, transfer_address=w.transfer_address)
                    for w in self._state.workers()
                ]
            )

    # ---- liveness and garbage collection (liveness.py) -----------------------------

    def gc_interval_s(self) -> float:
        """How often collect_garbage() should run."""
        return self._liveness.interval_s()

    def collect_garbage(self) -> None:
        """Removes silent workers, releases silent clients, ends and drops unused iterations."""
        self._liveness.collect_garbage()

    # ---- workers -----------------------------------------------------------------

    def worker_heartbeat(self, request: dispatcher_pb2.WorkerHeartbeatRequest):
        address = WorkerAddress(request.worker_address)
        if not address:
            raise status.invalid_argument("worker_address must not be empty")
        allowed = self._config.worker_addresses
        with self._lock:
            if allowed and address not in worker_index.resolve(allowed, [*self._state.worker_addresses(), address]):
                raise status.failed_precondition(worker_index.refusal(allowed, address))
            known = self._state.worker(address)
            uid = request.worker_uid
            if known is not None and known.alive and uid and known.uid and known.uid != uid:
                # A new process at the address (a restarted pod keeps its name): the old one's
                # tasks are lost, their unstarted splits go back to the pool.
                lost = self._state.lost_tasks_of(address)
                log.warning("worker restarted: tasks %s of its previous process lost", lost, extra=ids(worker=address))
                self._liveness.remove_worker(address, lost)
                known = self._state.worker(address)
            self._liveness.worker_heard(address)
            tags = sorted(set(request.worker_tags))
            if known is None or not known.alive or (uid and not known.uid) or known.tags != tags:
                # New, back after it was lost, learning its uid (journaled before uids were), or
                # restarted with other tags.
                self._committer(
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
            job_id = self._state.known_iteration(task.iteration_id).job_id
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
                raise status.not_found(f"worker {request.worker_address!r} is not registered with {self._ctx.where}")
            for task_id in request.finished_tasks:
                task = self._state.task(task_id)
                if task is None and self._state.was_dropped("task", task_id):
                    continue  # finished long ago: retention dropped it
                if task is None:
                    raise status.not_found(f"task {task_id} is not known to {self._ctx.where}")
                if task.worker_address != request.worker_address:
                    raise status.invalid_argument(
                        f"task {task_id} belongs to worker {task.worker_address}, not {request.worker_address}"
                    )
                clients_finish = self._clients_finish_tasks(
                    self._state.job_of(self._state.known_iteration(task.iteration_id))
                )
                if not task.finished and not clients_finish:
                    self._committer(finish_task=journal_pb2.FinishTaskUpdate(task_id=task_id))
                    self._log_task_finished(task)
        return dispatcher_pb2.WorkerUpdateResponse()

    # ---- distributed_save ------------------------------------------------------------

    def snapshot(self, request: dispatcher_pb2.SnapshotRequest) -> dispatcher_pb2.SnapshotResponse:
        return self._snapshots.start(request)

    def commit_snapshot_chunk(self, request: dispatcher_pb2.CommitSnapshotChunkRequest):
        return self._snapshots.commit(request)

    # ---- distributed_epoch splits (split_handout.py) ----------------------------------

    def get_splits(self, request: dispatcher_pb2.GetSplitsRequest) -> dispatcher_pb2.GetSplitsResponse:
        return self._splits.get_splits(request)


def _check_totals(what: str, **totals: float) -> None:
    """Reported totals are finite and not negative."""
    for name, value in totals.items():
        if not math.isfinite(value) or value < 0:
            raise status.invalid_argument(f"{what}: {name} must be a finite number >= 0, got {value}")


def _check_same_job(job: Job, request: dispatcher_pb2.GetOrCreateJobRequest) -> None:
    """A request for an existing named job must ask for the same job; the error names every mismatch."""
    mismatches = []
    if job.sharding_policy != request.processing_mode.sharding_policy:
        mismatches.append(
            f"processing mode {POLICY_NAMES[job.sharding_policy]} vs "
            f"{POLICY_NAMES[request.processing_mode.sharding_policy]}"
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
