"""The dispatcher state machine: apply() alone changes state, and replaying the same updates gives the same state."""

import random

import pytest

from dataservice.dispatcher import state as state_module
from dataservice.dispatcher.state import DispatcherState, StateInvariantError
from dataservice.v1 import common_pb2, journal_pb2


def U(**kwargs) -> journal_pb2.Update:
    return journal_pb2.Update(**kwargs)


def _script():
    return [
        U(register_dataset=journal_pb2.RegisterDatasetUpdate(dataset_id="1", fingerprint="f1")),
        U(register_dataset=journal_pb2.RegisterDatasetUpdate(dataset_id="named", fingerprint="f2")),
        U(register_worker=journal_pb2.RegisterWorkerUpdate(worker_address="w1:1", transfer_address="w1:1")),
        U(register_worker=journal_pb2.RegisterWorkerUpdate(worker_address="w2:1", transfer_address="w2:1")),
        U(create_job=journal_pb2.CreateJobUpdate(job_id=1, dataset_id="1", job_name="train")),
        U(create_iteration=journal_pb2.CreateIterationUpdate(iteration_id=1, job_id=1, repetition=0)),
        U(create_task=journal_pb2.CreateTaskUpdate(task_id=1, iteration_id=1, worker_address="w1:1")),
        U(create_task=journal_pb2.CreateTaskUpdate(task_id=2, iteration_id=1, worker_address="w2:1")),
        U(acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(iteration_client_id=1, iteration_id=1)),
        U(acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(iteration_client_id=2, iteration_id=1)),
        U(finish_task=journal_pb2.FinishTaskUpdate(task_id=1)),
    ]


def _apply_all(updates) -> DispatcherState:
    return DispatcherState.replay(updates)


def test_apply_builds_the_objects():
    state = _apply_all(_script())
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
    state = _apply_all(_script() + [U(finish_task=journal_pb2.FinishTaskUpdate(task_id=2))])
    assert state.iteration(1).finished
    assert list(state.unfinished_iterations()) == []


def test_finish_iteration_stops_its_tasks():
    state = _apply_all(
        _script()
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
    state = _apply_all(_script())
    task_def = state.task_def(state.task(2))
    assert (task_def.task_id, task_def.iteration_id, task_def.job_id, task_def.dataset_id) == (2, 1, 1, "1")
    assert task_def.processing_mode.sharding_policy == common_pb2.SHARDING_POLICY_OFF
    assert task_def.worker_address == "w2:1"


def random_updates(rng: random.Random, length: int):
    """A valid update sequence: the fixed script, then random iterations, tasks, splits, clients, finishes."""
    updates = _script()
    next_task, next_iteration, next_client = 3, 2, 3
    clients = {1, 2}
    tasks_on = {"w1:1": [1], "w2:1": [2]}
    iteration_of = {1: 1, 2: 1}
    lost_tasks = set()
    snapshots = {}  # path -> (chunks, finished)
    for _ in range(length):
        choice = rng.random()
        if choice < 0.04:
            path = f"/snapshots/{len(snapshots)}"
            chunks = rng.randrange(0, 6)
            snapshots[path] = [chunks, False]
            updates.append(
                U(
                    start_snapshot=journal_pb2.StartSnapshotUpdate(
                        path=path, dataset_id="1", compression="SNAPPY", group_sizes=[chunks * 10], num_chunks=chunks
                    )
                )
            )
        elif choice < 0.08 and snapshots:
            path = rng.choice(sorted(snapshots))
            chunks, finished = snapshots[path]
            if chunks and not finished:
                updates.append(
                    U(
                        commit_snapshot_chunk=journal_pb2.CommitSnapshotChunkUpdate(
                            path=path,
                            chunk_index=rng.randrange(chunks),
                            num_records=rng.randrange(50),
                            uncommitted_file="f",
                        )
                    )
                )
            elif not finished:
                snapshots[path][1] = True
                updates.append(
                    U(finish_snapshot=journal_pb2.FinishSnapshotUpdate(path=path, error_code=rng.choice([0, 3])))
                )
        elif choice < 0.2:
            updates.append(
                U(
                    create_iteration=journal_pb2.CreateIterationUpdate(
                        iteration_id=next_iteration, job_id=1, repetition=next_iteration
                    )
                )
            )
            next_iteration += 1
        elif choice < 0.4:
            worker = rng.choice(["w1:1", "w2:1"])
            updates.append(
                U(
                    create_task=journal_pb2.CreateTaskUpdate(
                        task_id=next_task,
                        iteration_id=rng.randrange(1, next_iteration),
                        worker_address=worker,
                        starting_round=rng.choice([0, rng.randrange(100)]),
                    )
                )
            )
            tasks_on[worker].append(next_task)
            iteration_of[next_task] = updates[-1].create_task.iteration_id
            next_task += 1
        elif choice < 0.55:
            updates.append(
                U(
                    acquire_iteration_client=journal_pb2.AcquireIterationClientUpdate(
                        iteration_client_id=next_client, iteration_id=rng.randrange(1, next_iteration)
                    )
                )
            )
            clients.add(next_client)
            next_client += 1
        elif choice < 0.65 and clients:
            client = rng.choice(sorted(clients))
            clients.discard(client)
            updates.append(
                U(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=client))
            )
        elif choice < 0.75:
            begin = rng.randrange(0, 100)
            # The dispatcher hands no splits to a task of a lost worker.
            task = rng.choice([t for t in range(next_task) if t not in lost_tasks])
            handed = dict(
                # Task 0: a range handed out with no task (as a snapshot's split positions are).
                iteration_id=iteration_of.get(task) or rng.randrange(1, next_iteration),
                split_group=rng.randrange(2),
                repetition=rng.randrange(3),
                task_id=task,
                index=rng.randrange(4),
            )
            updates.append(
                U(
                    produce_splits=journal_pb2.ProduceSplitsUpdate(
                        begin=begin, end=begin + rng.randrange(1, 50), **handed
                    )
                )
            )
            if rng.random() < 0.5:
                updates.append(U(start_splits=journal_pb2.StartSplitsUpdate(**handed)))
        elif choice < 0.77:
            updates.append(
                U(
                    return_splits=journal_pb2.ReturnSplitsUpdate(
                        iteration_id=rng.randrange(1, next_iteration),
                        split_group=rng.randrange(2),
                        repetition=rng.randrange(3),
                        begin=rng.randrange(100),
                        end=100 + rng.randrange(100),
                    )
                )
            )
        elif choice < 0.79:
            worker = rng.choice(["w1:1", "w2:1"])
            lost = [t for t in tasks_on[worker][-20:] if t not in lost_tasks and rng.random() < 0.5]
            lost_tasks.update(lost)
            updates.append(U(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=worker, lost_tasks=lost)))
            if rng.random() < 0.5:
                updates.append(
                    U(register_worker=journal_pb2.RegisterWorkerUpdate(worker_address=worker, transfer_address=worker))
                )
        elif choice < 0.795:
            updates.append(
                U(
                    extend_rounds=journal_pb2.ExtendRoundsUpdate(
                        iteration_id=rng.randrange(1, next_iteration), round_limit=rng.randrange(1, 500)
                    )
                )
            )
        elif choice < 0.8:
            updates.append(
                U(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=rng.randrange(1, next_iteration)))
            )
        else:
            updates.append(U(finish_task=journal_pb2.FinishTaskUpdate(task_id=rng.randrange(1, next_task))))
    return updates


def comparable(state: DispatcherState):
    return {k: v for k, v in vars(state).items()}


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
    state = _apply_all(_script())
    state.validate()
    state.iteration(1).task_ids.append(99)
    with pytest.raises(StateInvariantError, match="task 99"):
        state.validate()
    state = _apply_all(_script())
    state.task(2).lost = True
    with pytest.raises(StateInvariantError, match="lost but not finished"):
        state.validate()
    state = _apply_all(_script())
    state.iteration(1).client_ids.add(7)
    with pytest.raises(StateInvariantError, match="client 7"):
        state.validate()
    state = _apply_all(_script() + [U(finish_task=journal_pb2.FinishTaskUpdate(task_id=2))])
    state.iteration(1).finished = False
    with pytest.raises(StateInvariantError, match="every task finished"):
        state.validate()


def test_round_limits_only_grow():
    state = _apply_all(
        _script()
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
