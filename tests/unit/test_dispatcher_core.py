"""The dispatcher core without a server: split allocation, round extension and garbage
collection, driven request by request on a fake clock."""

import json

import pytest
import tensorflow as tf
from dispatcher_helpers import (
    DYNAMIC,
    FakeClock,
    RecordingNotifier,
    client_heartbeat,
    heartbeat,
    make_core,
    read_key,
    register,
    release,
    splits,
    start_iteration,
    tasks_by_worker,
)

from dataservice import read_keys, status
from dataservice.config import DispatcherConfig
from dataservice.dispatcher import journal
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.rounds import MIN_ROUND_WINDOW
from dataservice.dispatcher.split_handout import split_range_size
from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import dispatcher_pb2


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def notifier():
    return RecordingNotifier()


def test_split_range_size_is_a_fair_share_of_what_is_left():
    assert split_range_size(remaining=1000, unfinished_tasks=2, max_splits=1024) == 62
    assert split_range_size(remaining=1000, unfinished_tasks=2, max_splits=10) == 10
    assert split_range_size(remaining=5, unfinished_tasks=4, max_splits=1024) == 1
    assert split_range_size(remaining=10**6, unfinished_tasks=0, max_splits=1024) == 1024


def test_new_iteration_pushes_tasks_to_the_alive_workers(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(10), prepare_workers=True)
    assert sorted(notifier.datasets) == [("w1:1", dataset_id), ("w2:1", dataset_id)]
    iteration = start_iteration(core, dataset_id)
    assert sorted(w for w, _ in notifier.tasks) == ["w1:1", "w2:1"]
    assert core.summary()["active_tasks"] == 2
    # A heartbeat that already runs its task gets nothing new; one that does not gets it.
    running = dict(notifier.tasks)
    assert not heartbeat(core, "w1:1", current=(running["w1:1"],)).new_tasks
    assert [t.iteration_id for t in heartbeat(core, "w2:1").new_tasks] == [iteration.iteration_id]
    core.validate()


def test_splits_are_fair_shares_and_retries_get_the_same_range(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(1000)), DYNAMIC)
    tasks = tasks_by_worker(core, iteration.iteration_client_id)
    first = splits(core, iteration.iteration_id, tasks["w1:1"], index=0)
    assert first == (0, 62, False)
    assert splits(core, iteration.iteration_id, tasks["w1:1"], index=0) == first, "a retry gets the same range"
    second = splits(core, iteration.iteration_id, tasks["w2:1"], index=0)
    assert second == (62, 62 + 58, False), "the next share of the 938 left"
    assert splits(core, iteration.iteration_id, tasks["w2:1"], index=1, max_splits=5)[:2] == (120, 125)
    core.validate()


def _two_workers_in_a_distributed_epoch(clock, notifier):
    """A core with workers w1 and w2 and a distributed_epoch iteration of range(1000): (core,
    the iteration's client, its tasks by worker)."""
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(1000)), DYNAMIC)
    return core, iteration, tasks_by_worker(core, iteration.iteration_client_id)


def test_a_lost_workers_unstarted_range_goes_to_the_next_worker(clock, notifier):
    core, iteration, tasks = _two_workers_in_a_distributed_epoch(clock, notifier)
    it = iteration.iteration_id
    splits(core, it, tasks["w2:1"], index=0)  # (0, 62) handed to w2
    splits(core, it, tasks["w2:1"], index=1)  # so (0, 62) started; (62, 120) handed, not started
    clock.advance(1.5)
    heartbeat(core, "w1:1")  # w1 stays alive, w2 goes silent
    clock.advance(1.0)
    core.collect_garbage()
    assert core.summary()["alive_workers"] == 1
    lost = [t for t in client_heartbeat(core, iteration.iteration_client_id).tasks if t.task_id == tasks["w2:1"]]
    assert lost[0].finished
    assert splits(core, it, tasks["w1:1"], index=0) == (62, 120, False), "the returned range first"
    assert splits(core, it, tasks["w1:1"], index=1)[:2] == (120, 120 + 880 // 8)
    core.validate()


def test_a_worker_restarted_at_its_address_loses_its_old_tasks_and_gets_new_ones(clock, notifier):
    core = make_core(clock, notifier, worker_timeout_ms=60_000)
    heartbeat(core, "w1:1", uid=11)
    heartbeat(core, "w2:1", uid=21)
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(1000)), DYNAMIC)
    it, client = iteration.iteration_id, iteration.iteration_client_id
    old = tasks_by_worker(core, client)["w2:1"]
    splits(core, it, old, index=0)
    splits(core, it, old, index=1)  # (0, 62) started; (62, 120) handed out, not started
    assert not heartbeat(core, "w2:1", current=(old,), uid=21).new_tasks, "the same process: nothing changes"
    (new_task,) = heartbeat(core, "w2:1", uid=22).new_tasks  # a new process at the address
    assert new_task.task_id != old
    infos = {t.task_id: t for t in client_heartbeat(core, client).tasks}
    assert infos[old].finished and infos[old].lost, "clients stop reading the old stream"
    assert not infos[new_task.task_id].finished
    assert splits(core, it, new_task.task_id, index=0) == (62, 120, False), "the unstarted range is handed out again"
    assert core.summary()["alive_workers"] == 2
    core.validate()


def test_splits_end_after_the_last_one(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(3)), DYNAMIC)
    task = tasks_by_worker(core, iteration.iteration_client_id)["w1:1"]
    handed = [splits(core, iteration.iteration_id, task, index=i) for i in range(4)]
    assert handed == [(0, 1, False), (1, 2, False), (2, 3, False), (0, 0, True)]
    with pytest.raises(status.ServiceError) as info:
        splits(core, iteration.iteration_id, task + 100, index=0)
    assert info.value.code == status.Code.INVALID_ARGUMENT


def test_rounds_are_granted_ahead_at_the_rate_clients_read(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10).repeat())
    iteration = start_iteration(core, dataset_id, job_name="coordinated", num_consumers=2)
    client = iteration.iteration_client_id
    assert client_heartbeat(core, client, current_round=0).round_limit == MIN_ROUND_WINDOW
    # Half the window used: a new grant, still the minimum (no rate measured yet).
    assert client_heartbeat(core, client, current_round=8).round_limit == 8 + MIN_ROUND_WINDOW
    clock.advance(1.0)  # 108 rounds in the second since the first report: a 4 s window is 432 rounds
    assert client_heartbeat(core, client, current_round=108).round_limit == 108 + 432
    clock.advance(1.0)
    assert client_heartbeat(core, client, current_round=150).round_limit == 540, "not half used: no new grant"
    with pytest.raises(status.ServiceError, match="current_round"):
        client_heartbeat(core, client, current_round=-1)


def test_a_worker_joining_coordinated_reads_starts_after_the_grant(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(10).repeat()), job_name="c", num_consumers=1)
    limit = client_heartbeat(core, iteration.iteration_client_id, current_round=3).round_limit
    (task,) = heartbeat(core, "w2:1").new_tasks
    assert task.starting_round == limit


def test_an_anonymous_iteration_ends_when_its_client_releases_it(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(10)))
    core.release_iteration_client(
        dispatcher_pb2.ReleaseIterationClientRequest(
            iteration_client_id=iteration.iteration_client_id, read_key=iteration.read_key
        )
    )
    assert core.summary()["unfinished_iterations"] == 0
    assert heartbeat(core, "w1:1", current=(1,)).tasks_to_delete == [1]


def test_named_iterations_wait_job_gc_timeout_for_another_client(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(10)), job_name="shared")
    core.release_iteration_client(
        dispatcher_pb2.ReleaseIterationClientRequest(
            iteration_client_id=iteration.iteration_client_id, read_key=iteration.read_key
        )
    )
    clock.advance(4.0)
    heartbeat(core, "w1:1", current=(1,))
    core.collect_garbage()
    assert core.summary()["unfinished_iterations"] == 1, "kept for job_gc_timeout_ms"
    clock.advance(1.5)
    heartbeat(core, "w1:1", current=(1,))
    core.collect_garbage()
    assert core.summary()["unfinished_iterations"] == 0


def test_the_name_of_a_collected_job_makes_a_new_job(clock, notifier):
    # TensorFlow's testGcAndRecreate: once a named job's idle iteration is ended (its tasks
    # deleted), the next reader of the name gets a new job rather than the ended iteration.
    core = make_core(clock, notifier)  # job_gc_timeout_ms: 5 s
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    first = start_iteration(core, dataset_id, job_name="again")
    release(core, first)
    clock.advance(1.0)
    joined = start_iteration(core, dataset_id, job_name="again")
    assert joined.iteration_id == first.iteration_id, "a reader within job_gc_timeout_ms joins the job"
    release(core, joined)
    clock.advance(5.5)
    heartbeat(core, "w1:1", current=(1,))
    core.collect_garbage()
    assert core.summary()["unfinished_iterations"] == 0
    second = start_iteration(core, dataset_id, job_name="again")
    assert second.iteration_id != first.iteration_id
    assert core.state.iteration(second.iteration_id).job_id != core.state.iteration(first.iteration_id).job_id
    core.state.validate()
    # A replay of the journal's updates names the newer job.
    replayed = type(core.state).replay(core.state.to_updates())
    assert replayed.job_named(dataset_id, "again").job_id == core.state.iteration(second.iteration_id).job_id
    replayed.validate()


def test_the_name_of_a_read_out_job_makes_a_new_job_after_job_gc_timeout(clock, notifier):
    core = make_core(clock, notifier)  # job_gc_timeout_ms: 5 s
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    first = start_iteration(core, dataset_id, job_name="done")
    client_heartbeat(core, first.iteration_client_id, consumed=(1,))  # read to its end
    release(core, first)
    assert core.summary()["unfinished_iterations"] == 0
    core.collect_garbage()
    clock.advance(1.0)
    joined = start_iteration(core, dataset_id, job_name="done")
    assert joined.iteration_id == first.iteration_id, "read out, and within job_gc_timeout_ms: the same job"
    release(core, joined)
    core.collect_garbage()
    clock.advance(5.5)
    heartbeat(core, "w1:1")
    core.collect_garbage()
    assert start_iteration(core, dataset_id, job_name="done").iteration_id != first.iteration_id


def test_job_gc_timeout_minus_one_keeps_named_iterations_for_good(clock, notifier):
    core = make_core(clock, notifier, job_gc_timeout_ms=-1)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    named = start_iteration(core, dataset_id, job_name="kept")
    anonymous = start_iteration(core, dataset_id)
    for iteration in (named, anonymous):
        core.release_iteration_client(
            dispatcher_pb2.ReleaseIterationClientRequest(
                iteration_client_id=iteration.iteration_client_id, read_key=iteration.read_key
            )
        )
    for _ in range(3):
        clock.advance(10**6)
        heartbeat(core, "w1:1", current=(1, 2))
        core.collect_garbage()
    # The anonymous iteration ended with its client; the named one waits for another.
    assert core.summary()["unfinished_iterations"] == 1
    assert [t.task_id for t in core.state.active_tasks_of_worker("w1:1")] == [1]


def test_a_lost_task_asking_for_splits_is_told_it_was_lost(clock, notifier):
    """A worker taken for lost that was alive after all (a partition healed) asks for its next
    range, which would say its current one starts: that range went back to the pool, so the
    answer is OUT_OF_RANGE (produce nothing more), not end_of_splits (produce what you hold)."""
    core, iteration, tasks = _two_workers_in_a_distributed_epoch(clock, notifier)
    it = iteration.iteration_id
    held = splits(core, it, tasks["w2:1"], index=0)[:2]  # handed to w2, not started
    for _ in range(2):  # w1 heartbeats, w2 falls silent and is removed
        clock.advance(1.5)
        heartbeat(core, "w1:1")
    core.collect_garbage()
    with pytest.raises(status.ServiceError) as info:
        splits(core, it, tasks["w2:1"], index=1)
    assert info.value.code == status.Code.OUT_OF_RANGE and "was lost" in info.value.message
    assert splits(core, it, tasks["w1:1"], index=0)[:2] == held, "the unstarted range went to w1"
    core.validate()


def test_a_dispatcher_that_hears_from_no_one_takes_itself_for_cut_off(clock, notifier):
    """Silence from every peer (the dispatcher's host partitioned, or the process paused) removes
    no one; the first peer heard again gives every peer a fresh timeout; after it, a peer that
    stays silent is removed as usual."""
    core = make_core(clock, notifier)  # worker_timeout_ms 2 s, client_timeout_ms 3 s
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    client = start_iteration(core, register(core, tf.data.Dataset.range(10))).iteration_client_id
    clock.advance(30.0)
    core.collect_garbage()
    assert core.summary()["alive_workers"] == 2 and core.summary()["iteration_clients"] == 1
    heartbeat(core, "w1:1", current=(1,))  # the partition healed: w1 is heard first
    core.collect_garbage()
    assert core.summary()["alive_workers"] == 2, "w2 has a fresh timeout"
    for _ in range(3):  # w1 and the client go on; w2 stays silent past its timeout
        clock.advance(1.0)
        heartbeat(core, "w1:1", current=(1,))
        client_heartbeat(core, client)
        core.collect_garbage()
    assert core.summary()["alive_workers"] == 1
    assert core.summary()["iteration_clients"] == 1
    core.validate()


def test_a_lone_silent_worker_is_removed(clock, notifier):
    """With one peer, its silence and the dispatcher's isolation look alike: it times out."""
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    clock.advance(3.0)
    core.collect_garbage()
    assert core.summary()["alive_workers"] == 0


def test_a_silent_client_is_released_and_a_live_one_kept(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    silent = start_iteration(core, dataset_id, job_name="job").iteration_client_id
    live = start_iteration(core, dataset_id, job_name="job").iteration_client_id
    for _ in range(4):
        clock.advance(1.0)
        client_heartbeat(core, live)
        heartbeat(core, "w1:1", current=(1,))
        core.collect_garbage()
    assert core.summary()["iteration_clients"] == 1
    with pytest.raises(status.ServiceError) as info:
        client_heartbeat(core, silent)
    assert info.value.code == status.Code.NOT_FOUND
    client_heartbeat(core, live)
    core.validate()


def test_unknown_objects_are_not_found_with_the_dispatchers_address(clock, notifier):
    core = make_core(clock, notifier)
    with pytest.raises(status.ServiceError, match="the dispatcher at test:0") as info:
        core.get_or_create_iteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=5))
    assert info.value.code == status.Code.NOT_FOUND
    with pytest.raises(status.ServiceError) as info:
        core.get_data_service_metadata(dispatcher_pb2.GetDataServiceMetadataRequest(dataset_id=""))
    assert info.value.code == status.Code.INVALID_ARGUMENT


def test_snapshots_are_written_in_the_background_and_a_restart_recovers_the_state(tmp_path, clock, notifier):
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=1024)
    config = DispatcherConfig(worker_timeout_ms=2000, client_timeout_ms=3000, job_gc_timeout_ms=5000)
    core = DispatcherCore(config, "test:0", journal=writer, clock=clock, notifier=notifier, compact_every=7)
    heartbeat(core, "w1:1", uid=1)
    heartbeat(core, "w2:1", uid=2)
    dataset_id = register(core, tf.data.Dataset.range(100))
    for name in ("a", "b", "c", "d"):
        start_iteration(core, dataset_id, DYNAMIC, job_name=name)
    assert core.wait_for_journal_compaction(30)
    writer.close()
    assert any(p.name.startswith("snapshot-") for p in tmp_path.iterdir())
    state = DispatcherState.replay(journal.read(tmp_path).updates)
    state.validate()
    assert state.summary() == core.summary()


def reading_heartbeat(core, client_id, elements, wait_s, consume_s, nbytes=0):
    return core.client_heartbeat(
        dispatcher_pb2.ClientHeartbeatRequest(
            iteration_client_id=client_id,
            read_key=read_key(core, client_id),
            elements_received=elements,
            bytes_received=nbytes,
            wait_seconds=wait_s,
            consume_seconds=consume_s,
        )
    )


def loaded_heartbeat(core, worker, task_id, elements, processing_s):
    return core.worker_heartbeat(
        dispatcher_pb2.WorkerHeartbeatRequest(
            worker_address=worker,
            current_tasks=[task_id],
            task_loads=[
                dispatcher_pb2.TaskLoad(task_id=task_id, elements_produced=elements, processing_seconds=processing_s)
            ],
        )
    )


def test_status_reports_the_load_and_the_recommended_workers(clock, notifier):
    core = make_core(clock, notifier, worker_timeout_ms=60_000, client_timeout_ms=60_000)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    dataset_id = register(core, tf.data.Dataset.range(10**6))
    client = start_iteration(core, dataset_id, policy=DYNAMIC, job_name="train").iteration_client_id
    tasks = tasks_by_worker(core, client)
    # 6 s: each worker makes 25 elements/s; the client gets their 50/s and waits 75% of the time.
    for t in range(7):
        for worker, task_id in tasks.items():
            loaded_heartbeat(core, worker, task_id, elements=25 * t, processing_s=1.0 * t)
        reading_heartbeat(core, client, elements=50 * t, wait_s=0.75 * t, consume_s=0.25 * t, nbytes=400 * t)
        clock.advance(1.0)
    doc = core.status()
    (job,) = doc["jobs"]
    assert (job["job_name"], job["processing_mode"], job["workers"]) == ("train", "distributed_epoch", 2)
    assert job["recommended_workers"] == 8 and job["missing_workers"] == 6
    assert job["wait_fraction"] == pytest.approx(0.75)
    assert job["consumption_rate"] == pytest.approx(200) and job["worker_throughput"] == pytest.approx(25)
    assert job["elements_received"] == 300 and job["bytes_received"] == 2400
    (iteration,) = job["iterations"]
    assert iteration["splits"]["total"] == 10**6 and iteration["active_tasks"] == 2
    (client_row,) = doc["clients"]
    assert client_row["client_id"] == client and client_row["wait_fraction"] == pytest.approx(0.75)
    assert {w["address"]: w["state"] for w in doc["workers"]} == {"w1:1": "alive", "w2:1": "alive"}
    assert sum(rate for _, rate in doc["throughput"]["points"]) > 0
    # The same document over the RPC, as JSON.
    assert json.loads(core.get_status(dispatcher_pb2.GetStatusRequest()).status_json)["jobs"][0]["job_id"] == 1


def test_status_shows_no_split_progress_for_a_source_repeated_for_ever(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    start_iteration(core, register(core, tf.data.Dataset.range(10).repeat()), policy=DYNAMIC)
    (job,) = core.status()["jobs"]
    (iteration,) = job["iterations"]
    assert iteration["splits"] is None


@pytest.mark.parametrize(
    "field, value",
    [("elements_received", -1), ("bytes_received", -5), ("wait_seconds", -0.5), ("consume_seconds", float("nan"))],
)
def test_hostile_client_totals_are_invalid_argument(clock, notifier, field, value):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    client = start_iteration(core, register(core, tf.data.Dataset.range(5))).iteration_client_id
    request = dispatcher_pb2.ClientHeartbeatRequest(iteration_client_id=client)
    setattr(request, field, value)
    with pytest.raises(status.ServiceError) as raised:
        core.client_heartbeat(request)
    assert raised.value.code == status.Code.INVALID_ARGUMENT and field in raised.value.message


def test_worker_loads_of_foreign_tasks_are_ignored_and_bad_values_refused(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    client = start_iteration(core, register(core, tf.data.Dataset.range(5))).iteration_client_id
    tasks = tasks_by_worker(core, client)
    # w1 reports w2's task and a task that does not exist: neither counts, the heartbeat succeeds.
    loaded_heartbeat(core, "w1:1", tasks["w2:1"], elements=10, processing_s=1.0)
    loaded_heartbeat(core, "w1:1", 999, elements=10, processing_s=1.0)
    assert core.status()["jobs"][0]["worker_throughput"] is None
    with pytest.raises(status.ServiceError) as raised:
        loaded_heartbeat(core, "w1:1", tasks["w1:1"], elements=10, processing_s=float("inf"))
    assert raised.value.code == status.Code.INVALID_ARGUMENT and "processing_seconds" in raised.value.message


def test_only_holders_of_an_iterations_read_key_act_for_its_clients(clock, notifier, tmp_path):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    iteration = start_iteration(core, register(core, tf.data.Dataset.range(10)))
    assert len(iteration.read_key) == 32
    other = start_iteration(core, register(core, tf.data.Dataset.range(5)))
    assert other.read_key != iteration.read_key
    client = iteration.iteration_client_id
    altered = iteration.read_key[:-1] + ("1" if iteration.read_key[-1] == "0" else "0")
    for wrong in ("", other.read_key, altered):
        with pytest.raises(status.ServiceError) as raised:
            core.client_heartbeat(dispatcher_pb2.ClientHeartbeatRequest(iteration_client_id=client, read_key=wrong))
        assert raised.value.code == status.Code.PERMISSION_DENIED and "read key" in raised.value.message
        with pytest.raises(status.ServiceError) as raised:
            core.release_iteration_client(
                dispatcher_pb2.ReleaseIterationClientRequest(iteration_client_id=client, read_key=wrong)
            )
        assert raised.value.code == status.Code.PERMISSION_DENIED
    assert core.summary()["unfinished_iterations"] == 2, "nothing was released"
    # The workers running its tasks get the iteration's secret with each task, which clients never
    # see, and check a client's key for the id it presents with it.
    task_of = {t.iteration_id: t for t in heartbeat(core, "w1:1").new_tasks}
    secret = task_of[iteration.iteration_id].read_key
    assert secret not in (iteration.read_key, other.read_key)
    assert read_keys.matches(iteration.read_key, secret, client)
    assert not read_keys.matches(iteration.read_key, secret, client + 1), "another client's id"
    assert not read_keys.matches(other.read_key, secret, other.iteration_client_id)
    assert client_heartbeat(core, client).tasks


def test_each_client_of_a_shared_job_has_a_key_of_its_own(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(10))
    first = start_iteration(core, dataset_id, job_name="shared")
    second = start_iteration(core, dataset_id, job_name="shared")
    assert first.iteration_id == second.iteration_id and first.read_key != second.read_key
    # The second cannot act for the first: heartbeat it, or release it.
    with pytest.raises(status.ServiceError) as raised:
        core.release_iteration_client(
            dispatcher_pb2.ReleaseIterationClientRequest(
                iteration_client_id=first.iteration_client_id, read_key=second.read_key
            )
        )
    assert raised.value.code == status.Code.PERMISSION_DENIED
    assert client_heartbeat(core, first.iteration_client_id).tasks


def test_coordinated_reads_of_a_finite_dataset_are_refused_and_of_an_unknown_one_taken(clock, notifier):
    core = make_core(clock, notifier)
    heartbeat(core, "w1:1")
    finite = register(core, tf.data.Dataset.range(10))
    with pytest.raises(status.ServiceError, match="need an infinite dataset, but dataset '1' has cardinality 10") as e:
        start_iteration(core, finite, job_name="coordinated", num_consumers=2)
    assert e.value.code == status.Code.FAILED_PRECONDITION
    # A filter's cardinality is unknown: the pipeline's to keep going, as in TensorFlow's service.
    unknown = register(core, tf.data.Dataset.range(10).repeat().filter(lambda x: x > 2))
    assert start_iteration(core, unknown, job_name="coordinated", num_consumers=2).iteration_client_id
    # Without coordinated reads a finite dataset is read as always.
    assert start_iteration(core, finite, job_name="plain").iteration_client_id
