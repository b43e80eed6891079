"""Update sequences for the unit tests of the state machine and the journal: a fixed script and
random valid sequences. (A module of its own, not a conftest: tests/conftest.py has that name.)"""

import random

from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import journal_pb2


def U(**kwargs) -> journal_pb2.Update:
    return journal_pb2.Update(**kwargs)


def script():
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


def random_updates(rng: random.Random, length: int):
    """A valid update sequence: the fixed script, then random iterations, tasks, splits, clients, finishes."""
    updates = script()
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


def record_offsets(path):
    """Where each record of a journal file starts (the header record first), and where they end."""
    data = path.read_bytes()
    offsets, offset = [], 0
    while offset + 16 <= len(data) and data[offset : offset + 16] != bytes(16):
        offsets.append(offset)
        offset += 16 + int.from_bytes(data[offset + 4 : offset + 8], "little")
    return offsets, offset
