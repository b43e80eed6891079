"""distributed_epoch and static sharding with workers in separate processes.

Resource handles baked into a graph are shared by pipelines rebuilt in one
process, which would hide bugs: every worker here is its own `data-server`.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conftest import to_list, wait_for_workers

import dataservice as service
from dataservice.local_cluster import LocalCluster, ServerProcess

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster3():
    cluster = LocalCluster(num_workers=3)
    wait_for_workers(cluster.address, 3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """6 TFRecord files and 4 text files of distinct records."""
    root = tmp_path_factory.mktemp("data")
    records, lines = [], []
    for f in range(6):
        with tf.io.TFRecordWriter(str(root / f"part-{f}.tfrecord")) as writer:
            for r in range(40):
                value = f * 1000 + r
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={"value": tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))}
                        )
                    ).SerializeToString()
                )
                records.append(value)
    for f in range(4):
        with open(root / f"text-{f}.txt", "w") as out:
            for r in range(25):
                out.write(f"line-{f}-{r}\n")
                lines.append(f"line-{f}-{r}".encode())
    return root, records, lines


def _distributed(ds, cluster, **kwargs):
    return ds.apply(service.distribute("distributed_epoch", cluster.target, **kwargs))


def _exactly_once(values, expected):
    counts = collections.Counter(values)
    assert counts == collections.Counter(expected), (
        f"missing {sorted(set(expected) - set(counts))[:10]}, duplicated {[v for v, c in counts.items() if c > 1][:10]}"
    )


def _parse(record):
    return tf.io.parse_single_example(record, {"value": tf.io.FixedLenFeature([], tf.int64)})["value"]


def test_range_map_batch(cluster3):
    ds = _distributed(tf.data.Dataset.range(3000).map(lambda x: x * 2).batch(7), cluster3)
    batches = to_list(ds)
    _exactly_once(np.concatenate(batches).tolist(), [2 * i for i in range(3000)])
    assert sum(len(b) < 7 for b in batches) <= 3, "batches span splits: only each worker's last batch is partial"


def test_list_files_interleave_tfrecord(cluster3, files):
    root, records, _ = files
    ds = (
        tf.data.Dataset.list_files(str(root / "*.tfrecord"), shuffle=True, seed=3)
        .interleave(tf.data.TFRecordDataset, cycle_length=2)
        .map(_parse)
        .batch(16)
    )
    _exactly_once(np.concatenate(to_list(_distributed(ds, cluster3))).tolist(), records)


def test_file_slices_flat_map_shuffle(cluster3, files):
    root, _, lines = files
    names = sorted(str(p) for p in root.glob("text-*.txt"))
    ds = tf.data.Dataset.from_tensor_slices(names).flat_map(tf.data.TextLineDataset).shuffle(30)
    _exactly_once(to_list(_distributed(ds, cluster3)), lines)


def test_zip_keeps_pairs(cluster3):
    ds = tf.data.Dataset.zip((tf.data.Dataset.range(500), tf.data.Dataset.range(500).map(lambda x: x * 10)))
    _exactly_once([(int(a), int(b)) for a, b in to_list(_distributed(ds, cluster3))], [(i, 10 * i) for i in range(500)])


@pytest.mark.parametrize("repeated_first", [False, True])
def test_zip_of_a_longer_member_and_a_repeated_shorter_one_runs_as_long_as_the_longer(cluster3, repeated_first):
    """TensorFlow's service gives 50 elements here (each source's splits repeat); the zip's pairs
    are kept across the three workers."""
    long, short = tf.data.Dataset.range(50), tf.data.Dataset.range(10).map(lambda x: x * 100).repeat(10)
    ds = tf.data.Dataset.zip((short, long) if repeated_first else (long, short))
    pairs = [(int(a), int(b)) for a, b in to_list(_distributed(ds, cluster3))]
    expected = [(i, i % 10 * 100) for i in range(50)]
    _exactly_once(pairs, [(b, a) for a, b in expected] if repeated_first else expected)


def test_concatenate(cluster3):
    ds = tf.data.Dataset.range(300).concatenate(tf.data.Dataset.range(1000, 1200))
    _exactly_once(to_list(_distributed(ds, cluster3)), list(range(300)) + list(range(1000, 1200)))


def test_sample_from_datasets(cluster3):
    ds = tf.data.Dataset.sample_from_datasets(
        [tf.data.Dataset.range(0, 200), tf.data.Dataset.range(1000, 1200)], weights=[0.3, 0.7], seed=5
    )
    _exactly_once(to_list(_distributed(ds, cluster3)), list(range(200)) + list(range(1000, 1200)))


def test_sample_from_infinite_sources_follows_the_weights(cluster3):
    """Every worker reads its `from_tensors(i).repeat()` inputs for as long as it samples (as in
    TensorFlow's service), so the sampled frequencies follow the weights."""
    weights = [0.85, 0.05, 0.1]
    ds = tf.data.Dataset.sample_from_datasets(
        [tf.data.Dataset.from_tensors(np.int64(i)).repeat() for i in range(len(weights))], weights, seed=1619
    )
    counts = np.bincount(to_list(_distributed(ds, cluster3).take(5000)), minlength=len(weights))
    frequencies = counts / counts.sum()
    chi2 = float(np.sum((frequencies - weights) ** 2 / weights))
    assert chi2 < 1e-2, (counts, chi2)


def test_choose_from_infinite_sources_makes_the_choices_on_every_worker(cluster3):
    """The choices run whole on each worker, as in TensorFlow's service; the read ends with them
    although tf.data counts the pipeline infinite."""
    words = [b"foo", b"bar", b"baz"]
    choices = np.random.default_rng(5).integers(3, size=15)
    ds = tf.data.Dataset.choose_from_datasets(
        [tf.data.Dataset.from_tensors(w).repeat() for w in words], tf.data.Dataset.from_tensor_slices(choices)
    )
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    distributed = _distributed(ds, cluster3)
    assert distributed.cardinality() == tf.data.UNKNOWN_CARDINALITY
    _exactly_once(to_list(distributed), [words[i] for i in choices] * 3)
    dataset_id = service.register_dataset(cluster3.target, ds)
    by_id = service.from_dataset_id("distributed_epoch", cluster3.target, dataset_id, ds.element_spec)
    assert by_id.cardinality() == tf.data.UNKNOWN_CARDINALITY
    _exactly_once(to_list(by_id), [words[i] for i in choices] * 3)


def test_unbatch(cluster3):
    matrix = np.arange(400, dtype=np.int32).reshape(80, 5)
    ds = tf.data.Dataset.from_tensor_slices(matrix).unbatch()
    _exactly_once(to_list(_distributed(ds, cluster3)), list(range(400)))


def test_from_tensors_is_one_split(cluster3):
    ds = tf.data.Dataset.from_tensors(tf.constant([1, 2, 3])).map(lambda x: x * 2)
    got = to_list(_distributed(ds, cluster3))
    assert len(got) == 1 and got[0].tolist() == [2, 4, 6]


def test_repeat_inside_the_pipeline(cluster3):
    ds = tf.data.Dataset.range(400).repeat(3).map(lambda x: x + 1)
    _exactly_once(to_list(_distributed(ds, cluster3)), list(range(1, 401)) * 3)


def test_repeat_after_distribute(cluster3):
    ds = _distributed(tf.data.Dataset.range(300), cluster3).repeat(2)
    _exactly_once(to_list(ds), list(range(300)) * 2)


def test_infinite_repeat_inside(cluster3):
    ds = _distributed(tf.data.Dataset.range(50).repeat(), cluster3)
    got = to_list(ds, limit=500)
    counts = collections.Counter(int(x) for x in got)
    assert set(counts) == set(range(50))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tf.data.Dataset.random(seed=1).take(10), "cannot split the source op RandomDataset"),
        (
            lambda: tf.data.Dataset.from_tensor_slices(tf.sparse.SparseTensor([[0, 1]], [1.0], [3, 3])),
            "cannot split TensorSliceDataset.*sparse or ragged",
        ),
    ],
)
def test_unsplittable_pipeline_is_refused(cluster3, make, message):
    with pytest.raises(ValueError, match=f"{message}.*parallel_epochs"):
        _distributed(make(), cluster3)


def _free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def static_cluster():
    ports = _free_ports(2)
    addresses = [f"localhost:{p}" for p in ports]
    dispatcher = ServerProcess("--role=dispatcher", "--port=0", "--worker_addresses=" + ",".join(addresses))
    workers = [
        ServerProcess(
            "--role=worker",
            f"--port={p}",
            f"--worker_address=localhost:{p}",
            f"--dispatcher_address={dispatcher.address}",
        )
        for p in ports
    ]
    wait_for_workers(dispatcher.address, 2)
    yield dispatcher
    for server in workers + [dispatcher]:
        server.terminate()


def _static(ds, dispatcher, policy):
    return ds.apply(service.distribute(policy, "grpc://" + dispatcher.address))


@pytest.mark.parametrize("policy", [service.ShardingPolicy.DATA, service.ShardingPolicy.FILE_OR_DATA])
def test_static_data_sharding(static_cluster, policy):
    _exactly_once(
        to_list(_static(tf.data.Dataset.range(200).map(lambda x: x * 3), static_cluster, policy)),
        [3 * i for i in range(200)],
    )


@pytest.mark.parametrize("policy", [service.ShardingPolicy.FILE, service.ShardingPolicy.FILE_OR_DATA])
def test_static_file_sharding(static_cluster, files, policy):
    root, records, _ = files
    ds = (
        tf.data.Dataset.list_files(str(root / "*.tfrecord"), shuffle=False)
        .interleave(tf.data.TFRecordDataset)
        .map(_parse)
    )
    _exactly_once(to_list(_static(ds, static_cluster, policy)), records)


def test_static_hint_sharding(static_cluster):
    ds = tf.data.Dataset.range(100).shard(tf.data.experimental.SHARD_HINT, tf.data.experimental.SHARD_HINT)
    _exactly_once(to_list(_static(ds, static_cluster, service.ShardingPolicy.HINT)), list(range(100)))


def test_file_policy_without_files_is_refused(static_cluster):
    ds = _static(tf.data.Dataset.range(10), static_cluster, service.ShardingPolicy.FILE)
    with pytest.raises(tf.errors.OpError, match="cannot shard.*FILE sharding needs a file-based source"):
        to_list(ds)


def test_static_policy_needs_worker_addresses(cluster3):
    ds = tf.data.Dataset.range(10).apply(service.distribute(service.ShardingPolicy.DATA, cluster3.target))
    with pytest.raises(tf.errors.OpError, match="needs a dispatcher configured with worker_addresses"):
        to_list(ds)


def test_worker_outside_worker_addresses_is_refused(static_cluster):
    config = service.WorkerConfig(dispatcher_address=static_cluster.address, dispatcher_timeout_ms=5000)
    with pytest.raises(tf.errors.FailedPreconditionError, match="not in the dispatcher's worker_addresses"):
        service.WorkerServer(config)
