"""The dispatcher state machine: apply() alone changes state, and replaying the same updates gives the same state."""

import random

import pytest
from state_helpers import U, comparable, random_updates, script

from dataservice.dispatcher import state as state_module
from dataservice.dispatcher.state import DispatcherState, StateInvariantError
from dataservice.v1 import common_pb2, journal_pb2


def _apply_all(updates) -> DispatcherState:
    return DispatcherState.replay(updates)


def test_apply_builds_the_objects():
    state = _apply_all(script())
    assert {d.dataset_id for d in state.datasets()} == {"1", "named"}
    assert state.dataset_with_fingerprint("f2") == "named"
    assert state.next_dataset_id() == "2"
    assert state.job_named("1", "train").job_id == 1 and state.job_named("1", "eval") is None
    assert state.job_named("named", "train") is None, "a name is per dataset"
    iteration = state.iteration(1)
    assert iteration.task_ids == [1, 2] and iteration.client_ids == {1, 2}
    assert not iteration.finished, "one task is still running"
    assert [t.task_id for t in state.active_tasks_of_worker("w2:1")] == [2]
    assert state.active_tasks_of_worker("w1:1") == []
    assert state.next_id("task") == 3 and state.next_id("client") == 3


def test_iteration_finishes_with_its_last_task():
    state = _apply_all(script() + [U(finish_task=journal_pb2.FinishTaskUpdate(task_id=2))])
    assert state.iteration(1).finished
    assert list(state.unfinished_iterations()) == []


def test_finish_iteration_stops_its_tasks():
    state = _apply_all(
        script()
        + [
            U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=1)),
            U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=2)),
            U(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=1)),
        ]
    )
    assert state.client_ids() == []
    assert state.iteration(1).client_ids == set()
    assert state.active_tasks_of_worker("w2:1") == []


def test_task_def_describes_the_task():
    state = _apply_all(script())
    task_def = state.task_def(state.task(2))
    assert (task_def.task_id, task_def.iteration_id, task_def.job_id, task_def.dataset_id) == (2, 1, 1, "1")
    assert task_def.processing_mode.sharding_policy == common_pb2.SHARDING_POLICY_OFF
    assert task_def.worker_address == "w2:1"


def test_replaying_the_same_updates_gives_the_same_state():
    rng = random.Random(7)
    for _ in range(20):
        updates = random_updates(rng, rng.randint(0, 40))
        # Through the journal's byte form, as a restart would read them.
        replayed = [journal_pb2.Update.FromString(u.SerializeToString()) for u in updates]
        state = _apply_all(updates)
        state.validate()
        assert comparable(state) == comparable(_apply_all(replayed))


def test_snapshot_then_replay_equals_full_replay():
    rng = random.Random(11)
    for _ in range(100):
        updates = random_updates(rng, rng.randint(0, 60))
        cut = rng.randint(0, len(updates))
        snapshot = _apply_all(updates[:cut]).to_updates()
        restored = _apply_all(snapshot + updates[cut:])
        restored.validate()
        assert comparable(restored) == comparable(_apply_all(updates))


def test_every_update_kind_has_a_handler():
    assert set(state_module.update_kinds()) == set(state_module._APPLY)
    for kind, handler in state_module._APPLY.items():
        assert handler.__name__ == f"_apply_{kind}", f"{kind} is applied by {handler.__name__}"


def test_an_update_with_no_change_is_refused():
    with pytest.raises(ValueError, match="no change"):
        DispatcherState().apply(journal_pb2.Update())


def test_validate_finds_broken_invariants():
    state = _apply_all(script())
    state.validate()
    state.iteration(1).task_ids.append(99)
    with pytest.raises(StateInvariantError, match="task 99"):
        state.validate()
    state = _apply_all(script())
    state.task(2).lost = True
    with pytest.raises(StateInvariantError, match="lost but not finished"):
        state.validate()
    state = _apply_all(script())
    state.iteration(1).client_ids.add(7)
    with pytest.raises(StateInvariantError, match="client 7"):
        state.validate()
    state = _apply_all(script() + [U(finish_task=journal_pb2.FinishTaskUpdate(task_id=2))])
    state.iteration(1).finished = False
    with pytest.raises(StateInvariantError, match="every task finished"):
        state.validate()


def test_round_limits_only_grow():
    state = _apply_all(
        script()
        + [
            U(extend_rounds=journal_pb2.ExtendRoundsUpdate(iteration_id=1, round_limit=40)),
            U(extend_rounds=journal_pb2.ExtendRoundsUpdate(iteration_id=1, round_limit=16)),
            U(
                create_task=journal_pb2.CreateTaskUpdate(
                    task_id=3, iteration_id=1, worker_address="w1:1", starting_round=40
                )
            ),
        ]
    )
    assert state.iteration(1).round_limit == 40
    assert state.task_def(state.task(3)).starting_round == 40


def _retired_script():
    """The script's iteration finished (both tasks) and without clients, a second iteration of
    its job still running, and task 2 holding a split range."""
    return script() + [
        U(
            produce_splits=journal_pb2.ProduceSplitsUpdate(
                iteration_id=1, split_group=0, repetition=0, task_id=2, index=0, begin=0, end=5
            )
        ),
        U(finish_task=journal_pb2.FinishTaskUpdate(task_id=2)),
        U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=1)),
        U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=2)),
        U(create_iteration=journal_pb2.CreateIterationUpdate(iteration_id=2, job_id=1, repetition=1)),
        U(create_task=journal_pb2.CreateTaskUpdate(task_id=3, iteration_id=2, worker_address="w1:1")),
    ]


def test_dropping_an_iteration_forgets_it_its_tasks_and_then_its_job():
    state = _apply_all(_retired_script())
    assert [i.iteration_id for i in state.retired_iterations()] == [1]
    state.apply(U(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=1)))
    state.validate()
    assert state.iteration(1) is None and state.task(1) is None and state.task(2) is None
    assert [t.task_id for t in state.active_tasks_of_worker("w1:1")] == [3]
    assert state.was_dropped("iteration", 1) and state.was_dropped("task", 2)
    assert not state.was_dropped("iteration", 2) and not state.was_dropped("iteration", 3)
    # The job keeps its other iteration, and its name.
    assert state.job_named("1", "train").iterations == {1: 2}
    # Ids are not reused.
    assert (state.next_id("iteration"), state.next_id("task")) == (3, 4)

    state.apply(U(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=2)))
    state.apply(U(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=2)))
    state.validate()
    assert state.job(1) is None and state.job_named("1", "train") is None and state.was_dropped("job", 1)
    assert state.summary()["tasks"] == 0 and state.active_tasks_of_worker("w1:1") == []
    # A snapshot of what is left replays to the same state, and holds nothing of what was dropped.
    snapshot = state.to_updates()
    assert comparable(_apply_all(snapshot)) == comparable(state)
    assert not any(u.HasField("create_task") or u.HasField("create_job") for u in snapshot)


def test_an_iteration_with_clients_or_unfinished_cannot_be_dropped():
    state = _apply_all(script())  # iteration 1: clients, a task running
    with pytest.raises(ValueError, match="not finished or has clients"):
        state.apply(U(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=1)))
    state = _apply_all(_retired_script())
    with pytest.raises(ValueError, match="not finished or has clients"):
        state.apply(U(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=2)))


def test_a_journal_with_drops_replays_the_same_through_a_snapshot_at_any_point():
    updates = _retired_script() + [
        U(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=1)),
        U(create_task=journal_pb2.CreateTaskUpdate(task_id=4, iteration_id=2, worker_address="w2:1")),
    ]
    whole = _apply_all(updates)
    for cut in range(len(updates) + 1):
        restored = _apply_all(_apply_all(updates[:cut]).to_updates() + updates[cut:])
        restored.validate()
        assert comparable(restored) == comparable(whole), cut
