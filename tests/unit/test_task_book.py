"""TaskBook: a worker's running, finished and unreported tasks under one lock."""

import threading
import time

from dataservice.worker.task_book import TaskBook


class FakeRunner:
    def __init__(self, task_id):
        self.task_id = task_id
        self.producing = False

    def start_producing(self):
        self.producing = True


def start(task_id, rounds=None):
    return lambda: (FakeRunner(task_id), rounds)


def test_a_task_starts_once_and_finishes_once():
    book = TaskBook()
    started = []
    assert book.add(1, lambda: started.append(1) or (FakeRunner(1), None)) is not None
    assert book.add(1, lambda: started.append(2) or (FakeRunner(1), None)) is None, "started twice"
    assert started == [1]
    assert book.running() == [1] and book.is_known(1)
    runner = book.finish(1)
    assert runner.task_id == 1
    assert book.finish(1) is None
    assert book.running() == [] and book.is_finished(1)
    assert book.add(1, start(1)) is None, "a finished task does not start again"
    assert book.unreported() == [1]
    book.mark_reported([1])
    assert book.unreported() == []


def test_removed_tasks_are_not_finished_and_round_servers_go_with_them():
    book = TaskBook()
    book.add(2, start(2, rounds="rounds-of-2"))
    assert book.round_robin(2) == "rounds-of-2"
    assert book.remove(2).task_id == 2
    assert book.round_robin(2) is None and not book.is_finished(2) and book.unreported() == []


def test_wait_for_wakes_when_the_task_starts_and_asks_for_a_heartbeat():
    asked = threading.Event()
    book = TaskBook(on_unknown_task=asked.set)
    threading.Timer(0.1, lambda: book.add(3, start(3))).start()
    began = time.monotonic()
    runner = book.wait_for(3, timeout_s=5)
    assert runner.task_id == 3 and time.monotonic() - began < 2
    assert asked.is_set()
    assert book.wait_for(4, timeout_s=0.05) is None


def test_close_refuses_new_tasks_and_returns_the_running_ones():
    book = TaskBook()
    book.add(5, start(5))
    assert [r.task_id for r in book.close()] == [5]
    assert book.add(6, start(6)) is None
    assert book.wait_for(6, timeout_s=5) is None, "a closed book does not make streams wait"


def test_finished_tasks_are_forgotten_once_reported_old_and_unused():
    book = TaskBook()
    for task_id in (1, 2, 3, 4):
        book.add(task_id, start(task_id), secret=f"secret-{task_id}")
        book.finish(task_id)
    book.mark_reported([1, 2, 3])  # 4 is not reported yet
    finished_by = time.monotonic()
    assert book.forget_finished(before=finished_by - 60, in_use=set()) == [], "too recent"
    # 2 still has a client's delivery record: kept, with its secret.
    assert sorted(book.forget_finished(before=finished_by + 1, in_use={2})) == [1, 3]
    assert not book.is_known(1) and not book.is_finished(3)
    assert book.is_finished(2) and book.is_finished(4)
    assert book.may_read(2, 7, "wrong") is False  # its secret is still checked
    assert sorted(book.forget_finished(before=finished_by + 1, in_use=set())) == [2]
