"""The dispatcher's state and the one function that changes it.

Every change is an Update proto (proto/dataservice/v1/journal.proto). The
server validates a change, journals the Update, then calls
DispatcherState.apply(update). Replaying a journal through apply() rebuilds
the same state, so apply() reads nothing but the update and the state: no
clock, no I/O, no locks, no randomness. apply() dispatches through one table
keyed by the Update's oneof (_APPLY; a test checks it covers every case).
Callers read the state through query methods; validate() checks the
invariants that every sequence of updates the dispatcher journals keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeAlias

from dataservice.dispatcher import worker_index
from dataservice.v1 import common_pb2, journal_pb2

# Ids as the journal spells them. Aliases, not distinct types: every id comes from and goes to a
# protobuf field, whose plain ints and strings a type checker cannot tell apart.
DatasetId: TypeAlias = str
WorkerAddress: TypeAlias = str
JobId: TypeAlias = int
IterationId: TypeAlias = int
TaskId: TypeAlias = int
# A client's membership of one iteration (TensorFlow's iteration client id).
ClientId: TypeAlias = int
# distributed_epoch: (task, split group, repetition, range index) of a range handed out.
SplitKey = tuple[TaskId, int, int, int]


class StateInvariantError(AssertionError):
    """validate() found the state inconsistent: a bug in apply() or in the updates journaled."""


@dataclasses.dataclass
class Dataset:
    dataset_id: DatasetId
    fingerprint: str
    metadata: common_pb2.DatasetMetadata

    @classmethod
    def registered(cls, u: journal_pb2.RegisterDatasetUpdate) -> Dataset:
        metadata = common_pb2.DatasetMetadata()
        metadata.CopyFrom(u.metadata)
        return cls(DatasetId(u.dataset_id), u.fingerprint, metadata)

    def registration(self) -> journal_pb2.RegisterDatasetUpdate:
        return journal_pb2.RegisterDatasetUpdate(
            dataset_id=self.dataset_id, fingerprint=self.fingerprint, metadata=self.metadata
        )


@dataclasses.dataclass
class Worker:
    address: WorkerAddress
    transfer_address: str
    # False once the dispatcher gave up on it (no heartbeat for worker_timeout_ms).
    alive: bool = True
    # The worker process's random id (0: not known); another one at the same address is a restart.
    uid: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def registered(cls, u: journal_pb2.RegisterWorkerUpdate) -> Worker:
        return cls(WorkerAddress(u.worker_address), u.transfer_address, uid=u.worker_uid, tags=list(u.worker_tags))

    def registration(self) -> journal_pb2.RegisterWorkerUpdate:
        return journal_pb2.RegisterWorkerUpdate(
            worker_address=self.address,
            transfer_address=self.transfer_address,
            worker_uid=self.uid,
            worker_tags=self.tags,
        )


@dataclasses.dataclass
class Job:
    job_id: JobId
    dataset_id: DatasetId
    sharding_policy: common_pb2.ShardingPolicy
    job_name: str
    num_consumers: int
    target_workers: common_pb2.TargetWorkers
    # distributed_epoch: splits in each split group of the pipeline.
    split_group_sizes: list[int] = dataclasses.field(default_factory=list)
    # Trainers share the job's elements through the workers' cross-trainer caches.
    use_cross_trainer_cache: bool = False
    # repetition -> iteration id
    iterations: dict[int, IterationId] = dataclasses.field(default_factory=dict)

    @classmethod
    def created(cls, u: journal_pb2.CreateJobUpdate) -> Job:
        return cls(
            job_id=JobId(u.job_id),
            dataset_id=DatasetId(u.dataset_id),
            sharding_policy=u.processing_mode.sharding_policy,
            job_name=u.job_name,
            num_consumers=u.num_consumers,
            target_workers=u.target_workers,
            split_group_sizes=list(u.split_group_sizes),
            use_cross_trainer_cache=u.use_cross_trainer_cache,
        )

    def creation(self) -> journal_pb2.CreateJobUpdate:
        return journal_pb2.CreateJobUpdate(
            job_id=self.job_id,
            dataset_id=self.dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=self.sharding_policy),
            job_name=self.job_name,
            num_consumers=self.num_consumers,
            target_workers=self.target_workers,
            split_group_sizes=self.split_group_sizes,
            use_cross_trainer_cache=self.use_cross_trainer_cache,
        )


@dataclasses.dataclass
class Iteration:
    iteration_id: IterationId
    job_id: JobId
    repetition: int
    task_ids: list[TaskId] = dataclasses.field(default_factory=list)
    client_ids: set[ClientId] = dataclasses.field(default_factory=set)
    # Every task finished, or the iteration was ended early.
    finished: bool = False
    # distributed_epoch: split group -> (repetition, next split index to hand out).
    split_positions: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Ranges handed to a task but not started: (task, group, repetition, index) -> (begin, end).
    outstanding_splits: dict[SplitKey, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Ranges of lost workers, to hand out again: (group, repetition) -> [(begin, end)].
    returned_splits: dict[tuple[int, int], list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # Coordinated reads: clients may read the rounds below this.
    round_limit: int = 0
    # A restored iterator's iteration: the iteration it continues (0: none).
    resumes_iteration_id: int = 0
    # The secret its clients' keys derive from (read_keys.py; CreateIterationUpdate.read_key; "" in journals
    # written before read keys: then none is asked for).
    read_key: str = ""
    # Counts over task_ids, kept by apply() so that split requests and finishing need no scan:
    # tasks not finished, and tasks finished because their data ran out (not lost).
    unfinished_tasks: int = 0
    completed_tasks: int = 0

    @classmethod
    def created(cls, u: journal_pb2.CreateIterationUpdate) -> Iteration:
        return cls(
            IterationId(u.iteration_id),
            JobId(u.job_id),
            u.repetition,
            resumes_iteration_id=u.resumes_iteration_id,
            read_key=u.read_key,
        )

    def creation(self) -> journal_pb2.CreateIterationUpdate:
        return journal_pb2.CreateIterationUpdate(
            iteration_id=self.iteration_id,
            job_id=self.job_id,
            repetition=self.repetition,
            resumes_iteration_id=self.resumes_iteration_id,
            read_key=self.read_key,
        )


@dataclasses.dataclass
class Task:
    task_id: TaskId
    iteration_id: IterationId
    worker_address: WorkerAddress
    finished: bool = False
    # Finished because its worker was lost, not because its data ran out.
    lost: bool = False
    # Coordinated reads: the first round it serves.
    starting_round: int = 0
    # A resumed iteration's task: the pipeline's first elements that its worker skips.
    skip_elements: int = 0
    # distributed_epoch, a resumed iteration's task: (group, repetition) -> the ranges it is
    # handed again, in order, before new ones.
    replay: dict[tuple[int, int], list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # distributed_epoch: the ranges it received and kept, (group, repetition, index) -> (begin, end);
    # a restored iterator's new task replays them.
    received: dict[tuple[int, int, int], tuple[int, int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def created(cls, u: journal_pb2.CreateTaskUpdate) -> Task:
        task = cls(
            TaskId(u.task_id),
            IterationId(u.iteration_id),
            WorkerAddress(u.worker_address),
            starting_round=u.starting_round,
            skip_elements=u.skip_elements,
        )
        for r in u.replay:
            task.replay.setdefault((r.split_group, r.repetition), []).append((r.begin, r.end))
        return task

    def creation(self) -> journal_pb2.CreateTaskUpdate:
        return journal_pb2.CreateTaskUpdate(
            task_id=self.task_id,
            iteration_id=self.iteration_id,
            worker_address=self.worker_address,
            starting_round=self.starting_round,
            skip_elements=self.skip_elements,
            replay=[
                journal_pb2.SplitRange(split_group=g, repetition=r, begin=b, end=e)
                for (g, r), ranges in sorted(self.replay.items())
                for b, e in ranges
            ],
        )


@dataclasses.dataclass
class Snapshot:
    """A distributed_save: the chunks of the dataset's splits, which are committed, and how it ended."""

    path: str
    dataset_id: DatasetId
    compression: str
    group_sizes: list[int]
    num_chunks: int
    # chunk index -> (elements, the worker's file it was renamed from)
    committed: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)
    finished: bool = False
    # A failed save: the pipeline's status code and message (0: none).
    error_code: int = 0
    error_message: str = ""

    @property
    def elements(self) -> int:
        return sum(n for n, _ in self.committed.values())

    @classmethod
    def started(cls, u: journal_pb2.StartSnapshotUpdate) -> Snapshot:
        return cls(u.path, DatasetId(u.dataset_id), u.compression, list(u.group_sizes), u.num_chunks)

    def start(self) -> journal_pb2.StartSnapshotUpdate:
        return journal_pb2.StartSnapshotUpdate(
            path=self.path,
            dataset_id=self.dataset_id,
            compression=self.compression,
            group_sizes=self.group_sizes,
            num_chunks=self.num_chunks,
        )


class DispatcherState:
    """Datasets, workers, jobs, iterations, tasks, iteration clients and distributed_save snapshots."""

    def __init__(self) -> None:
        self._datasets: dict[DatasetId, Dataset] = {}
        self._dataset_by_fingerprint: dict[str, DatasetId] = {}
        self._workers: dict[WorkerAddress, Worker] = {}
        self._jobs: dict[JobId, Job] = {}
        # Named jobs by (dataset id, name): as in TensorFlow, a name is shared by the readers of
        # one dataset; another dataset's readers under the same name get a job of their own.
        self._job_by_name: dict[tuple[str, str], JobId] = {}
        self._iterations: dict[IterationId, Iteration] = {}
        self._tasks: dict[TaskId, Task] = {}
        self._tasks_by_worker: dict[WorkerAddress, list[TaskId]] = {}
        self._iteration_clients: dict[ClientId, IterationId] = {}
        # path -> snapshot, in the order they started
        self._snapshots: dict[str, Snapshot] = {}
        self._next_ids = {"dataset": 1, "job": 1, "iteration": 1, "task": 1, "client": 1}

    @classmethod
    def replay(cls, updates: Iterable[journal_pb2.Update]) -> DispatcherState:
        """The state that applying `updates` in order to an empty one gives (recovery, snapshots)."""
        state = cls()
        for update in updates:
            state.apply(update)
        return state

    # ---- the one mutator -------------------------------------------------

    def apply(self, update: journal_pb2.Update) -> None:
        kind = update.WhichOneof("kind")
        handler = _APPLY.get(kind) if kind is not None else None
        if handler is None:
            raise ValueError(f"an Update with no change this state knows ({kind!r})")
        handler(self, getattr(update, kind))

    def _apply_register_dataset(self, u: journal_pb2.RegisterDatasetUpdate) -> None:
        self._datasets[u.dataset_id] = Dataset.registered(u)
        self._dataset_by_fingerprint.setdefault(u.fingerprint, u.dataset_id)
        if u.dataset_id.isdigit():
            self._bump("dataset", int(u.dataset_id))

    def _apply_register_worker(self, u: journal_pb2.RegisterWorkerUpdate) -> None:
        self._workers[u.worker_address] = Worker.registered(u)
        self._tasks_by_worker.setdefault(u.worker_address, [])

    def _apply_create_job(self, u: journal_pb2.CreateJobUpdate) -> None:
        self._jobs[u.job_id] = Job.created(u)
        if u.job_name:
            self._job_by_name[(u.dataset_id, u.job_name)] = u.job_id
        self._bump("job", u.job_id)

    def _apply_create_iteration(self, u: journal_pb2.CreateIterationUpdate) -> None:
        self._iterations[u.iteration_id] = Iteration.created(u)
        self._jobs[u.job_id].iterations[u.repetition] = u.iteration_id
        self._bump("iteration", u.iteration_id)

    def _apply_create_task(self, u: journal_pb2.CreateTaskUpdate) -> None:
        self._tasks[u.task_id] = Task.created(u)
        iteration = self._iterations[u.iteration_id]
        iteration.task_ids.append(u.task_id)
        iteration.unfinished_tasks += 1
        self._tasks_by_worker.setdefault(u.worker_address, []).append(u.task_id)
        self._bump("task", u.task_id)

    def _apply_finish_task(self, u: journal_pb2.FinishTaskUpdate) -> None:
        task = self._tasks[u.task_id]
        iteration = self._iterations[task.iteration_id]
        if not task.finished:
            task.finished = True
            iteration.unfinished_tasks -= 1
            iteration.completed_tasks += 1
        self._finish_if_done(iteration)

    def _apply_acquire_iteration_client(self, u: journal_pb2.AcquireIterationClientUpdate) -> None:
        self._iteration_clients[u.iteration_client_id] = u.iteration_id
        self._iterations[u.iteration_id].client_ids.add(u.iteration_client_id)
        self._bump("client", u.iteration_client_id)

    def _apply_release_iteration_client(self, u: journal_pb2.ReleaseIterationClientUpdate) -> None:
        iteration_id = self._iteration_clients.pop(u.iteration_client_id)
        self._iterations[iteration_id].client_ids.discard(u.iteration_client_id)

    def _apply_finish_iteration(self, u: journal_pb2.FinishIterationUpdate) -> None:
        self._iterations[u.iteration_id].finished = True

    def _apply_drop_iteration(self, u: journal_pb2.DropIterationUpdate) -> None:
        iteration = self._iterations[u.iteration_id]
        if not iteration.finished or iteration.client_ids:
            raise ValueError(f"iteration {u.iteration_id} is not finished or has clients: it cannot be dropped")
        for task_id in iteration.task_ids:
            task = self._tasks.pop(task_id)
            self._tasks_by_worker[task.worker_address].remove(task_id)
        del self._iterations[u.iteration_id]
        job = self._jobs[iteration.job_id]
        del job.iterations[iteration.repetition]
        if not job.iterations:
            del self._jobs[job.job_id]
            # The name may have gone to a newer job (the dispatcher makes one when a named job is
            # collected): only this job's own entry goes.
            if job.job_name and self._job_by_name.get((job.dataset_id, job.job_name)) == job.job_id:
                del self._job_by_name[(job.dataset_id, job.job_name)]

    def _apply_produce_splits(self, u: journal_pb2.ProduceSplitsUpdate) -> None:
        iteration = self._iterations[u.iteration_id]
        if u.from_pool:
            pool = iteration.returned_splits[(u.split_group, u.repetition)]
            pool.remove((u.begin, u.end))
            if not pool:
                del iteration.returned_splits[(u.split_group, u.repetition)]
        elif not u.replayed:  # a replayed range moves neither the pool nor the position
            iteration.split_positions[u.split_group] = (u.repetition, u.end)
        if u.task_id:
            key = (u.task_id, u.split_group, u.repetition, u.index)
            iteration.outstanding_splits[key] = (u.begin, u.end)
            self._tasks[u.task_id].received[key[1:]] = (u.begin, u.end)

    def _apply_start_splits(self, u: journal_pb2.StartSplitsUpdate) -> None:
        key = (u.task_id, u.split_group, u.repetition, u.index)
        self._iterations[u.iteration_id].outstanding_splits.pop(key, None)

    def _apply_return_splits(self, u: journal_pb2.ReturnSplitsUpdate) -> None:
        pool = self._iterations[u.iteration_id].returned_splits.setdefault((u.split_group, u.repetition), [])
        pool.append((u.begin, u.end))

    def _apply_remove_worker(self, u: journal_pb2.RemoveWorkerUpdate) -> None:
        self._workers[u.worker_address].alive = False
        for task_id in u.lost_tasks:
            task = self._tasks[task_id]
            iteration = self._iterations[task.iteration_id]
            if not task.finished:
                iteration.unfinished_tasks -= 1
            elif not task.lost:
                iteration.completed_tasks -= 1
            task.finished = task.lost = True
            replaying = bool(task.skip_elements or task.replay)
            for key in sorted(k for k in iteration.outstanding_splits if k[0] == task_id):
                _, group, repetition, _ = key
                split_range = iteration.outstanding_splits.pop(key)
                if replaying:
                    # Its consumer may have taken elements of any of its ranges before the checkpoint
                    # it resumes (the elements it skips): none goes to another task, they stay its
                    # input, which a later resume replays.
                    continue
                task.received.pop(key[1:], None)
                iteration.returned_splits.setdefault((group, repetition), []).append(split_range)
            self._finish_if_done(iteration)

    def _finish_if_done(self, iteration: Iteration) -> None:
        """An iteration is done when every task finished and one of them ran out of data: if all
        were lost, the iteration waits for workers to (re)register and take it up."""
        if iteration.unfinished_tasks == 0 and iteration.completed_tasks > 0:
            iteration.finished = True

    def _apply_extend_rounds(self, u: journal_pb2.ExtendRoundsUpdate) -> None:
        iteration = self._iterations[u.iteration_id]
        iteration.round_limit = max(iteration.round_limit, u.round_limit)

    def _apply_reserve_ids(self, u: journal_pb2.ReserveIdsUpdate) -> None:
        for kind in self._next_ids:
            self._next_ids[kind] = max(self._next_ids[kind], getattr(u, f"next_{kind}_id"))

    def _apply_start_snapshot(self, u: journal_pb2.StartSnapshotUpdate) -> None:
        self._snapshots[u.path] = Snapshot.started(u)

    def _apply_commit_snapshot_chunk(self, u: journal_pb2.CommitSnapshotChunkUpdate) -> None:
        self._snapshots[u.path].committed[u.chunk_index] = (u.num_records, u.uncommitted_file)

    def _apply_finish_snapshot(self, u: journal_pb2.FinishSnapshotUpdate) -> None:
        snapshot = self._snapshots[u.path]
        snapshot.finished = True
        snapshot.error_code = u.error_code
        snapshot.error_message = u.error_message

    def _bump(self, kind: str, used_id: int) -> None:
        self._next_ids[kind] = max(self._next_ids[kind], used_id + 1)

    # ---- snapshots ---------------------------------------------------------

    def to_updates(self) -> list[journal_pb2.Update]:
        """Updates that, applied to an empty state, rebuild this one (a compacted journal). Each
        entity makes its own creation update (Job.creation() beside Job.created(), which apply()
        uses), so a field added to an entity is journaled and compacted in one place."""
        U = journal_pb2.Update
        out: list[journal_pb2.Update] = []
        out.extend(U(register_dataset=d.registration()) for d in self._datasets.values())
        out.extend(U(register_worker=w.registration()) for w in self._workers.values())
        out.extend(U(create_job=j.creation()) for j in sorted(self._jobs.values(), key=lambda j: j.job_id))
        iterations = sorted(self._iterations.values(), key=lambda i: i.iteration_id)
        for it in iterations:
            out.append(U(create_iteration=it.creation()))
            if it.round_limit:
                rounds = journal_pb2.ExtendRoundsUpdate(iteration_id=it.iteration_id, round_limit=it.round_limit)
                out.append(U(extend_rounds=rounds))
            for group, (repetition, end) in sorted(it.split_positions.items()):
                out.append(U(produce_splits=_split_range(it, group, repetition, end, end)))
        tasks = sorted(self._tasks.values(), key=lambda t: t.task_id)
        for t in tasks:
            out.append(U(create_task=t.creation()))
            # The ranges it received and started (outstanding ones follow, through the pool).
            iteration = self._iterations[t.iteration_id]
            for (group, repetition, index), (begin, end) in sorted(t.received.items()):
                if (t.task_id, group, repetition, index) in iteration.outstanding_splits:
                    continue
                handed = dict(task_id=t.task_id, index=index)
                out.append(
                    U(produce_splits=_split_range(iteration, group, repetition, begin, end, **handed, replayed=True))
                )
                start = journal_pb2.StartSplitsUpdate(
                    iteration_id=t.iteration_id, split_group=group, repetition=repetition, **handed
                )
                out.append(U(start_splits=start))
        for it in iterations:
            # Outstanding ranges pass through the pool (return, then hand out from it);
            # the pool's own ranges follow, in order.
            for (task_id, group, repetition, index), (begin, end) in it.outstanding_splits.items():
                out.append(U(return_splits=_returned_range(it, group, repetition, begin, end)))
                handed = dict(task_id=task_id, index=index, from_pool=True)
                out.append(U(produce_splits=_split_range(it, group, repetition, begin, end, **handed)))
            for (group, repetition), pool in it.returned_splits.items():
                out.extend(U(return_splits=_returned_range(it, group, repetition, b, e)) for b, e in pool)
        for t in tasks:
            if t.finished and not t.lost:
                out.append(U(finish_task=journal_pb2.FinishTaskUpdate(task_id=t.task_id)))
        for w in self._workers.values():
            lost = [t.task_id for t in tasks if t.lost and t.worker_address == w.address]
            if lost or not w.alive:
                out.append(U(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=w.address, lost_tasks=lost)))
                if w.alive:  # it came back after it was lost
                    out.append(U(register_worker=w.registration()))
        for client_id, iteration_id in sorted(self._iteration_clients.items()):
            acquire = journal_pb2.AcquireIterationClientUpdate(iteration_client_id=client_id, iteration_id=iteration_id)
            out.append(U(acquire_iteration_client=acquire))
        for it in iterations:
            if it.finished:
                out.append(U(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=it.iteration_id)))
        for snapshot in self._snapshots.values():
            out.append(U(start_snapshot=snapshot.start()))
            for index, (records, uncommitted) in sorted(snapshot.committed.items()):
                chunk = journal_pb2.CommitSnapshotChunkUpdate(
                    path=snapshot.path, chunk_index=index, num_records=records, uncommitted_file=uncommitted
                )
                out.append(U(commit_snapshot_chunk=chunk))
            if snapshot.finished:
                end = journal_pb2.FinishSnapshotUpdate(
                    path=snapshot.path, error_code=snapshot.error_code, error_message=snapshot.error_message
                )
                out.append(U(finish_snapshot=end))
        next_ids = {f"next_{kind}_id": value for kind, value in self._next_ids.items()}
        out.append(U(reserve_ids=journal_pb2.ReserveIdsUpdate(**next_ids)))
        return out

    # ---- queries ---------------------------------------------------------

    def next_id(self, kind: str) -> int:
        """The id the next created object of `kind` gets (the caller puts it in the Update)."""
        return self._next_ids[kind]

    def next_dataset_id(self) -> DatasetId:
        candidate = self._next_ids["dataset"]
        while str(candidate) in self._datasets:
            candidate += 1
        return DatasetId(str(candidate))

    def dataset(self, dataset_id: str) -> Dataset | None:
        return self._datasets.get(DatasetId(dataset_id))

    def dataset_with_fingerprint(self, fingerprint: str) -> DatasetId | None:
        """The first dataset registered with this fingerprint (the same pipeline gets the same id)."""
        return self._dataset_by_fingerprint.get(fingerprint)

    def datasets(self) -> list[Dataset]:
        return list(self._datasets.values())

    def snapshot(self, path: str) -> Snapshot | None:
        return self._snapshots.get(path)

    def snapshots(self) -> list[Snapshot]:
        """Every distributed_save, in the order they started."""
        return list(self._snapshots.values())

    def worker(self, address: str) -> Worker | None:
        return self._workers.get(WorkerAddress(address))

    def worker_addresses(self) -> list[WorkerAddress]:
        """Every worker ever registered, alive or not, in registration order."""
        return list(self._workers)

    def workers(self) -> list[Worker]:
        """Every worker ever registered, alive or not, in registration order."""
        return list(self._workers.values())

    def alive_workers(self) -> list[WorkerAddress]:
        return sorted(a for a, w in self._workers.items() if w.alive)

    def job(self, job_id: int) -> Job | None:
        return self._jobs.get(JobId(job_id))

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def job_named(self, dataset_id: str, job_name: str) -> Job | None:
        job_id = self._job_by_name.get((dataset_id, job_name))
        return None if job_id is None else self._jobs[job_id]

    def datasets_with_job_named(self, job_name: str) -> list[DatasetId]:
        """The datasets that have a job of this name (names are per dataset)."""
        return sorted({dataset_id for dataset_id, name in self._job_by_name if name == job_name})

    def was_dropped(self, kind: str, object_id: int) -> bool:
        """Whether an id of `kind` ("job", "iteration", "task") that the state does not hold was
        in use once (ids are handed out in order and never reused), so retention dropped it."""
        held = {"job": self._jobs.keys(), "iteration": self._iterations.keys(), "task": self._tasks.keys()}[kind]
        return 0 < object_id < self._next_ids[kind] and object_id not in held

    def retired_iterations(self) -> Iterator[Iteration]:
        """Finished iterations without clients: what retention drops once they are old enough."""
        return (i for i in self._iterations.values() if i.finished and not i.client_ids)

    def iteration(self, iteration_id: int) -> Iteration | None:
        return self._iterations.get(IterationId(iteration_id))

    # Lookups of what the state holds (an id it handed out, checked or kept in step with it):
    # KeyError, a bug, otherwise. iteration(), task(), dataset() and snapshot() are for ids from
    # outside, which may be unknown.

    def known_iteration(self, iteration_id: IterationId) -> Iteration:
        return self._iterations[iteration_id]

    def known_task(self, task_id: TaskId) -> Task:
        return self._tasks[task_id]

    def known_dataset(self, dataset_id: DatasetId) -> Dataset:
        return self._datasets[dataset_id]

    def known_snapshot(self, path: str) -> Snapshot:
        return self._snapshots[path]

    def job_of(self, iteration: Iteration) -> Job:
        return self._jobs[iteration.job_id]

    def task(self, task_id: int) -> Task | None:
        return self._tasks.get(TaskId(task_id))

    def client_ids(self) -> list[ClientId]:
        """The iteration clients that hold an iteration now."""
        return sorted(self._iteration_clients)

    def iteration_of_client(self, iteration_client_id: int) -> Iteration | None:
        iteration_id = self._iteration_clients.get(ClientId(iteration_client_id))
        return None if iteration_id is None else self._iterations[iteration_id]

    def unfinished_iterations(self) -> Iterator[Iteration]:
        return (it for it in self._iterations.values() if not it.finished)

    def iteration_has_task_on(self, iteration: Iteration, worker_address: str) -> bool:
        """Whether the worker has a task of the iteration that was not lost with an earlier run of it."""
        return any(
            self._tasks[t].worker_address == worker_address and not self._tasks[t].lost for t in iteration.task_ids
        )

    def lost_tasks_of(self, worker_address: str) -> list[TaskId]:
        """The worker's tasks that a RemoveWorker would lose now."""
        return [t for t in self._tasks_by_worker.get(WorkerAddress(worker_address), []) if not self._tasks[t].finished]

    def active_tasks_of_worker(self, worker_address: str) -> list[Task]:
        """Tasks the worker should be running: not finished, in an unfinished iteration."""
        return [
            self._tasks[t]
            for t in self._tasks_by_worker.get(WorkerAddress(worker_address), [])
            if not self._tasks[t].finished and not self._iterations[self._tasks[t].iteration_id].finished
        ]

    def task_def(self, task: Task, worker_addresses: tuple[str, ...] = ()) -> common_pb2.TaskDef:
        """The task as a worker needs it; `worker_addresses` (static sharding) gives its shard index."""
        iteration = self._iterations[task.iteration_id]
        job = self._jobs[iteration.job_id]
        indices = worker_index.resolve(worker_addresses, self._workers) if worker_addresses else {}
        index = indices.get(task.worker_address)
        static = index is not None
        return common_pb2.TaskDef(
            task_id=task.task_id,
            iteration_id=task.iteration_id,
            job_id=job.job_id,
            dataset_id=job.dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=job.sharding_policy),
            worker_address=task.worker_address,
            worker_index=index if index is not None else 0,
            num_workers=len(worker_addresses) if static else 0,
            num_consumers=job.num_consumers,
            starting_round=task.starting_round,
            skip_elements=task.skip_elements,
            repetition=iteration.repetition,
            use_cross_trainer_cache=job.use_cross_trainer_cache,
            read_key=iteration.read_key,
        )

    def tasks_of(self, iteration: Iteration) -> list[Task]:
        return [self._tasks[t] for t in iteration.task_ids]

    def split_position(self, iteration: Iteration, group: int) -> tuple[int, int]:
        """distributed_epoch: (repetition, next split index) that the group hands out next."""
        return iteration.split_positions.get(group, (0, 0))

    def unfinished_task_count(self, iteration: Iteration) -> int:
        return iteration.unfinished_tasks

    def task_infos(self, iteration: Iteration, only: Iterable[int] | None = None) -> list[tuple[Task, Worker]]:
        """The iteration's tasks (those of `only`, if given), each with its worker, in task order."""
        task_ids = iteration.task_ids if only is None else sorted(t for t in only if t in self._tasks)
        return [(self._tasks[t], self._workers[self._tasks[t].worker_address]) for t in task_ids]

    def summary(self) -> dict[str, int]:
        """Counts of what the state holds, for operators and tests."""
        return {
            "datasets": len(self._datasets),
            "workers": len(self._workers),
            "alive_workers": sum(w.alive for w in self._workers.values()),
            "jobs": len(self._jobs),
            "iterations": len(self._iterations),
            "unfinished_iterations": sum(not it.finished for it in self._iterations.values()),
            "tasks": len(self._tasks),
            "active_tasks": sum(
                not t.finished and not self._iterations[t.iteration_id].finished for t in self._tasks.values()
            ),
            "iteration_clients": len(self._iteration_clients),
            "snapshots": len(self._snapshots),
            "unfinished_snapshots": sum(not s.finished for s in self._snapshots.values()),
        }

    # ---- invariants --------------------------------------------------------

    def validate(self) -> None:
        """Raises StateInvariantError naming the first invariant the state breaks.

        The indexes agree with the objects they index, every reference points
        at an object that exists, lost tasks are finished, an iteration whose
        tasks all finished with one of them not lost is finished, handed-out
        ranges belong to tasks of their iteration, and every id in use is below
        the next id of its kind. O(size of the state): for tests and checks,
        not for every update."""

        def check(condition: bool, message: str) -> None:
            if not condition:
                raise StateInvariantError(message)

        for fingerprint, dataset_id in self._dataset_by_fingerprint.items():
            dataset = self._datasets.get(dataset_id)
            check(
                dataset is not None and dataset.fingerprint == fingerprint,
                f"fingerprint {fingerprint} indexes dataset {dataset_id!r}, which does not have it",
            )
        for dataset in self._datasets.values():
            check(
                dataset.fingerprint in self._dataset_by_fingerprint,
                f"dataset {dataset.dataset_id!r}: its fingerprint is not indexed",
            )
        for (dataset_id, name), job_id in self._job_by_name.items():
            job = self._jobs.get(job_id)
            check(
                job is not None and (job.dataset_id, job.job_name) == (dataset_id, name),
                f"job name {name!r} of dataset {dataset_id!r} indexes job {job_id}, which is not named so",
            )
        for job in self._jobs.values():
            check(job.job_id < self._next_ids["job"], f"job {job.job_id} is not below the next job id")
            check(
                not job.job_name or self._job_by_name.get((job.dataset_id, job.job_name), -1) >= job.job_id,
                f"job {job.job_id}: its name {job.job_name!r} is indexed neither to it nor to a newer job",
            )
            for repetition, iteration_id in job.iterations.items():
                iteration = self._iterations.get(iteration_id)
                check(
                    iteration is not None and iteration.job_id == job.job_id and iteration.repetition == repetition,
                    f"job {job.job_id}: repetition {repetition} names iteration {iteration_id}, not its own",
                )
        for iteration in self._iterations.values():
            check(
                iteration.iteration_id < self._next_ids["iteration"],
                f"iteration {iteration.iteration_id} is not below the next iteration id",
            )
            job = self._jobs.get(iteration.job_id)
            check(
                job is not None and job.iterations.get(iteration.repetition) == iteration.iteration_id,
                f"iteration {iteration.iteration_id} is not its job's repetition {iteration.repetition}",
            )
            check(
                len(set(iteration.task_ids)) == len(iteration.task_ids),
                f"iteration {iteration.iteration_id} lists a task twice",
            )
            tasks: list[Task] = []
            for task_id in iteration.task_ids:
                listed = self._tasks.get(task_id)
                check(
                    listed is not None and listed.iteration_id == iteration.iteration_id,
                    f"iteration {iteration.iteration_id} lists task {task_id}, which is not one of its tasks",
                )
                tasks.append(self._tasks[task_id])
            unfinished, completed = sum(not t.finished for t in tasks), sum(t.finished and not t.lost for t in tasks)
            check(
                (iteration.unfinished_tasks, iteration.completed_tasks) == (unfinished, completed),
                f"iteration {iteration.iteration_id} counts {iteration.unfinished_tasks} unfinished and "
                f"{iteration.completed_tasks} completed tasks, not {unfinished} and {completed}",
            )
            if tasks and all(t.finished for t in tasks) and any(not t.lost for t in tasks):
                check(iteration.finished, f"iteration {iteration.iteration_id}: every task finished, but it did not")
            for client_id in iteration.client_ids:
                check(
                    self._iteration_clients.get(client_id) == iteration.iteration_id,
                    f"iteration {iteration.iteration_id} lists client {client_id}, which holds another iteration",
                )
            for key, (begin, end) in iteration.outstanding_splits.items():
                task = self._tasks.get(key[0])
                check(
                    task is not None and task.iteration_id == iteration.iteration_id and begin <= end,
                    f"iteration {iteration.iteration_id}: range {key} -> {(begin, end)} is not of one of its tasks",
                )
                check(
                    self._tasks[key[0]].received.get(key[1:]) == (begin, end),
                    f"iteration {iteration.iteration_id}: range {key} is outstanding but not among those its task "
                    "received",
                )
            for pool_key, pool in iteration.returned_splits.items():
                check(
                    bool(pool) and all(begin <= end for begin, end in pool),
                    f"iteration {iteration.iteration_id}: returned ranges {pool_key} are empty or reversed",
                )
        for client_id, iteration_id in self._iteration_clients.items():
            check(client_id < self._next_ids["client"], f"client {client_id} is not below the next client id")
            iteration = self._iterations.get(iteration_id)
            check(
                iteration is not None and client_id in iteration.client_ids,
                f"client {client_id} holds iteration {iteration_id}, which does not list it",
            )
        for task in self._tasks.values():
            check(task.task_id < self._next_ids["task"], f"task {task.task_id} is not below the next task id")
            check(
                task.iteration_id in self._iterations and task.task_id in self._iterations[task.iteration_id].task_ids,
                f"task {task.task_id} is not listed by its iteration {task.iteration_id}",
            )
            check(
                task.worker_address in self._workers,
                f"task {task.task_id} runs on unknown worker {task.worker_address}",
            )
            check(
                task.task_id in self._tasks_by_worker.get(task.worker_address, []),
                f"task {task.task_id} is not indexed under its worker {task.worker_address}",
            )
            check(task.finished or not task.lost, f"task {task.task_id} is lost but not finished")
        for snapshot in self._snapshots.values():
            check(
                snapshot.dataset_id in self._datasets,
                f"snapshot {snapshot.path}: its dataset {snapshot.dataset_id!r} is not registered",
            )
            check(
                all(0 <= index < snapshot.num_chunks for index in snapshot.committed),
                f"snapshot {snapshot.path}: a committed chunk is outside [0, {snapshot.num_chunks})",
            )
            complete = len(snapshot.committed) == snapshot.num_chunks
            check(
                not snapshot.finished or bool(snapshot.error_code) or complete,
                f"snapshot {snapshot.path} finished without error with chunks uncommitted",
            )
        for address, task_ids in self._tasks_by_worker.items():
            check(address in self._workers, f"tasks indexed under unknown worker {address}")
            for task_id in task_ids:
                check(
                    task_id in self._tasks and self._tasks[task_id].worker_address == address,
                    f"task {task_id} is indexed under worker {address}, which does not run it",
                )


def update_kinds() -> list[str]:
    """The cases of the Update oneof, as journal.proto declares them."""
    return [field.name for field in journal_pb2.Update.DESCRIPTOR.oneofs_by_name["kind"].fields]


def _split_range(
    iteration: Iteration, group: int, repetition: int, begin: int, end: int, **handed_to
) -> journal_pb2.ProduceSplitsUpdate:
    return journal_pb2.ProduceSplitsUpdate(
        iteration_id=iteration.iteration_id, split_group=group, repetition=repetition, begin=begin, end=end, **handed_to
    )


def _returned_range(
    iteration: Iteration, group: int, repetition: int, begin: int, end: int
) -> journal_pb2.ReturnSplitsUpdate:
    return journal_pb2.ReturnSplitsUpdate(
        iteration_id=iteration.iteration_id, split_group=group, repetition=repetition, begin=begin, end=end
    )


# apply()'s table: one handler per case of the Update oneof, each DispatcherState._apply_<case>
# (a case added to journal.proto without its handler fails at import).
_APPLY: dict[str, Callable[[DispatcherState, Any], None]] = {
    kind: getattr(DispatcherState, f"_apply_{kind}") for kind in update_kinds()
}
