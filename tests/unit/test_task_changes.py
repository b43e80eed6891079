"""Client heartbeats answer with the tasks that changed since the client's last answer
(dispatcher/task_changes.py): everything the first time, then only tasks made, finished or lost;
everything again for a version from another dispatcher process or one never given. No sockets:
requests straight into DispatcherCore on a fake clock."""

import tensorflow as tf
from dispatcher_helpers import (
    FakeClock,
    RecordingNotifier,
    client_heartbeat,
    heartbeat,
    make_core,
    register,
    start_iteration,
)

from dataservice.dispatcher.task_changes import SEQUENCE_BITS, TaskChanges
from dataservice.v1 import dispatcher_pb2, journal_pb2


def _heartbeat(core, client_id: int, version: int, consumed=()) -> dispatcher_pb2.ClientHeartbeatResponse:
    return client_heartbeat(core, client_id, tasks_version=version, consumed=consumed)


def _summary(response) -> dict:
    return {t.worker_address: (t.finished, t.lost) for t in response.tasks}


def test_heartbeats_carry_only_what_changed_since_the_last_answer():
    clock = FakeClock()
    core = make_core(clock, RecordingNotifier())
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    client = start_iteration(core, dataset_id).iteration_client_id
    other = start_iteration(core, dataset_id).iteration_client_id  # another job: its changes are its own

    first = _heartbeat(core, client, 0)
    assert _summary(first) == {"w1:1": (False, False), "w2:1": (False, False)}
    quiet = _heartbeat(core, client, first.tasks_version)
    assert not quiet.tasks and quiet.tasks_version == first.tasks_version

    heartbeat(core, "w3:1")  # a new worker gets a task of each iteration
    joined = _heartbeat(core, client, quiet.tasks_version)
    assert _summary(joined) == {"w3:1": (False, False)}

    (w1_task,) = [t.task_id for t in first.tasks if t.worker_address == "w1:1"]
    # (parallel_epochs: a task finishes when its client has consumed its end)
    finished = _heartbeat(core, client, joined.tasks_version, consumed=[w1_task])
    assert _summary(finished) == {"w1:1": (True, False)}

    # w2 falls silent: its task is lost.
    for _ in range(3):
        clock.advance(1.0)
        heartbeat(core, "w1:1")
        heartbeat(core, "w3:1")
    core.collect_garbage()
    lost = _heartbeat(core, client, finished.tasks_version)
    assert _summary(lost) == {"w2:1": (True, True)}

    # An answer skipped (a lost response) is caught up from the older version.
    assert _summary(_heartbeat(core, client, joined.tasks_version)) == {"w1:1": (True, False), "w2:1": (True, True)}
    # The other iteration's client hears of its own tasks only.
    assert len(_heartbeat(core, other, 0).tasks) == 3


def test_a_version_this_dispatcher_did_not_give_gets_every_task():
    core = make_core(FakeClock(), RecordingNotifier())
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    client = start_iteration(core, register(core, tf.data.Dataset.range(10))).iteration_client_id
    version = _heartbeat(core, client, 0).tasks_version
    incarnation, sequence = version >> SEQUENCE_BITS, version & ((1 << SEQUENCE_BITS) - 1)
    before_a_restart = ((incarnation % 1000 + 1) << SEQUENCE_BITS) | sequence
    ahead_of_it = (incarnation << SEQUENCE_BITS) | (sequence + 1)
    for version in (before_a_restart, ahead_of_it, -5):
        assert len(_heartbeat(core, client, version).tasks) == 2, version


def test_versions_of_separate_processes_differ_and_dropped_iterations_are_forgotten():
    assert len({TaskChanges().version for _ in range(5)}) > 1  # a random incarnation each
    changes = TaskChanges(incarnation=7)
    assert changes.version == 7 << SEQUENCE_BITS
    assert changes.changed_since(1, changes.version) == set()
    create = journal_pb2.CreateTaskUpdate(task_id=5, iteration_id=1)
    changes.record(journal_pb2.Update(create_task=create), state=None)
    assert changes.changed_since(1, 7 << SEQUENCE_BITS) == {5}
    assert changes.changed_since(2, 7 << SEQUENCE_BITS) == set()
    changes.record(journal_pb2.Update(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=1)), state=None)
    assert changes.changed_since(1, 7 << SEQUENCE_BITS) == set()
