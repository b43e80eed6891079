"""The client reader's decisions (client/reader_state.py), event by event, without a cluster."""

from dataservice.client.reader_state import (
    AbandonStream,
    HeartbeatNow,
    OpenStream,
    ReaderState,
    ReportConsumedEnds,
    WakeConsumer,
)
from dataservice.v1 import common_pb2, dispatcher_pb2


def answer(*tasks: common_pb2.TaskInfo, finished: bool = False) -> dispatcher_pb2.ClientHeartbeatResponse:
    return dispatcher_pb2.ClientHeartbeatResponse(tasks=tasks, iteration_finished=finished)


def task(task_id: int, worker: str = "w:1", finished: bool = False, lost: bool = False) -> common_pb2.TaskInfo:
    return common_pb2.TaskInfo(task_id=task_id, worker_address=worker, finished=finished, lost=lost)


def test_each_new_task_gets_one_stream():
    state = ReaderState()
    first = state.on_heartbeat(answer(task(1), task(2, "w:2")))
    assert [i.task.task_id for i in first if isinstance(i, OpenStream)] == [1, 2]
    # The same tasks again (a full answer after a dispatcher restart) open nothing.
    assert state.on_heartbeat(answer(task(1), task(2, "w:2"))) == []
    assert [i.task.task_id for i in state.on_heartbeat(answer(task(3, "w:3")))] == [3]


def test_a_stopping_reader_opens_no_stream():
    state = ReaderState()
    assert state.on_heartbeat(answer(task(1)), stopped=True) == []
    assert not state.streams


def test_a_lost_task_with_a_stream_is_abandoned_and_one_without_is_only_noted():
    state = ReaderState()
    state.on_heartbeat(answer(task(1)))
    assert state.on_heartbeat(answer(task(1, finished=True, lost=True), task(2, finished=True, lost=True))) == [
        AbandonStream(1)
    ]
    assert state.finished_tasks == {1, 2}
    # A task that finished because its data ran out is not abandoned: its stream reads to the end.
    state.on_heartbeat(answer(task(3)))
    assert state.on_heartbeat(answer(task(3, finished=True))) == []


def test_the_consumer_is_woken_once_when_the_iteration_finishes():
    state = ReaderState()
    assert WakeConsumer() in state.on_heartbeat(answer(task(1), finished=True))
    assert WakeConsumer() not in state.on_heartbeat(answer(finished=True))
    assert state.finished(reads_some_tasks=False)


def test_a_tasks_end_is_reported_once_the_consumer_has_passed_all_it_received():
    state = ReaderState()
    state.on_heartbeat(answer(task(1), task(2)))
    state.on_passed([(1, 4)], {1: 4})
    assert state.on_stream_ended(1, end_of_sequence=True, received=10) == [WakeConsumer(), HeartbeatNow()]
    assert state.on_passed([(1, 5)], {1: 10}) == [], "one element still to pass"
    assert state.on_passed([(1, 1), (2, 3)], {1: 10, 2: 7}) == [ReportConsumedEnds(frozenset({1}))]
    assert state.consumed_ends == {1}
    # Passing the end once more reports nothing again.
    assert state.on_passed([], {1: 10}) == []


def test_an_end_the_consumer_had_already_reached_is_reported_with_the_streams_end():
    state = ReaderState()
    state.on_heartbeat(answer(task(1)))
    state.on_passed([(1, 6)], {1: 6})
    assert state.on_stream_ended(1, end_of_sequence=True, received=6)[0] == ReportConsumedEnds(frozenset({1}))


def test_a_stream_that_ends_without_its_tasks_end_reports_nothing():
    state = ReaderState()
    state.on_heartbeat(answer(task(1)))
    state.on_passed([(1, 6)], {1: 6})
    assert state.on_stream_ended(1, end_of_sequence=False, received=6) == [WakeConsumer(), HeartbeatNow()]
    assert not state.consumed_ends


def test_reading_some_tasks_ends_when_each_of_them_has_ended_or_finished():
    state = ReaderState()
    assert not state.finished(reads_some_tasks=True), "no stream yet: not over"
    state.on_heartbeat(answer(task(1), task(2)))
    state.on_stream_ended(1, end_of_sequence=True, received=3)
    assert not state.finished(reads_some_tasks=True)
    assert not state.finished(reads_some_tasks=False), "reading every task waits for the dispatcher's word"
    state.on_heartbeat(answer(task(2, finished=True, lost=True)))
    assert state.finished(reads_some_tasks=True)
    assert not state.finished(reads_some_tasks=False)
