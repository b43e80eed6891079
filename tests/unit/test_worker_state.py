"""The worker's decisions (worker/worker_state.py), event by event, on a fake clock, without
a cluster or threads."""

import pytest

from dataservice.v1 import common_pb2, dispatcher_pb2
from dataservice.worker.worker_state import (
    DeleteTask,
    DropSaveChunk,
    ForgetTasks,
    HeartbeatAnswered,
    HeartbeatNow,
    StartTask,
    Stopping,
    StopRunner,
    TaskFinished,
    TaskOffered,
    TasksReported,
    TaskStarted,
    Tick,
    WorkerState,
    WriteSaveChunk,
)


def task(task_id: int) -> common_pb2.TaskDef:
    return common_pb2.TaskDef(task_id=task_id, dataset_id="d", iteration_id=1)


def answer(new=(), delete=(), chunks=(), drop=()) -> HeartbeatAnswered:
    return HeartbeatAnswered(
        dispatcher_pb2.WorkerHeartbeatResponse(
            new_tasks=[task(t) for t in new],
            tasks_to_delete=delete,
            snapshot_chunks=chunks,
            snapshot_chunks_to_drop=drop,
        )
    )


def started(state: WorkerState, *task_ids: int) -> None:
    for task_id in task_ids:
        assert state.handle(TaskStarted(task_id)) == []


def test_new_tasks_start_once_whether_pushed_or_answered():
    state = WorkerState(retain_s=300)
    assert state.handle(answer(new=[1, 2])) == [StartTask(task(1)), StartTask(task(2))]
    started(state, 1)
    # Offered again (the next heartbeat, or ProcessTask racing it): only the one not running yet.
    assert state.handle(answer(new=[1, 2])) == [StartTask(task(2))]
    assert state.handle(TaskOffered(task(1))) == []
    started(state, 2)
    assert state.handle(TaskOffered(task(2))) == [] and state.running == {1, 2}


def test_a_finished_task_stops_its_runner_heartbeats_now_and_never_starts_again():
    state = WorkerState(retain_s=300)
    started(state, 3)
    assert state.handle(TaskFinished(3, at=10.0)) == [StopRunner(3), HeartbeatNow()]
    assert state.handle(TaskFinished(3, at=11.0)) == [], "a second end changes nothing"
    assert state.running == set() and state.finished == {3: 10.0} and state.unreported == {3}
    # A dispatcher that has not heard of the end yet offers it again: not restarted.
    assert state.handle(answer(new=[3])) == []
    assert state.handle(TaskOffered(task(3))) == []
    assert state.handle(TasksReported((3,))) == [] and state.unreported == set()


def test_deleted_tasks_stop_and_a_task_deleted_in_the_same_answer_does_not_start():
    state = WorkerState(retain_s=300)
    started(state, 4)
    out = state.handle(answer(new=[5, 6], delete=[4, 5]))
    assert out == [DeleteTask(4), DeleteTask(5), StartTask(task(6))]
    assert state.running == set()
    # A deleted task was not finished: nothing to report.
    assert state.unreported == set() and 4 not in state.finished


def test_finished_tasks_are_forgotten_after_retention_once_reported_and_unread():
    state = WorkerState(retain_s=60)
    started(state, 1, 2, 3, 4)
    for task_id in (1, 2, 3, 4):
        state.handle(TaskFinished(task_id, at=100.0))
    state.handle(TasksReported((1, 2, 3)))
    assert state.handle(Tick(now=159.0)) == [], "younger than the retention"
    assert state.handle(Tick(now=161.0, in_use=frozenset({2}))) == [ForgetTasks((1, 3))]
    assert state.handle(Tick(now=162.0)) == [ForgetTasks((2,))]
    # 4 was never reported: kept (the dispatcher must still hear that it finished).
    assert state.handle(Tick(now=10_000.0)) == [] and set(state.finished) == {4}
    state.handle(TasksReported((4,)))
    assert state.handle(Tick(now=10_000.0)) == [ForgetTasks((4,))]
    assert not state.is_known(4)


def test_save_chunks_are_started_and_dropped_as_the_dispatcher_says_until_stopping():
    response = dispatcher_pb2.WorkerHeartbeatResponse()
    assigned = response.snapshot_chunks.add(path="/saves/a", chunk_index=3)
    dropped = response.snapshot_chunks_to_drop.add(path="/saves/a", chunk_index=2)
    state = WorkerState(retain_s=300)
    assert state.handle(HeartbeatAnswered(response)) == [WriteSaveChunk(assigned), DropSaveChunk(dropped)]
    state.handle(Stopping())
    assert state.handle(HeartbeatAnswered(response)) == [DropSaveChunk(dropped)], "no new writes while stopping"


def test_stopping_stops_every_running_task_and_refuses_new_ones():
    state = WorkerState(retain_s=300)
    started(state, 8, 9)
    state.handle(TaskFinished(9, at=1.0))
    assert state.handle(Stopping()) == [StopRunner(8)]
    assert state.handle(answer(new=[10])) == []
    assert state.handle(TaskOffered(task(11))) == []
    assert state.handle(TaskFinished(8, at=2.0)) == [], "its runner was stopped already"
    assert state.is_known(12)


def test_an_unknown_event_is_refused():
    with pytest.raises(TypeError, match="not a worker event"):
        WorkerState(retain_s=1).handle("heartbeat")  # type: ignore[arg-type]
