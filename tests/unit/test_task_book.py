"""TaskBook: the worker state machine's decisions carried out on the maps streams read,
under one lock."""

import threading
import time

from dataservice.v1 import common_pb2, dispatcher_pb2
from dataservice.worker.task_book import TaskBook
from dataservice.worker.worker_state import (
    DeleteTask,
    HeartbeatAnswered,
    HeartbeatNow,
    Stopping,
    StopRunner,
    TaskFinished,
    TasksReported,
    Tick,
)


class FakeRunner:
    def __init__(self, task_id):
        self.task_id = task_id
        self.producing = False

    def start_producing(self):
        self.producing = True


def start(task_id, rounds=None):
    return lambda: (FakeRunner(task_id), rounds)


def deleted(*task_ids: int) -> HeartbeatAnswered:
    return HeartbeatAnswered(dispatcher_pb2.WorkerHeartbeatResponse(tasks_to_delete=task_ids))


def test_a_task_starts_once_and_finishes_once():
    book = TaskBook()
    started = []
    assert book.add(1, lambda: started.append(1) or (FakeRunner(1), None)) is not None
    assert book.add(1, lambda: started.append(2) or (FakeRunner(1), None)) is None, "started twice"
    assert started == [1]
    assert book.running() == [1] and book.is_known(1)
    stop, heartbeat = book.handle(TaskFinished(1, at=10.0))
    assert isinstance(stop, StopRunner) and stop.runner.task_id == 1 and heartbeat == HeartbeatNow()
    assert book.handle(TaskFinished(1, at=11.0)) == []
    assert book.running() == [] and book.is_finished(1) and book.runner(1) is None
    assert book.add(1, start(1)) is None, "a finished task does not start again"
    assert book.unreported() == [1]
    book.handle(TasksReported((1,)))
    assert book.unreported() == []


def test_deleted_tasks_are_not_finished_and_their_runners_round_servers_and_secrets_go():
    book = TaskBook()
    book.add(2, start(2, rounds="rounds-of-2"), secret="secret-2")
    assert book.round_robin(2) == "rounds-of-2"
    (delete,) = book.handle(deleted(2))
    assert isinstance(delete, DeleteTask) and delete.runner.task_id == 2
    assert book.round_robin(2) is None and not book.is_finished(2) and book.unreported() == []
    assert book.receipt(2, 5) == "", "its secret is gone"
    # Deleting a task the worker does not run hands back no runner.
    (again,) = book.handle(deleted(2))
    assert again.runner is None


def test_wait_for_wakes_when_the_task_starts_and_asks_for_a_heartbeat():
    asked = threading.Event()
    book = TaskBook(on_unknown_task=asked.set)
    threading.Timer(0.1, lambda: book.add(3, start(3))).start()
    began = time.monotonic()
    runner = book.wait_for(3, timeout_s=5)
    assert runner.task_id == 3 and time.monotonic() - began < 2
    assert asked.is_set()
    assert book.wait_for(4, timeout_s=0.05) is None


def test_stopping_refuses_new_tasks_and_hands_back_the_running_ones():
    book = TaskBook()
    book.add(5, start(5))
    assert [(i.task_id, i.runner.task_id) for i in book.handle(Stopping())] == [(5, 5)]
    assert book.running() == []
    assert book.add(6, start(6)) is None
    assert book.wait_for(6, timeout_s=5) is None, "a stopped book does not make streams wait"


def test_finished_tasks_are_forgotten_once_reported_old_and_unused():
    book = TaskBook(retain_s=60)
    for task_id in (1, 2, 3, 4):
        book.add(task_id, start(task_id), secret=f"secret-{task_id}")
        book.handle(TaskFinished(task_id, at=100.0))
    book.handle(TasksReported((1, 2, 3)))  # 4 is not reported yet
    book.handle(Tick(now=150.0))
    assert all(book.is_finished(t) for t in (1, 2, 3, 4)), "too recent"
    # 2 still has a client's delivery record: kept, with its secret.
    book.handle(Tick(now=161.0, in_use=frozenset({2})))
    assert not book.is_known(1) and not book.is_finished(3)
    assert book.is_finished(2) and book.is_finished(4)
    assert book.may_read(2, 7, "wrong") is False  # its secret is still checked
    assert book.receipt(2, 5) != ""
    book.handle(Tick(now=161.0))
    assert not book.is_finished(2) and book.receipt(2, 5) == ""


def test_a_finished_task_never_reappears_as_running_in_a_heartbeat():
    # The heartbeat thread reads running() while a stream finishes a task: never both.
    book = TaskBook()
    book.add(7, start(7))
    book.handle(TaskFinished(7, at=1.0))
    assert 7 not in book.running() and book.unreported() == [7]
    assert (
        book.handle(
            HeartbeatAnswered(dispatcher_pb2.WorkerHeartbeatResponse(new_tasks=[common_pb2.TaskDef(task_id=7)]))
        )
        == []
    )
