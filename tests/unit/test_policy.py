"""The dataset policy (pipeline/policy.py): rules over TensorFlow's op registry, and graphs
with file-writing ops in maps, interleave functions and nested functions."""

import re
import sys

import pytest
import tensorflow as tf

from dataservice import tf_internal
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import policy


def graph_of(dataset: tf.data.Dataset):
    return graph_lib.parse_graph(graph_lib.serialize_dataset(dataset))


def test_every_rule_matches_registered_ops():
    registered = tf_internal.registered_op_names()
    assert len(registered) > 1000
    for pattern, reason in policy.RULES:
        assert any(re.search(pattern, name) for name in registered), f"no registered op matches {pattern} ({reason})"


@pytest.mark.parametrize(
    "op",
    [
        "WriteFile", "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord", "SaveDatasetV2", "SnapshotDatasetV2", "DistributedSave",
        "CreateSummaryFileWriter", "WriteScalarSummary", "WriteSummary", "ImportEvent", "DebugIdentityV2",
        "DebugNumericSummaryV2", "DumpTensor", "RpcCall",
    ],
)  # fmt: skip
def test_ops_that_act_outside_producing_elements_are_refused(op):
    assert op in tf_internal.registered_op_names()
    assert op in policy.unsafe_ops()


@pytest.mark.parametrize(
    "op",
    [
        "RangeDataset", "MapDataset", "ParallelMapDatasetV2", "ParallelInterleaveDatasetV4", "ShuffleDatasetV3",
        "BatchDatasetV2", "TFRecordDataset", "ReadFile", "MatchingFiles", "ParseExampleV2", "PrintV2",
        "DecodeJpeg", "StatelessRandomUniformV2", "CacheDatasetV2",
    ],
)  # fmt: skip
def test_ops_that_produce_elements_are_allowed(op):
    assert op in tf_internal.registered_op_names()
    assert op not in policy.unsafe_ops()


def _write(path):
    def fn(x):
        with tf.control_dependencies([tf.io.write_file(path, tf.strings.as_string(x))]):
            return tf.identity(x)

    return fn


def test_write_file_in_a_map_is_refused_naming_op_and_function(tmp_path):
    dataset = tf.data.Dataset.range(3).map(_write(str(tmp_path / "x")))
    with pytest.raises(policy.UnsafeDatasetError) as raised:
        policy.check(graph_of(dataset))
    assert raised.value.op == "WriteFile" and "map" in raised.value.function.lower()
    assert "WriteFile" in str(raised.value) and "allow_unsafe_ops" in str(raised.value)


def test_write_file_in_an_interleave_function_is_refused(tmp_path):
    dataset = tf.data.Dataset.range(3).interleave(
        lambda x: tf.data.Dataset.from_tensors(x).map(_write(str(tmp_path / "y"))), num_parallel_calls=2
    )
    with pytest.raises(policy.UnsafeDatasetError) as raised:
        policy.check(graph_of(dataset))
    assert raised.value.op == "WriteFile"


def test_write_file_in_a_nested_function_is_refused(tmp_path):
    @tf.function
    def helper(x):
        return _write(str(tmp_path / "z"))(x) + 1

    dataset = tf.data.Dataset.range(3).map(lambda x: helper(x) * 2)
    with pytest.raises(policy.UnsafeDatasetError) as raised:
        policy.check(graph_of(dataset))
    assert raised.value.op == "WriteFile"


def test_print_to_a_file_is_refused_and_to_stderr_allowed(tmp_path):
    def printing(stream):
        def fn(x):
            with tf.control_dependencies([tf.print(x, output_stream=stream)]):
                return tf.identity(x)

        return fn

    policy.check(graph_of(tf.data.Dataset.range(3).map(printing(sys.stderr))))
    with pytest.raises(policy.UnsafeDatasetError, match="prints to the file"):
        policy.check(graph_of(tf.data.Dataset.range(3).map(printing(f"file://{tmp_path}/log"))))


def test_snapshot_and_save_are_refused(tmp_path):
    with pytest.raises(policy.UnsafeDatasetError, match="SnapshotDataset"):
        policy.check(graph_of(tf.data.Dataset.range(3).snapshot(str(tmp_path / "s"))))


def test_ordinary_pipelines_pass(tmp_path):
    path = tmp_path / "data.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"x")
    dataset = (
        tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"))
        .interleave(tf.data.TFRecordDataset, num_parallel_calls=2)
        .map(lambda r: tf.strings.length(r), num_parallel_calls=tf.data.AUTOTUNE)
        .shuffle(10, seed=1)
        .batch(2)
        .prefetch(1)
    )
    policy.check(graph_of(dataset))
