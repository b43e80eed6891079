"""Resuming a restored iterator: the tasks of a new iteration that continues a saved one.

A checkpoint of a service iterator holds, per task of its iteration, how many
of the task's elements the consumer had gone past. Pipelines that are
deterministic given their input produce the same elements again from the
same input, so the new iteration re-runs each saved task's input and its
worker skips what the consumer had taken:

- distributed_epoch: a new task replays, in order, the split ranges the saved
  task had received (and, if that task was itself replaying, the ranges it had
  still to replay), then asks for new ranges; the new iteration starts with
  the saved one's split positions and pool, so every range of the epoch is
  either replayed by one task or handed out once, as before.
- parallel_epochs: every task runs the whole dataset; a new task continues
  one saved task's stream, on the same worker where it is still alive.
- static sharding: a task's shard is its worker's, so it continues there.

Workers that get no replaying task get a fresh one, as when a worker joins.
Pure functions of the state, and the checks that refuse an impossible or altered
checkpoint; the core commits what they plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from dataservice import read_keys, status
from dataservice.dispatcher.state import Job, Task, TaskId
from dataservice.modes import POLICY_NAMES
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2


@dataclasses.dataclass
class PlannedTask:
    worker_address: str
    skip_elements: int = 0
    replay: list[journal_pb2.SplitRange] = dataclasses.field(default_factory=list)


def positions(tasks: Iterable[Task], consumed: Mapping[int, int]) -> dict[TaskId, int]:
    """Per task, how far into its pipeline's elements the consumer had gone: the elements the task
    skipped itself (a resumed task) plus those the consumer took from its stream."""
    return {t.task_id: t.skip_elements + consumed.get(t.task_id, 0) for t in tasks}


def ranges_to_replay(task: Task) -> list[journal_pb2.SplitRange]:
    """The ranges `task` received, in order per (group, repetition), followed by those it had
    still to replay: the input of its element stream."""
    out: list[journal_pb2.SplitRange] = []
    keys = sorted({key[:2] for key in task.received} | set(task.replay))
    for group, repetition in keys:
        received = sorted((i, r) for (g, rep, i), r in task.received.items() if (g, rep) == (group, repetition))
        ranges = [r for _, r in received]
        ranges += task.replay.get((group, repetition), [])[len(ranges) :]
        out.extend(journal_pb2.SplitRange(split_group=group, repetition=repetition, begin=b, end=e) for b, e in ranges)
    return out


def plan_tasks(
    sharding_policy: int,
    saved_tasks: Sequence[Task],
    saved_positions: Mapping[int, int],
    alive_workers: Sequence[str],
) -> list[PlannedTask]:
    """The tasks of the resumed iteration. Lost saved tasks are replayed too: what their stream
    delivered before the loss is skipped, what it had not delivered comes now."""
    workers = sorted(alive_workers)
    planned: list[PlannedTask] = []
    if sharding_policy == common_pb2.SHARDING_POLICY_DYNAMIC:
        replaying = [t for t in saved_tasks if t.received or t.replay or saved_positions[t.task_id]]
        for i, task in enumerate(replaying):
            planned.append(
                PlannedTask(workers[i % len(workers)], saved_positions[task.task_id], ranges_to_replay(task))
            )
    elif sharding_policy == common_pb2.SHARDING_POLICY_OFF:
        free = list(workers)
        # Where a saved task's worker is still alive, its stream continues there.
        ordered = sorted(saved_tasks, key=lambda t: (t.worker_address not in free, t.task_id))
        for task in ordered:
            if not free:
                break  # fewer workers than before: the extra streams end, as when a worker is lost
            address = task.worker_address if task.worker_address in free else free[0]
            free.remove(address)
            planned.append(PlannedTask(address, saved_positions[task.task_id]))
    else:
        # Static sharding: the shard belongs to the worker address; its task waits for it there.
        for task in saved_tasks:
            planned.append(PlannedTask(task.worker_address, saved_positions[task.task_id]))
    covered = {p.worker_address for p in planned}
    planned.extend(PlannedTask(w) for w in workers if w not in covered)
    return planned


def check_positions(
    sharding_policy: int, cardinality: int, saved_positions: dict[int, int], named: Iterable[int]
) -> None:
    """INVALID_ARGUMENT for a checkpoint whose positions (`saved_positions`, from positions();
    `named`: the tasks the checkpoint names) the journal says are impossible: a task past the end
    of a dataset of known cardinality (every task's stream is at most one pass; in distributed_epoch all tasks together
    are). Receipts (check_receipts) bound each task by what it sent; this bound also holds for
    the elements a resumed task skipped before its stream began."""
    if cardinality < 0:
        return
    for task_id in named:
        if saved_positions[task_id] > cardinality:
            raise status.invalid_argument(
                f"the checkpoint says its consumer had gone {saved_positions[task_id]} elements into task {task_id}, "
                f"but the dataset has {cardinality}: the checkpoint is not of this dataset, or was altered"
            )
    if sharding_policy == common_pb2.SHARDING_POLICY_DYNAMIC and sum(saved_positions.values()) > cardinality:
        raise status.invalid_argument(
            f"the checkpoint says its consumer had taken {sum(saved_positions.values())} elements of an epoch of "
            f"{cardinality} (distributed_epoch): the checkpoint is not of this dataset, or was altered"
        )


def check_receipts(secret: str, progress: Iterable[dispatcher_pb2.TaskProgress]) -> None:
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


def check_resumable(saved: Job, request: dispatcher_pb2.GetOrCreateJobRequest) -> None:
    """A restored iterator must read what the saved one read; the error names every mismatch."""
    mismatches = []
    if saved.dataset_id != request.dataset_id:
        mismatches.append(
            f"the saved iterator read dataset {saved.dataset_id!r}, this one reads dataset {request.dataset_id!r} "
            "(the same pipeline definition registers as the same dataset)"
        )
    if saved.sharding_policy != request.processing_mode.sharding_policy:
        mismatches.append(
            f"the saved iterator read in processing mode {POLICY_NAMES[saved.sharding_policy]}, this one in "
            f"{POLICY_NAMES.get(request.processing_mode.sharding_policy, request.processing_mode.sharding_policy)}"
        )
    if mismatches:
        raise status.failed_precondition(
            "cannot restore the iterator into a different pipeline: " + "; ".join(mismatches)
        )
