"""Retention in the dispatcher core (iteration_retention_ms) on a fake clock: finished iterations
without clients are dropped on time with their tasks and, with their job's last iteration, the
job; the drop is journaled, so a restart replays the same state; what asks for a dropped object
afterwards gets NOT_FOUND naming the retention. No sockets: requests straight into the core."""

import pytest
import tensorflow as tf
from dispatcher_helpers import (
    FakeClock,
    RecordingNotifier,
    client_heartbeat,
    heartbeat,
    make_core,
    register,
    release,
    start_iteration,
)

from dataservice import status
from dataservice.config import DispatcherConfig
from dataservice.dispatcher import journal
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import common_pb2, dispatcher_pb2

RETENTION_MS = 10_000


def gc_after(core, clock, seconds: float, reading=()) -> None:
    """`seconds` later (in steps of a second while `reading` clients heartbeat, to stay
    alive), the worker heard from and the garbage collected at each step."""
    while seconds > 0:
        step = min(1.0, seconds) if reading else seconds
        seconds -= step
        clock.advance(step)
        heartbeat(core, "w1:1")
        for client in reading:
            client_heartbeat(core, client.iteration_client_id)
        core.collect_garbage()


def resume_request(notifier, dataset_id: str, task_id: int) -> dispatcher_pb2.ResumeIterationRequest:
    return dispatcher_pb2.ResumeIterationRequest(
        job=dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id,
            processing_mode=common_pb2.ProcessingModeDef(sharding_policy=common_pb2.SHARDING_POLICY_OFF),
        ),
        progress=[notifier.task_progress(task_id, 3)],
    )


def test_a_finished_iteration_is_dropped_after_the_retention_and_not_before():
    clock, notifier = FakeClock(), RecordingNotifier()
    core = make_core(clock, notifier, iteration_retention_ms=RETENTION_MS)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    iteration = start_iteration(core, dataset_id)
    (task_id,) = [t for _, t in notifier.tasks]
    # A checkpoint taken while reading resumes while the iteration is retained...
    resumed = core.resume_iteration(resume_request(notifier, dataset_id, task_id))
    release(core, resumed)
    release(core, iteration)  # an anonymous iteration ends with its last client
    assert core.summary()["unfinished_iterations"] == 0
    gc_after(core, clock, 1)  # retention counts from here
    gc_after(core, clock, RETENTION_MS / 1000 - 0.5)
    assert core.summary()["iterations"] == 2, "dropped before iteration_retention_ms"
    gc_after(core, clock, 1)
    summary = core.summary()
    assert (summary["jobs"], summary["iterations"], summary["tasks"]) == (0, 0, 0)
    core.validate()

    # ... and not after: NOT_FOUND, naming the retention.
    with pytest.raises(status.ServiceError, match="iteration_retention_ms \\(10000 ms\\)") as dropped:
        core.resume_iteration(resume_request(notifier, dataset_id, task_id))
    assert dropped.value.code == status.Code.NOT_FOUND
    with pytest.raises(status.ServiceError, match="iteration_retention_ms") as dropped:
        core.get_or_create_iteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=1))
    assert dropped.value.code == status.Code.NOT_FOUND
    # A worker reporting the dropped task finished is not an error; a made-up task still is.
    core.worker_update(dispatcher_pb2.WorkerUpdateRequest(worker_address="w1:1", finished_tasks=[task_id]))
    with pytest.raises(status.ServiceError, match="not known") as unknown:
        core.worker_update(dispatcher_pb2.WorkerUpdateRequest(worker_address="w1:1", finished_tasks=[999]))
    assert unknown.value.code == status.Code.NOT_FOUND


def test_a_named_jobs_name_is_free_once_its_last_iteration_is_dropped():
    clock, notifier = FakeClock(), RecordingNotifier()
    core = make_core(clock, notifier, iteration_retention_ms=RETENTION_MS)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    first = start_iteration(core, dataset_id, job_name="shared")
    release(core, first)
    gc_after(core, clock, 1)
    # A reader within job_gc_timeout_ms joins the job; retention starts again when it leaves.
    rejoined = start_iteration(core, dataset_id, job_name="shared")
    assert rejoined.iteration_id == first.iteration_id
    release(core, rejoined)
    gc_after(core, clock, 6)  # job_gc_timeout_ms (5 s) ends the named iteration without clients
    assert core.summary()["unfinished_iterations"] == 0
    # Ended for want of readers (its tasks gone), the job is collected as TensorFlow's service
    # collects it: its name makes a new job, and the old one stays, by id, for retention.
    renamed = start_iteration(core, dataset_id, job_name="shared")
    assert renamed.iteration_id != first.iteration_id
    assert core.summary()["jobs"] == 2
    release(core, renamed)
    gc_after(core, clock, 6)
    gc_after(core, clock, RETENTION_MS / 1000 + 1)
    assert core.summary()["jobs"] == 0
    again = start_iteration(core, dataset_id, job_name="shared")
    assert again.iteration_id not in (first.iteration_id, renamed.iteration_id)
    assert core.summary()["jobs"] == 1


def test_retention_minus_one_keeps_every_iteration():
    clock, notifier = FakeClock(), RecordingNotifier()
    core = make_core(clock, notifier, iteration_retention_ms=-1)
    heartbeat(core, "w1:1")
    release(core, start_iteration(core, register(core, tf.data.Dataset.range(10))))
    for _ in range(3):
        gc_after(core, clock, 10**7)
    assert core.summary()["iterations"] == 1


def test_the_drop_is_journaled_and_a_restart_replays_it(tmp_path):
    clock, notifier = FakeClock(), RecordingNotifier()
    config = DispatcherConfig(
        worker_timeout_ms=2000, client_timeout_ms=3000, job_gc_timeout_ms=5000, iteration_retention_ms=RETENTION_MS
    )
    writer = journal.JournalWriter(tmp_path, 0)
    core = DispatcherCore(config, "test:0", journal=writer, clock=clock, notifier=notifier, compact_every=5)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    old = [start_iteration(core, dataset_id, job_name=f"old-{i}") for i in range(3)]
    kept = start_iteration(core, dataset_id, job_name="kept")
    for iteration in old:
        release(core, iteration)
    gc_after(core, clock, 6)
    gc_after(core, clock, RETENTION_MS / 1000 + 1)
    assert core.summary()["jobs"] == 1
    assert core.wait_for_journal_compaction(30)
    writer.close()
    restored = DispatcherState.replay(journal.read(tmp_path).updates)
    restored.validate()
    assert restored.summary() == core.summary()
    assert restored.iteration(kept.iteration_id) is not None
    assert all(restored.was_dropped("iteration", i.iteration_id) for i in old)


def test_iteration_retention_is_checked_like_the_other_times():
    assert DispatcherConfig().iteration_retention_ms == 24 * 3600 * 1000
    assert DispatcherConfig(iteration_retention_ms=0).iteration_retention_ms == 1
    with pytest.raises(ValueError, match="iteration_retention_ms"):
        DispatcherConfig(iteration_retention_ms=-2)
