"""distributed_epoch's split hand-out: which range of a source's splits each task reads next.

A task asks for range k+1 of a (split group, repetition) only after it has started range k, so
asking says that range k started (journaled: a lost worker's started ranges are not handed out
again, its unstarted one returns to the pool). A retry of the same (group, repetition, index)
gets the same range. Ranges returned by lost workers go out first, then a resumed task's replay,
then a fair share of what is left (split_range_size), so that the last splits spread over the
workers and a lost worker takes at most the one range it had not started with it.
"""

from __future__ import annotations

from dataservice import status
from dataservice.dispatcher.context import CoreContext
from dataservice.dispatcher.state import Iteration, IterationId, Job, TaskId
from dataservice.v1 import common_pb2, dispatcher_pb2, journal_pb2

# Most splits one GetSplits answer hands out.
DEFAULT_MAX_SPLITS = 1024
# A range is at most 1/(this x unfinished tasks) of the splits left.
RANGE_SHARE_DIVISOR = 8


def split_range_size(remaining: int, unfinished_tasks: int, max_splits: int) -> int:
    """How many splits one GetSplits answer hands out: a small share of what is left, so that
    the last splits spread over the workers and a lost worker takes at most the one range it
    had started with it; at least 1, at most `max_splits`."""
    fair = max(1, remaining // (RANGE_SHARE_DIVISOR * max(1, unfinished_tasks)))
    return min(max_splits, fair)


class SplitHandout:
    """GetSplits, and the split positions a resumed iteration starts from."""

    def __init__(self, ctx: CoreContext):
        self._ctx = ctx

    def get_splits(self, request: dispatcher_pb2.GetSplitsRequest) -> dispatcher_pb2.GetSplitsResponse:
        if request.repetition < 0 or request.max_splits < 0:
            raise status.invalid_argument("repetition and max_splits must be >= 0")
        ctx = self._ctx
        with ctx.lock:
            iteration = ctx.state.iteration(request.iteration_id)
            if iteration is None:
                raise status.not_found(f"iteration {request.iteration_id} is not known to {ctx.where}")
            job = ctx.state.job_of(iteration)
            if job.sharding_policy != common_pb2.SHARDING_POLICY_DYNAMIC:
                raise status.failed_precondition(
                    f"iteration {request.iteration_id} is not a distributed_epoch iteration: it has no splits"
                )
            if not 0 <= request.split_group < len(job.split_group_sizes):
                raise status.invalid_argument(
                    f"split group {request.split_group} out of range: the pipeline has {len(job.split_group_sizes)}"
                )
            task = ctx.state.task(request.task_id)
            if task is None or task.iteration_id != iteration.iteration_id:
                raise status.invalid_argument(
                    f"task {request.task_id} is not a task of iteration {iteration.iteration_id}"
                )
            return self._next_splits(job, iteration, task.task_id, request)

    def _next_splits(
        self, job: Job, iteration: Iteration, task_id: TaskId, request: dispatcher_pb2.GetSplitsRequest
    ) -> dispatcher_pb2.GetSplitsResponse:
        ctx = self._ctx
        group, repetition, index = request.split_group, request.repetition, request.index
        key = (task_id, group, repetition, index)
        if index > 0 and (task_id, group, repetition, index - 1) in iteration.outstanding_splits:
            ctx.commit(
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
        if ctx.state.known_task(task_id).lost:
            # Not end_of_splits: that would let the worker produce the range it holds, which its
            # loss returned to the pool (it was not started) and another task may produce too.
            raise status.OutOfRangeError(
                f"task {task_id} was lost (its worker was removed by {ctx.where}): it must produce nothing more; "
                "its unstarted ranges went back to the pool"
            )
        if iteration.finished or ctx.state.known_task(task_id).finished:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)

        def hand_out(begin: int, end: int, from_pool: bool, replayed: bool = False) -> dispatcher_pb2.GetSplitsResponse:
            ctx.commit(
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

        replay = ctx.state.known_task(task_id).replay.get((group, repetition), [])
        if index < len(replay):
            begin, end = replay[index]
            return hand_out(begin, end, from_pool=False, replayed=True)

        pool = iteration.returned_splits.get((group, repetition))
        if pool:
            return hand_out(*pool[0], from_pool=True)
        current, begin = ctx.state.split_position(iteration, group)
        if repetition < current:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)
        if repetition > current:
            begin = 0
        remaining = job.split_group_sizes[group] - begin
        if remaining <= 0:
            return dispatcher_pb2.GetSplitsResponse(end_of_splits=True)
        count = split_range_size(
            remaining, ctx.state.unfinished_task_count(iteration), request.max_splits or DEFAULT_MAX_SPLITS
        )
        return hand_out(begin, begin + count, from_pool=False)

    def copy_positions(self, saved_iteration: Iteration, iteration_id: IterationId) -> None:
        """Gives a resumed iteration the saved one's split positions and pool: the splits that no
        saved task received. Call with the lock held."""
        for group, (repetition, end) in sorted(saved_iteration.split_positions.items()):
            self._ctx.commit(
                produce_splits=journal_pb2.ProduceSplitsUpdate(
                    iteration_id=iteration_id, split_group=group, repetition=repetition, begin=end, end=end
                )
            )
        for (group, repetition), pool in sorted(saved_iteration.returned_splits.items()):
            for begin, end in pool:
                self._ctx.commit(
                    return_splits=journal_pb2.ReturnSplitsUpdate(
                        iteration_id=iteration_id, split_group=group, repetition=repetition, begin=begin, end=end
                    )
                )
