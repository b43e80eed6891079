"""distributed_save in the dispatcher core, without a server: chunk slicing, hand-out, commits
that win once, lost workers, restarts, and hostile commit requests."""

import itertools
import os

import pytest
import tensorflow as tf
from dispatcher_helpers import FakeClock, RecordingNotifier, heartbeat, register
from tensorflow.core.protobuf import snapshot_pb2

from dataservice import status
from dataservice.config import DispatcherConfig
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.snapshots import ChunkAssignments
from dataservice.dispatcher.state import DispatcherState
from dataservice.snapshot import layout
from dataservice.v1 import dispatcher_pb2


def test_chunk_ranges_cut_each_group_into_disjoint_covering_slices():
    for sizes, streams in itertools.product(([10], [0], [1], [1000, 7], [100_000 * 40 + 3]), (0, 1, 3, 16)):
        chunks = layout.num_chunks(sizes, streams)
        assert chunks == min(max(sizes), max(streams, 1, -(-max(sizes) // layout.MAX_SPLITS_PER_CHUNK)))
        for group, size in enumerate(sizes):
            covered = []
            for index in range(chunks):
                (g, begin, end) = layout.chunk_ranges(sizes, chunks, index)[group]
                assert g == group and begin <= end
                covered.extend(range(begin, end))
            assert covered == list(range(size)) or chunks == 0


def test_uncommitted_names_must_be_plain_file_names():
    assert layout.uncommitted_file("/s", 3, "chunk.1f.0").endswith("streams/stream_3/uncommitted_chunks/chunk.1f.0")
    for hostile in ("../../etc/passwd", "a/b", "..", "", "x" * 300, "a\x00b"):
        with pytest.raises(ValueError):
            layout.uncommitted_file("/s", 3, hostile)


def make_core(tmp_path, clock=None, state=None, **config):
    config.setdefault("worker_timeout_ms", 2000)
    config = DispatcherConfig(work_dir=str(tmp_path / "work"), fault_tolerant_mode=True, **config)
    return DispatcherCore(config, "test:0", clock=clock or FakeClock(), notifier=RecordingNotifier(), state=state)


def start(core, dataset_id, path):
    metadata = snapshot_pb2.DistributedSnapshotMetadata(compression="SNAPPY")
    core.snapshot(
        dispatcher_pb2.SnapshotRequest(dataset_id=dataset_id, path=path, metadata=metadata.SerializeToString())
    )


def write(path, index, name="w", content=b"chunk"):
    os.makedirs(layout.uncommitted_dir(path, index), exist_ok=True)
    with open(layout.uncommitted_file(path, index, name), "wb") as f:
        f.write(content)


def commit(core, worker, path, index, name="w", records=5, **error):
    return core.commit_snapshot_chunk(
        dispatcher_pb2.CommitSnapshotChunkRequest(
            worker_address=worker, path=path, chunk_index=index, uncommitted_file=name, num_records=records, **error
        )
    )


def chunks_of(response):
    return [c.chunk_index for c in response.snapshot_chunks]


def test_chunks_go_one_per_worker_and_each_commits_once(tmp_path):
    core = make_core(tmp_path)
    for worker in ("w1:1", "w2:1", "w3:1"):  # one chunk each (the third heartbeats no more)
        heartbeat(core, worker)
    dataset_id = register(core, tf.data.Dataset.range(20))
    path = str(tmp_path / "snap")
    start(core, dataset_id, path)
    assert sorted(os.listdir(path)) == [
        "chunks",
        "dataset_def.proto",
        "dataset_spec.pb",
        "snapshot.metadata",
        "streams",
    ]
    first, second = heartbeat(core, "w1:1"), heartbeat(core, "w2:1")
    assert chunks_of(first) == [0] and chunks_of(second) == [1]
    assert [(r.begin, r.end) for r in first.snapshot_chunks[0].ranges] == [(0, 6)]
    # Committing hands the worker its next chunk at once.
    write(path, 0)
    response = commit(core, "w1:1", path, 0)
    assert response.committed and [c.chunk_index for c in response.next_chunks] == [2]
    assert os.listdir(os.path.join(path, "chunks")) == ["chunk_0_0_5"]
    # A second write of a committed chunk (a worker thought lost) is deleted, not committed.
    write(path, 0, name="late")
    assert not commit(core, "w2:1", path, 0, name="late").committed
    assert not os.path.exists(layout.uncommitted_file(path, 0, "late"))
    assert os.listdir(os.path.join(path, "chunks")) == ["chunk_0_0_5"]
    core.validate()


def test_a_lost_workers_chunk_is_handed_out_again(tmp_path):
    clock = FakeClock()
    core = make_core(tmp_path, clock)
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    path = str(tmp_path / "snap")
    start(core, register(core, tf.data.Dataset.range(20)), path)
    assert chunks_of(heartbeat(core, "w1:1")) == [0]
    assert chunks_of(heartbeat(core, "w2:1")) == [1]
    for _ in range(2):  # w2 heartbeats, w1 stays silent
        clock.advance(1.5)
        heartbeat(core, "w2:1", snapshot_chunks=[(path, 1)])
    core.collect_garbage()  # w1 is gone: chunk 0 is free again
    write(path, 1)
    assert [c.chunk_index for c in commit(core, "w2:1", path, 1).next_chunks] == [0]


def test_the_last_commit_writes_done_and_a_failure_writes_error(tmp_path):
    core = make_core(tmp_path)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(2))
    path, failing = str(tmp_path / "snap"), str(tmp_path / "failing")
    start(core, dataset_id, path)
    write(path, 0)
    commit(core, "w1:1", path, 0, records=2)
    assert layout.done(path)
    start(core, dataset_id, failing)
    commit(core, "w1:1", failing, 0, name="", error_code=3, error_message="bad element")
    assert "bad element" in layout.error(failing) and not layout.done(failing)
    assert {s["path"]: s["state"] for s in core.status()["snapshots"]} == {path: "done", failing: "failed"}
    # A failed snapshot hands out nothing more.
    assert not chunks_of(heartbeat(core, "w1:1"))


def test_after_a_restart_workers_keep_their_chunks_and_drop_committed_ones(tmp_path):
    core = make_core(tmp_path)
    for worker in range(1, 7):  # six chunks
        heartbeat(core, f"w{worker}:1")
    path = str(tmp_path / "snap")
    start(core, register(core, tf.data.Dataset.range(20)), path)
    heartbeat(core, "w1:1")
    write(path, 0)
    commit(core, "w1:1", path, 0)
    restarted = make_core(tmp_path, state=DispatcherState.replay(core.state.to_updates()))
    response = restarted.worker_heartbeat(
        dispatcher_pb2.WorkerHeartbeatRequest(
            worker_address="w1:1",
            current_snapshot_chunks=[
                dispatcher_pb2.SnapshotChunkRef(path=path, chunk_index=0),
                dispatcher_pb2.SnapshotChunkRef(path=path, chunk_index=5),
            ],
        )
    )
    assert [(r.path, r.chunk_index) for r in response.snapshot_chunks_to_drop] == [(path, 0)]
    assert not response.snapshot_chunks  # it keeps chunk 5, which is still its own
    assert chunks_of(heartbeat(restarted, "w2:1")) == [1]


def test_snapshot_requests_are_checked(tmp_path):
    core = make_core(tmp_path)
    heartbeat(core, "w1:1")
    dataset_id = register(core, tf.data.Dataset.range(20))
    path = str(tmp_path / "snap")
    cases = [
        (lambda: start(core, dataset_id, "relative/path"), status.Code.INVALID_ARGUMENT),
        (lambda: start(core, "nope", str(tmp_path / "x")), status.Code.NOT_FOUND),
        (lambda: start(core, register(core, tf.data.Dataset.range(3).repeat()), str(tmp_path / "y")), 3),
    ]
    start(core, dataset_id, path)
    cases += [
        (lambda: start(core, dataset_id, path), status.Code.ALREADY_EXISTS),
        (lambda: commit(core, "stranger:1", path, 0), status.Code.NOT_FOUND),
        (lambda: commit(core, "w1:1", str(tmp_path / "other"), 0), status.Code.NOT_FOUND),
        (lambda: commit(core, "w1:1", path, 99), status.Code.INVALID_ARGUMENT),
        (lambda: commit(core, "w1:1", path, 0, name="../../../etc/passwd"), status.Code.INVALID_ARGUMENT),
        (lambda: commit(core, "w1:1", path, 0, records=-1), status.Code.INVALID_ARGUMENT),
        (lambda: commit(core, "w1:1", path, 0, name="never-written"), status.Code.FAILED_PRECONDITION),
    ]
    for call, code in cases:
        with pytest.raises(status.ServiceError) as raised:
            call()
        assert raised.value.code == code, raised.value
    core.validate()


def test_not_fault_tolerant_refuses(tmp_path):
    core = DispatcherCore(DispatcherConfig(), "test:0", clock=FakeClock(), notifier=RecordingNotifier())
    with pytest.raises(status.ServiceError, match="fault tolerant mode"):
        start(core, register(core, tf.data.Dataset.range(3)), str(tmp_path / "s"))


def test_assignments_limit_snapshots_per_worker():
    from dataservice.dispatcher.state import Snapshot

    snapshots = [Snapshot(f"/s{i}", "1", "", [4], 4) for i in range(3)]
    limited = ChunkAssignments(max_snapshots_per_worker=2)
    assert limited.hand_out("w", snapshots) == [("/s0", 0), ("/s1", 0)]
    assert limited.hand_out("w", snapshots) == []
    assert ChunkAssignments().hand_out("w", snapshots) == [("/s0", 0), ("/s1", 0), ("/s2", 0)]
