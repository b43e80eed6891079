"""The dispatcher's state and the one function that changes it.

Every change is an Update proto (proto/dataservice/v1/journal.proto). The
server validates a change, journals the Update, then calls
DispatcherState.apply(update). Replaying a journal through apply() rebuilds
the same state, so apply() reads nothing but the update and the state: no
clock, no I/O, no locks, no randomness. Queries are plain methods.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List, Optional, Set, Tuple

from dataservice.v1 import common_pb2, journal_pb2


@dataclasses.dataclass
class Dataset:
    dataset_id: str
    fingerprint: str
    metadata: common_pb2.DatasetMetadata


@dataclasses.dataclass
class Worker:
    address: str
    transfer_address: str
    # False once the dispatcher gave up on it (no heartbeat for worker_timeout_ms).
    alive: bool = True


@dataclasses.dataclass
class Job:
    job_id: int
    dataset_id: str
    sharding_policy: int
    job_name: str
    num_consumers: int
    target_workers: int
    # distributed_epoch: splits in each split group of the pipeline.
    split_group_sizes: List[int] = dataclasses.field(default_factory=list)
    # repetition -> iteration id
    iterations: Dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Iteration:
    iteration_id: int
    job_id: int
    repetition: int
    task_ids: List[int] = dataclasses.field(default_factory=list)
    client_ids: Set[int] = dataclasses.field(default_factory=set)
    # Every task finished, or the iteration was ended early.
    finished: bool = False
    # distributed_epoch: split group -> (repetition, next split index to hand out).
    split_positions: Dict[int, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Ranges handed to a task but not started: (task, group, repetition, index) -> (begin, end).
    outstanding_splits: Dict[Tuple[int, int, int, int], Tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Ranges of lost workers, to hand out again: (group, repetition) -> [(begin, end)].
    returned_splits: Dict[Tuple[int, int], List[Tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # Coordinated reads: clients may read the rounds below this.
    round_limit: int = 0


@dataclasses.dataclass
class Task:
    task_id: int
    iteration_id: int
    worker_address: str
    finished: bool = False
    # Finished because its worker was lost, not because its data ran out.
    lost: bool = False
    # Coordinated reads: the first round it serves.
    starting_round: int = 0


class DispatcherState:
    """Datasets, workers, jobs, iterations, tasks and iteration clients."""

    def __init__(self) -> None:
        self.datasets: Dict[str, Dataset] = {}
        self.dataset_by_fingerprint: Dict[str, str] = {}
        self.workers: Dict[str, Worker] = {}
        self.jobs: Dict[int, Job] = {}
        self.job_by_name: Dict[str, int] = {}
        self.iterations: Dict[int, Iteration] = {}
        self.tasks: Dict[int, Task] = {}
        self.tasks_by_worker: Dict[str, List[int]] = {}
        # iteration client id -> iteration id
        self.iteration_clients: Dict[int, int] = {}
        self._next_ids = {"dataset": 1, "job": 1, "iteration": 1, "task": 1, "client": 1}

    # ---- the one mutator -------------------------------------------------

    def apply(self, update: journal_pb2.Update) -> None:
        kind = update.WhichOneof("kind")
        if kind is None:
            raise ValueError("an Update with no change in it")
        getattr(self, "_apply_" + kind)(getattr(update, kind))

    def _apply_register_dataset(self, u: journal_pb2.RegisterDatasetUpdate) -> None:
        metadata = common_pb2.DatasetMetadata()
        metadata.CopyFrom(u.metadata)
        self.datasets[u.dataset_id] = Dataset(u.dataset_id, u.fingerprint, metadata)
        self.dataset_by_fingerprint.setdefault(u.fingerprint, u.dataset_id)
        if u.dataset_id.isdigit():
            self._bump("dataset", int(u.dataset_id))

    def _apply_register_worker(self, u: journal_pb2.RegisterWorkerUpdate) -> None:
        self.workers[u.worker_address] = Worker(u.worker_address, u.transfer_address)
        self.tasks_by_worker.setdefault(u.worker_address, [])

    def _apply_create_job(self, u: journal_pb2.CreateJobUpdate) -> None:
        self.jobs[u.job_id] = Job(
            job_id=u.job_id,
            dataset_id=u.dataset_id,
            sharding_policy=u.processing_mode.sharding_policy,
            job_name=u.job_name,
            num_consumers=u.num_consumers,
            target_workers=u.target_workers,
            split_group_sizes=list(u.split_group_sizes),
        )
        if u.job_name:
            self.job_by_name[u.job_name] = u.job_id
        self._bump("job", u.job_id)

    def _apply_create_iteration(self, u: journal_pb2.CreateIterationUpdate) -> None:
        self.iterations[u.iteration_id] = Iteration(u.iteration_id, u.job_id, u.repetition)
        self.jobs[u.job_id].iterations[u.repetition] = u.iteration_id
        self._bump("iteration", u.iteration_id)

    def _apply_create_task(self, u: journal_pb2.CreateTaskUpdate) -> None:
        self.tasks[u.task_id] = Task(u.task_id, u.iteration_id, u.worker_address, starting_round=u.starting_round)
        self.iterations[u.iteration_id].task_ids.append(u.task_id)
        self.tasks_by_worker.setdefault(u.worker_address, []).append(u.task_id)
        self._bump("task", u.task_id)

    def _apply_finish_task(self, u: journal_pb2.FinishTaskUpdate) -> None:
        task = self.tasks[u.task_id]
        task.finished = True
        self._finish_if_done(self.iterations[task.iteration_id])

    def _apply_acquire_iteration_client(self, u: journal_pb2.AcquireIterationClientUpdate) -> None:
        self.iteration_clients[u.iteration_client_id] = u.iteration_id
        self.iterations[u.iteration_id].client_ids.add(u.iteration_client_id)
        self._bump("client", u.iteration_client_id)

    def _apply_release_iteration_client(self, u: journal_pb2.ReleaseIterationClientUpdate) -> None:
        iteration_id = self.iteration_clients.pop(u.iteration_client_id)
        self.iterations[iteration_id].client_ids.discard(u.iteration_client_id)

    def _apply_finish_iteration(self, u: journal_pb2.FinishIterationUpdate) -> None:
        self.iterations[u.iteration_id].finished = True

    def _apply_produce_splits(self, u: journal_pb2.ProduceSplitsUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        if u.from_pool:
            pool = iteration.returned_splits[(u.split_group, u.repetition)]
            pool.remove((u.begin, u.end))
            if not pool:
                del iteration.returned_splits[(u.split_group, u.repetition)]
        else:
            iteration.split_positions[u.split_group] = (u.repetition, u.end)
        if u.task_id:
            key = (u.task_id, u.split_group, u.repetition, u.index)
            iteration.outstanding_splits[key] = (u.begin, u.end)

    def _apply_start_splits(self, u: journal_pb2.StartSplitsUpdate) -> None:
        key = (u.task_id, u.split_group, u.repetition, u.index)
        self.iterations[u.iteration_id].outstanding_splits.pop(key, None)

    def _apply_return_splits(self, u: journal_pb2.ReturnSplitsUpdate) -> None:
        pool = self.iterations[u.iteration_id].returned_splits.setdefault((u.split_group, u.repetition), [])
        pool.append((u.begin, u.end))

    def _apply_remove_worker(self, u: journal_pb2.RemoveWorkerUpdate) -> None:
        self.workers[u.worker_address].alive = False
        for task_id in u.lost_tasks:
            task = self.tasks[task_id]
            task.finished = task.lost = True
            iteration = self.iterations[task.iteration_id]
            for key in sorted(k for k in iteration.outstanding_splits if k[0] == task_id):
                _, group, repetition, _ = key
                iteration.returned_splits.setdefault((group, repetition), []).append(
                    iteration.outstanding_splits.pop(key)
                )
            self._finish_if_done(iteration)

    def _finish_if_done(self, iteration: Iteration) -> None:
        """An iteration is done when every task finished and one of them ran out of data: if all
        were lost, the iteration waits for workers to (re)register and take it up."""
        tasks = [self.tasks[t] for t in iteration.task_ids]
        if all(t.finished for t in tasks) and any(not t.lost for t in tasks):
            iteration.finished = True

    def _apply_extend_rounds(self, u: journal_pb2.ExtendRoundsUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        iteration.round_limit = max(iteration.round_limit, u.round_limit)

    def _apply_reserve_ids(self, u: journal_pb2.ReserveIdsUpdate) -> None:
        for kind in self._next_ids:
            self._next_ids[kind] = max(self._next_ids[kind], getattr(u, f"next_{kind}_id"))

    def _bump(self, kind: str, used_id: int) -> None:
        self._next_ids[kind] = max(self._next_ids[kind], used_id + 1)

    # ---- snapshots ---------------------------------------------------------

    def to_updates(self) -> List[journal_pb2.Update]:
        """Updates that, applied to an empty state, rebuild this one (a journal snapshot)."""
        U = journal_pb2.Update
        out: List[journal_pb2.Update] = []
        for d in self.datasets.values():
            out.append(
                U(
                    register_dataset=journal_pb2.RegisterDatasetUpdate(
                        dataset_id=d.dataset_id, fingerprint=d.fingerprint, metadata=d.metadata
                    )
                )
            )
        for w in self.workers.values():
            out.append(
                U(
                    register_worker=journal_pb2.RegisterWorkerUpdate(
                        worker_address=w.address, transfer_address=w.transfer_address
                    )
                )
            )
        for j in sorted(self.jobs.values(), key=lambda j: j.job_id):
            out.append(
                U(
                    create_job=journal_pb2.CreateJobUpdate(
                        job_id=j.job_id,
                        dataset_id=j.dataset_id,
                        processing_mode=common_pb2.ProcessingModeDef(sharding_policy=j.sharding_policy),
                        job_name=j.job_name,
                        num_consumers=j.num_consumers,
                        target_workers=j.target_workers,
                        split_group_sizes=j.split_group_sizes,
                    )
                )
            )
        iterations = sorted(self.iterations.values(), key=lambda i: i.iteration_id)
        for it in iterations:
            out.append(
                U(
                    create_iteration=journal_pb2.CreateIterationUpdate(
                        iteration_id=it.iteration_id, job_id=it.job_id, repetition=it.repetition
                    )
                )
            )
            if it.round_limit:
                out.append(
                    U(
                        extend_rounds=journal_pb2.ExtendRoundsUpdate(
                            iteration_id=it.iteration_id, round_limit=it.round_limit
                        )
                    )
                )
            for group, (repetition, end) in sorted(it.split_positions.items()):
                out.append(
                    U(
                        produce_splits=journal_pb2.ProduceSplitsUpdate(
                            iteration_id=it.iteration_id, split_group=group, repetition=repetition, begin=end, end=end
                        )
                    )
                )
        tasks = sorted(self.tasks.values(), key=lambda t: t.task_id)
        for t in tasks:
            out.append(
                U(
                    create_task=journal_pb2.CreateTaskUpdate(
                        task_id=t.task_id,
                        iteration_id=t.iteration_id,
                        worker_address=t.worker_address,
                        starting_round=t.starting_round,
                    )
                )
            )
        for it in iterations:
            # Outstanding ranges pass through the pool (return, then hand out from it);
            # the pool's own ranges follow, in order.
            for (task_id, group, repetition, index), (begin, end) in it.outstanding_splits.items():
                out.append(
                    U(
                        return_splits=journal_pb2.ReturnSplitsUpdate(
                            iteration_id=it.iteration_id, split_group=group, repetition=repetition, begin=begin, end=end
                        )
                    )
                )
                out.append(
                    U(
                        produce_splits=journal_pb2.ProduceSplitsUpdate(
                            iteration_id=it.iteration_id,
                            split_group=group,
                            repetition=repetition,
                            begin=begin,
                            end=end,
                            task_id=task_id,
                            index=index,
                            from_pool=True,
                        )
                    )
                )
            for (group, repetition), pool in it.returned_splits.items():
                for begin, end in pool:
                    out.append(
                        U(
                            return_splits=journal_pb2.ReturnSplitsUpdate(
                                iteration_id=it.iteration_id,
                                split_group=group,
                                repetition=repetition,
                                begin=begin,
                                end=end,
                            )
                        )
                    )
        for t in tasks:
            if t.finished and not t.lost:
                out.append(U(finish_task=journal_pb2.FinishTaskUpdate(task_id=t.task_id)))
        for w in self.workers.values():
            lost = [t.task_id for t in tasks if t.lost and t.worker_address == w.address]
            if lost or not w.alive:
                out.append(U(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=w.address, lost_tasks=lost)))
                if w.alive:  # it came back after it was lost
                    out.append(
                        U(
                            register_worker=journal_pb2.RegisterWorkerUpdate(
                                worker_address=w.address, transfer_address=w.transfer_address
                            )
                        )
                    )
        for client_id, iteration_id in sorted(self.iteration_clients.items()):
            out.append(
                U(
                    acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(
                        iteration_client_id=client_id, iteration_id=iteration_id
                    )
                )
            )
        for it in iterations:
            if it.finished:
                out.append(U(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=it.iteration_id)))
        out.append(
            U(
                reserve_ids=journal_pb2.ReserveIdsUpdate(
                    **{f"next_{kind}_id": value for kind, value in self._next_ids.items()}
                )
            )
        )
        return out

    # ---- queries ---------------------------------------------------------

    def next_id(self, kind: str) -> int:
        """The id the next created object of `kind` gets (the caller puts it in the Update)."""
        return self._next_ids[kind]

    def next_dataset_id(self) -> str:
        candidate = self._next_ids["dataset"]
        while str(candidate) in self.datasets:
            candidate += 1
        return str(candidate)

    def iteration_of_client(self, iteration_client_id: int) -> Optional[Iteration]:
        iteration_id = self.iteration_clients.get(iteration_client_id)
        return None if iteration_id is None else self.iterations[iteration_id]

    def unfinished_iterations(self) -> Iterator[Iteration]:
        return (it for it in self.iterations.values() if not it.finished)

    def iteration_has_task_on(self, iteration: Iteration, worker_address: str) -> bool:
        """Whether the worker has a task of the iteration that was not lost with an earlier run of it."""
        return any(
            self.tasks[t].worker_address == worker_address and not self.tasks[t].lost for t in iteration.task_ids
        )

    def lost_tasks_of(self, worker_address: str) -> List[int]:
        """The worker's tasks that a RemoveWorker would lose now."""
        return [t for t in self.tasks_by_worker.get(worker_address, []) if not self.tasks[t].finished]

    def alive_workers(self) -> List[str]:
        return sorted(a for a, w in self.workers.items() if w.alive)

    def active_tasks_of_worker(self, worker_address: str) -> List[Task]:
        """Tasks the worker should be running: not finished, in an unfinished iteration."""
        return [
            self.tasks[t]
            for t in self.tasks_by_worker.get(worker_address, [])
            if not self.tasks[t].finished and not self.iterations[self.tasks[t].iteration_id].finished
        ]

    def task_def(self, task: Task, worker_addresses: Tuple[str, ...] = ()) -> common_pb2.TaskDef:
        """The task as a worker needs it; `worker_addresses` (static sharding) gives its shard index."""
        iteration = self.iterations[task.iteration_id]
        job = self.jobs[iteration.job_id]
        static = task.worker_address in worker_addresses
        return common_pb2.TaskDef(
            task_id=task.task_id,
            iteration_id=task.iteration_id,
            job_id=job.job_id,
            dataset_id=job.dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=job.sharding_policy),
            worker_address=task.worker_address,
            worker_index=worker_addresses.index(task.worker_address) if static else 0,
            num_workers=len(worker_addresses) if static else 0,
            num_consumers=job.num_consumers,
            starting_round=task.starting_round,
        )

    def split_position(self, iteration: Iteration, group: int) -> Tuple[int, int]:
        return iteration.split_positions.get(group, (0, 0))

    def unfinished_task_count(self, iteration: Iteration) -> int:
        return sum(not self.tasks[t].finished for t in iteration.task_ids)

    def task_infos(self, iteration: Iteration) -> List[Tuple[Task, Worker]]:
        return [(self.tasks[t], self.workers[self.tasks[t].worker_address]) for t in iteration.task_ids]
