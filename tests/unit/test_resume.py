"""Resuming a saved iterator in the dispatcher core: which tasks the new iteration gets, what they
replay and skip, and the errors for a checkpoint that cannot be resumed. No sockets: requests
straight into DispatcherCore on a fake clock."""

import pytest
import tensorflow as tf
from dispatcher_helpers import (
    DYNAMIC,
    OFF,
    FakeClock,
    RecordingNotifier,
    heartbeat,
    make_core,
    register,
    splits,
    start_iteration,
    tasks_by_worker,
)

from dataservice import status
from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import common_pb2, dispatcher_pb2


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def notifier():
    return RecordingNotifier()


def job_request(dataset_id: str, policy: int) -> dispatcher_pb2.GetOrCreateJobRequest:
    return dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset_id, processing_mode=common_pb2.ProcessingModeDef(sharding_policy=policy)
    )


def resume(core, notifier, dataset_id, policy, progress):
    """Resumes from a checkpoint at `progress` (task -> elements taken), with the receipts the
    tasks' workers sent."""
    return core.resume_iteration(
        dispatcher_pb2.ResumeIterationRequest(
            job=job_request(dataset_id, policy),
            progress=[notifier.task_progress(t, n) for t, n in progress.items()],
        )
    )


def drain(core, iteration_id, task_id, start=0):
    """Every range the task is handed, asking in order from range `start`."""
    out, index = [], start
    while True:
        begin, end, done = splits(core, iteration_id, task_id, index)
        if done:
            return out
        out.append((begin, end))
        index += 1


def test_distributed_epoch_resume_replays_each_task_then_hands_out_the_rest(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(1000))
    iteration = start_iteration(core, dataset_id, policy=DYNAMIC)
    tasks = tasks_by_worker(core, iteration.iteration_client_id)
    t1, t2 = tasks["w1:1"], tasks["w2:1"]
    received = {t1: [], t2: []}
    for index in range(3):
        for task in (t1, t2):
            begin, end, _ = splits(core, iteration.iteration_id, task, index)
            received[task].append((begin, end))

    resumed = resume(core, notifier, dataset_id, DYNAMIC, {t1: 40, t2: 7})
    assert resumed.repetition == 0 and resumed.iteration_id != iteration.iteration_id
    state = core.state  # the test reads the state the core keeps
    new_tasks = [state.task(t) for t in resumed.task_ids]
    assert sorted(t.skip_elements for t in new_tasks) == [7, 40]
    assert sorted(t.worker_address for t in new_tasks) == ["w1:1", "w2:1"]
    by_skip = {t.skip_elements: t.task_id for t in new_tasks}
    # Each new task gets its saved task's ranges again, in order, then new ones; together with the
    # saved ranges, every split of the epoch exactly once.
    replayed_1 = drain(core, resumed.iteration_id, by_skip[40])
    replayed_2 = drain(core, resumed.iteration_id, by_skip[7])
    assert replayed_1[:3] == received[t1] and replayed_2[:3] == received[t2]
    handed = [r for ranges in (replayed_1, replayed_2) for r in ranges]
    assert sorted(i for begin, end in handed for i in range(begin, end)) == list(range(1000))
    state.validate()


def test_a_resumed_iteration_resumes_again_and_survives_a_snapshot(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(500))
    iteration = start_iteration(core, dataset_id, policy=DYNAMIC)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    first = [splits(core, iteration.iteration_id, task, i)[:2] for i in range(2)]
    once = resume(core, notifier, dataset_id, DYNAMIC, {task: 10})
    (replaying,) = once.task_ids
    # The resumed task takes one of its two replayed ranges and one is still to come, when the
    # trainer is killed again: the next resume replays both, and skips what both saves had taken.
    assert splits(core, once.iteration_id, replaying, 0)[:2] == first[0]
    rebuilt = DispatcherState.replay(core.state.to_updates())
    rebuilt.validate()
    assert rebuilt.task(replaying).replay == core.state.task(replaying).replay
    twice = resume(core, notifier, dataset_id, DYNAMIC, {replaying: 5})
    (again,) = twice.task_ids
    assert core.state.task(again).skip_elements == 15
    assert drain(core, twice.iteration_id, again)[:2] == first


def test_parallel_epochs_resume_continues_each_stream_on_its_worker(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    iteration = start_iteration(core, dataset_id)
    tasks = tasks_by_worker(core, iteration.iteration_client_id)
    resumed = resume(core, notifier, dataset_id, OFF, {tasks["w1:1"]: 30, tasks["w2:1"]: 12})
    placed = {core.state.task(t).worker_address: core.state.task(t).skip_elements for t in resumed.task_ids}
    assert placed == {"w1:1": 30, "w2:1": 12}
    # The workers are told, with the elements to skip.
    assert {w for w, t in notifier.tasks if t in resumed.task_ids} == {"w1:1", "w2:1"}


def test_resume_prefers_workers_heard_from_lately(clock, notifier):
    core = make_core(clock, notifier, worker_timeout_ms=60_000)
    heartbeat(core, "old:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    iteration = start_iteration(core, dataset_id)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    clock.advance(10)  # the old worker was killed with the trainer; a new one came up
    heartbeat(core, "new:1")
    resumed = resume(core, notifier, dataset_id, OFF, {task: 3})
    assert [core.state.task(t).worker_address for t in resumed.task_ids] == ["new:1"]


def test_a_lost_replaying_task_keeps_its_input_for_the_next_resume(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(300))
    iteration = start_iteration(core, dataset_id, policy=DYNAMIC)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    saved = [splits(core, iteration.iteration_id, task, i)[:2] for i in range(2)]
    once = resume(core, notifier, dataset_id, DYNAMIC, {task: 20})
    (replaying,) = once.task_ids
    splits(core, once.iteration_id, replaying, 0)
    heartbeat(core, "w2:1")
    for _ in range(2):  # w2 heartbeats, w1 stays silent
        clock.advance(1.5)
        heartbeat(core, "w2:1")
    core.collect_garbage()  # w1 is lost: its replay task with it
    assert core.state.task(replaying).lost
    # Nothing of its input went to another task (its consumer had taken some of it) ...
    assert not core.state.iteration(once.iteration_id).returned_splits
    # ... a later resume replays all of it.
    twice = resume(core, notifier, dataset_id, DYNAMIC, {replaying: 0})
    replays = [t for t in twice.task_ids if core.state.task(t).skip_elements == 20]
    assert len(replays) == 1 and drain(core, twice.iteration_id, replays[0])[:2] == saved


def test_resume_errors_name_the_mismatch(clock, notifier, tmp_path):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    other_id = register(core, tf.data.Dataset.range(7))
    iteration = start_iteration(core, dataset_id)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    with pytest.raises(status.ServiceError, match=f"dataset {dataset_id!r}, this one reads dataset {other_id!r}") as e:
        resume(core, notifier, other_id, OFF, {task: 1})
    assert e.value.code == status.Code.FAILED_PRECONDITION
    with pytest.raises(status.ServiceError, match="processing mode SHARDING_POLICY_OFF, this one in") as e:
        resume(core, notifier, dataset_id, DYNAMIC, {task: 1})
    with pytest.raises(status.ServiceError, match="does not know: the dispatcher restarted without") as e:
        resume(core, notifier, dataset_id, OFF, {task + 100: 1})
    assert e.value.code == status.Code.NOT_FOUND
    with pytest.raises(status.ServiceError, match="elements must be >= 0") as e:
        resume(core, notifier, dataset_id, OFF, {task: -1})
    assert e.value.code == status.Code.INVALID_ARGUMENT


def test_positions_past_the_datasets_end_are_refused(clock, notifier):
    """A checkpoint that would have a worker skip more elements than the dataset has (2**62, say)."""
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    parallel = tasks_by_worker(core, start_iteration(core, dataset_id).iteration_client_id)
    for position in (101, 2**62):
        with pytest.raises(status.ServiceError, match="the dataset has 100") as e:
            resume(core, notifier, dataset_id, OFF, {parallel["w1:1"]: position, parallel["w2:1"]: 0})
        assert e.value.code == status.Code.INVALID_ARGUMENT
    # Each parallel_epochs stream is a whole pass: 100 each is possible.
    resume(core, notifier, dataset_id, OFF, {parallel["w1:1"]: 100, parallel["w2:1"]: 100})
    # distributed_epoch: the tasks share one pass.
    distributed = tasks_by_worker(core, start_iteration(core, dataset_id, policy=DYNAMIC).iteration_client_id)
    with pytest.raises(status.ServiceError, match="taken 120 elements of an epoch of 100") as e:
        resume(core, notifier, dataset_id, DYNAMIC, {distributed["w1:1"]: 60, distributed["w2:1"]: 60})
    assert e.value.code == status.Code.INVALID_ARGUMENT
    resume(core, notifier, dataset_id, DYNAMIC, {distributed["w1:1"]: 60, distributed["w2:1"]: 40})
    # An infinite dataset has no such bound (its tasks' receipts bound it: the next test).
    infinite_id = register(core, tf.data.Dataset.range(3).repeat())
    infinite = tasks_by_worker(core, start_iteration(core, infinite_id).iteration_client_id)
    resume(core, notifier, infinite_id, OFF, {task: 10**6 for task in infinite.values()})


def test_positions_no_receipt_of_the_task_covers_are_refused(clock, notifier):
    """The attack: a client that edits its checkpoint to have a worker skip 2**62 elements of an
    infinite pipeline (busy for ever). A position needs the receipt its task's worker signed
    for at least that many elements; receipts are HMACs under the iteration's secret, which
    clients never see."""
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(3).repeat())
    iteration = start_iteration(core, dataset_id)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    other_iteration = start_iteration(core, dataset_id)
    (other_task,) = tasks_by_worker(core, other_iteration.iteration_client_id).values()
    honest = notifier.task_progress(task, 40, covered=64)  # the consumer took 40 of 64 received
    forged = {
        "past its receipt": notifier.task_progress(task, 2**62, covered=64),
        "with no receipt": dispatcher_pb2.TaskProgress(task_id=task, elements=2**62),
        "with the count changed": dispatcher_pb2.TaskProgress(
            task_id=task, elements=2**62, receipt_elements=2**62, receipt=honest.receipt
        ),
        "with another task's receipt": dispatcher_pb2.TaskProgress(
            task_id=task,
            elements=2**62,
            receipt_elements=2**62,
            receipt=notifier.task_progress(other_task, 2**62).receipt,
        ),
    }
    for name, progress in forged.items():
        with pytest.raises(status.ServiceError, match=f"task {task}") as e:
            core.resume_iteration(
                dispatcher_pb2.ResumeIterationRequest(job=job_request(dataset_id, OFF), progress=[progress])
            )
        assert e.value.code == status.Code.INVALID_ARGUMENT, name
    resumed = core.resume_iteration(
        dispatcher_pb2.ResumeIterationRequest(job=job_request(dataset_id, OFF), progress=[honest])
    )
    # Nothing taken needs no receipt (a checkpoint saved before the first element of a task).
    assert [core.state.task(t).skip_elements for t in resumed.task_ids] == [40]
    resume(core, notifier, dataset_id, OFF, {task: 0})


def test_resume_is_journaled_and_snapshots_keep_what_it_needs(clock, notifier, tmp_path):
    from dataservice.config import DispatcherConfig
    from dataservice.dispatcher.core import DispatcherCore

    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=1024)
    config = DispatcherConfig(worker_timeout_ms=2000, client_timeout_ms=3000, job_gc_timeout_ms=5000)
    core = DispatcherCore(config, "test:0", journal=writer, clock=clock, notifier=notifier, compact_every=5)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    iteration = start_iteration(core, dataset_id, policy=DYNAMIC)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    saved = [splits(core, iteration.iteration_id, task, i)[:2] for i in range(3)]
    resumed = resume(core, notifier, dataset_id, DYNAMIC, {task: 4})
    assert core.wait_for_journal_compaction(30)
    writer.close()
    rebuilt = DispatcherState.replay(journal.read(tmp_path).updates)
    rebuilt.validate()
    (new_task,) = resumed.task_ids
    assert rebuilt.task(new_task).skip_elements == 4
    assert rebuilt.task(new_task).replay == {(0, 0): saved}
    assert rebuilt.task(task).received == core.state.task(task).received
    assert rebuilt.iteration(resumed.iteration_id).resumes_iteration_id == iteration.iteration_id


def test_status_shows_which_iteration_a_resumed_one_continues(clock, notifier):
    from dataservice.monitoring import status_tables

    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(100))
    iteration = start_iteration(core, dataset_id)
    (task,) = tasks_by_worker(core, iteration.iteration_client_id).values()
    resumed = resume(core, notifier, dataset_id, OFF, {task: 3})
    iterations = {it["iteration_id"]: it for job in core.status()["jobs"] for it in job["iterations"]}
    assert iterations[resumed.iteration_id]["resumes_iteration_id"] == iteration.iteration_id
    assert iterations[iteration.iteration_id]["resumes_iteration_id"] is None
    assert f"running (resumes {iteration.iteration_id})" in status_tables.render(core.status())
