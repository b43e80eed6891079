"""Training integration: MirroredStrategy replicas, distribute_datasets_from_function,
DTensor batches, Keras fit on the bundled digits, the input-impact estimate, the
examples and the demo."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO_ROOT
from tensorflow.experimental import dtensor

import dataservice as service
from dataservice import tf_internal
from dataservice.demo import sample_data

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return sample_data.write_digits(str(tmp_path_factory.mktemp("digits")))


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])


def _values(per_replica):
    return [v.numpy() for v in per_replica.values]


def test_mirrored_strategy_splits_each_global_batch_over_the_replicas(cluster, strategy):
    local = tf.data.Dataset.range(64).map(lambda i: (i, tf.fill([3], i))).batch(8)
    served = local.apply(service.distribute("parallel_epochs", cluster.target))
    dist_local = strategy.experimental_distribute_dataset(local)
    dist_served = strategy.experimental_distribute_dataset(served)
    assert type(dist_served.element_spec[0]).__name__ == "PerReplicaSpec"
    got, want = [], []
    for (ids, rows), (local_ids, local_rows) in zip(dist_served, dist_local):
        assert [v.shape for v in ids.values] == [tf.TensorShape([4])] * 2, "global batch 8 over 2 replicas"
        assert [v.shape for v in rows.values] == [tf.TensorShape([4, 3])] * 2
        got.append([_values(ids), _values(rows)])
        want.append([_values(local_ids), _values(local_rows)])
    assert len(got) == 8
    np.testing.assert_equal(got, want)
    iterator = iter(dist_served)
    first = next(iterator)
    assert [list(v.numpy()) for v in first[0].values] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_strategy_run_in_a_tf_function_consumes_the_service_dataset(cluster, strategy):
    served = tf.data.Dataset.range(64).batch(8).apply(service.distribute("parallel_epochs", cluster.target))

    @tf.function
    def step(batch):
        per_replica = strategy.run(lambda x: tf.reduce_sum(x), args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    total = sum(int(step(batch)) for batch in strategy.experimental_distribute_dataset(served))
    assert total == sum(range(64))


def test_distribute_datasets_from_function_reads_a_shared_job(cluster2, strategy):
    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(8)
        return (
            tf.data.Dataset.range(80)
            .batch(batch)
            .apply(
                service.distribute(
                    "distributed_epoch", cluster2.target, **service.input_context_options(context, "from-function")
                )
            )
        )

    seen = []
    for per_replica in strategy.distribute_datasets_from_function(dataset_fn):
        values = _values(per_replica)
        assert all(v.shape[0] <= 4 for v in values)
        seen.extend(int(x) for v in values for x in v)
    assert sorted(seen) == list(range(80)), "every element once, over both workers and both replicas"


def test_input_context_options_make_coordinated_consumers(cluster2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    assert service.input_context_options(context, "j", coordinated=True) == {
        "job_name": "j",
        "consumer_index": 1,
        "num_consumers": 2,
    }
    assert service.input_context_options(context, "j") == {"job_name": "j"}
    with pytest.raises(ValueError, match="job_name"):
        service.input_context_options(context, "")


def test_pack_batch_shards_the_global_batch_along_the_mesh_batch_dimension(cluster):
    mesh = dtensor.create_mesh([("batch", 4)], devices=[f"CPU:{i}" for i in range(4)])
    served = (
        tf.data.Dataset.range(32)
        .map(lambda i: (tf.fill([5], tf.cast(i, tf.float32)), i))
        .batch(8)
        .apply(service.distribute("parallel_epochs", cluster.target))
    )
    batches = list(service.dtensor_batches(served, mesh))
    assert len(batches) == 4
    x, y = batches[1]
    assert dtensor.fetch_layout(x) == dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)
    assert dtensor.fetch_layout(y) == dtensor.Layout(["batch"], mesh)
    shards = [s.numpy() for s in dtensor.unpack(y)]
    assert [list(s) for s in shards] == [[8, 9], [10, 11], [12, 13], [14, 15]]
    assert dtensor.unpack(x)[3].shape == (2, 5)
    with pytest.raises(ValueError, match="does not split evenly"):
        service.pack_batch(tf.range(6), mesh)
    with pytest.raises(ValueError, match="no dimension 'model'"):
        service.pack_batch(tf.range(8), mesh, batch_dim="model")


def test_keras_fit_learns_the_digits_through_distributed_epoch(cluster2, digits):
    train_files, test_files = digits
    train = sample_data.digits_dataset(train_files, 32, shuffle_buffer=512).apply(
        service.distribute("distributed_epoch", cluster2.target)
    )
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential(
        [tf.keras.Input([64]), tf.keras.layers.Dense(128, activation="relu"), tf.keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(3e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(train, epochs=6, verbose=0)
    _, accuracy = model.evaluate(sample_data.digits_dataset(test_files, 64, drop_remainder=False), verbose=0)
    assert accuracy >= 0.90, f"test accuracy {accuracy:.3f} after 6 epochs"
    assert history.history["loss"][-1] < history.history["loss"][0] / 3


def test_estimate_input_impact_tells_input_bound_from_compute_bound():
    slow_input = tf.data.Dataset.range(10**6).batch(16).apply(tf_internal.sleep(20_000))
    fast_step = tf.function(lambda batch: tf.reduce_sum(batch))
    impact = service.estimate_input_impact(slow_input, fast_step, steps=15, warmup_steps=2)
    assert impact.input_bound and impact.suggested_workers >= 2, impact
    assert "input-bound" in str(impact)

    def slow_step(batch):
        time.sleep(0.02)
        return tf.reduce_sum(batch)

    impact = service.estimate_input_impact(tf.data.Dataset.range(10**6).batch(16), slow_step, steps=15, warmup_steps=2)
    assert not impact.input_bound and impact.suggested_workers == 1, impact
    assert "not input-bound" in str(impact)


def _run(args, timeout_s=240, tf_log_level="2"):
    """The program's stdout (and its stderr, for the demo). `tf_log_level` None: TF_CPP_MIN_LOG_LEVEL
    unset, as a newcomer runs it."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    if tf_log_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = tf_log_level
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout_s, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout if tf_log_level is not None else (proc.stdout, proc.stderr)


# What TensorFlow's C++ logging writes: "I0000 00:00:... file.cc:12] ..." and absl's notice.
_TENSORFLOW_LOG_LINE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|oneDNN|cuInit", re.M)


def _final_accuracy(output: str) -> float:
    return float(output.strip().splitlines()[-1].split()[-1])


@pytest.mark.parametrize(
    "example, args",
    [
        ("dtensor_mlp.py", ["--epochs", "4"]),
        ("keras_fit.py", ["--epochs", "5"]),
        ("mirrored_custom_loop.py", ["--epochs", "5"]),
    ],
)
def test_examples_train_to_a_useful_accuracy(example, args):
    out = _run([os.path.join("examples", example), *args])
    last = out.strip().splitlines()[-1]
    assert "accuracy" in last, out
    assert _final_accuracy(out) >= 0.85, out


def test_demo_trains_through_a_local_cluster_and_saves_plots(tmp_path):
    out, err = _run(
        ["-m", "dataservice.demo", "--epochs", "3", "--no-progress", "--output-dir", str(tmp_path), "--linger", "1"],
        tf_log_level=None,
    )
    print(out)
    assert not _TENSORFLOW_LOG_LINE.search(out + err), "TensorFlow's log lines in the demo's output:\n" + err[-2000:]
    assert out.count("epoch ") >= 3 and "examples/s" in out and "cluster stopped" in out
    assert re.search(r"status page: http://localhost:\d+/ \(metrics at http://localhost:\d+/metrics\)", out), out
    assert "the cluster stays up for 1 s" in out
    for name in ("loss.png", "accuracy.png"):
        with open(tmp_path / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert _final_accuracy(out) >= 0.85, out
