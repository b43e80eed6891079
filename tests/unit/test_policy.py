"""The dataset policy (pipeline/policy.py): rules over TensorFlow's op registry, and graphs
with file-writing ops in maps, interleave functions and nested functions."""

import importlib.resources
import re
import sys

import pytest
import tensorflow as tf

from dataservice import tf_internal
from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import policy


def graph_of(dataset: tf.data.Dataset):
    return graph_lib.parse_graph(graph_lib.serialize_dataset(dataset))


def test_the_verdict_table_is_the_reviewed_one():
    """Every op registered in the installed TensorFlow, with the rules' verdict, equals the reviewed
    table shipped with the package: a TensorFlow upgrade that adds or moves ops fails here until
    someone reads the difference and regenerates the table."""
    registered = tf_internal.registered_op_names()
    assert len(registered) > 1000
    rules = policy.rule_verdicts()
    assert set(rules) == set(registered)
    shipped = importlib.resources.files("dataservice.pipeline").joinpath(policy.REVIEWED_TABLE).read_text()
    assert policy.format_table(rules) == shipped, (
        "the op verdicts differ from dataservice/pipeline/op_verdicts.tsv; review them and regenerate it with "
        "python -m dataservice.pipeline.policy > dataservice/pipeline/op_verdicts.tsv"
    )
    allowed = sum(verdict.allowed for verdict in policy.verdicts().values())
    assert 0 < allowed < len(registered)


def test_every_rule_names_registered_ops():
    libraries = {tf_internal.op_library(op) for op in tf_internal.registered_op_names()}
    for library in [*policy.ALLOWED_LIBRARIES, *policy.REFUSED_LIBRARIES]:
        assert library in libraries, f"no registered op comes from {library}"
    for names, pattern, reason in policy.REFUSED_IN_ALLOWED:
        matched = [
            op for op in tf_internal.registered_op_names()
            if tf_internal.op_library(op) in names.split("|") and re.search(pattern, op)
        ]  # fmt: skip
        assert matched, f"no registered op of {names} matches {pattern} ({reason})"


def test_an_op_the_rules_allow_but_nobody_reviewed_is_refused():
    rules = {"Abs": policy.Verdict(True, "math"), "Abort": policy.Verdict(False, "terminates the worker process")}
    combined = policy.combine(rules, frozenset({"Abort"}))
    assert not combined["Abs"].allowed and "reviewed op table" in combined["Abs"].reason
    assert not combined["Abort"].allowed and combined["Abort"].reason == "terminates the worker process"
    assert policy.combine(rules, frozenset({"Abs"}))["Abs"].allowed


@pytest.mark.parametrize(
    "op",
    [
        # writers
        "WriteFile", "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord", "SaveDatasetV2", "SnapshotDatasetV2", "DistributedSave",
        "CreateSummaryFileWriter", "WriteScalarSummary", "WriteSummary", "ImportEvent", "DebugIdentityV2",
        "DebugNumericSummaryV2", "DumpTensor", "StatsAggregatorSetSummaryWriter",
        # readers of saved state, tables and databases
        "LoadDataset", "RestoreV2", "Restore", "ImmutableConst", "InitializeTableFromTextFileV2", "SqlDataset",
        "ExperimentalSqlDataset", "GenerateVocabRemapping", "SnapshotNestedDatasetReader", "TFRecordReaderV2",
        # outbound connections and other processes
        "DataServiceDatasetV4", "RegisterDatasetV2", "RpcCall", "RpcClient", "RemoteCall", "CollectiveReduceV2",
        # the process and its shared state
        "Abort", "EagerPyFunc", "PyFunc", "VarHandleOp", "AssignVariableOp", "FIFOQueueV2",
        "IteratorFromStringHandleV2", "DatasetFromGraph", "_Send",
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
        "DecodeJpeg", "StatelessRandomUniformV2", "RandomUniform", "CacheDatasetV2", "HashTableV2",
        "LookupTableFindV2", "TensorArrayV3", "StatefulPartitionedCall", "While", "Const", "_Retval",
        "StringSplitV2", "RaggedTensorToVariant", "SparseToDense", "DecodeProtoV2",
    ],
)  # fmt: skip
def test_ops_that_produce_elements_are_allowed(op):
    assert op in tf_internal.registered_op_names()
    assert op not in policy.unsafe_ops(), policy.verdicts()[op]


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


def test_cache_to_a_file_is_refused_and_in_memory_allowed(tmp_path):
    policy.check(graph_of(tf.data.Dataset.range(3).cache().map(lambda x: x + 1).cache("")))
    with pytest.raises(policy.UnsafeDatasetError, match="caches to the file") as raised:
        policy.check(graph_of(tf.data.Dataset.range(3).cache(str(tmp_path / "c"))))
    assert raised.value.op == "CacheDatasetV2"
    # A file name computed from the element inside an interleave function is not a constant.
    computed = tf.data.Dataset.range(2).interleave(
        lambda i: tf.data.Dataset.range(3).cache(tf.strings.join([str(tmp_path), "/", tf.strings.as_string(i)]))
    )
    with pytest.raises(policy.UnsafeDatasetError, match="computed at run time"):
        policy.check(graph_of(computed))


def test_abort_read_of_saved_state_and_outbound_datasets_are_refused(tmp_path):
    def aborting(x):
        with tf.control_dependencies([tf.raw_ops.Abort(error_msg="bye")]):
            return tf.identity(x)

    with pytest.raises(policy.UnsafeDatasetError, match="terminates the worker process"):
        policy.check(graph_of(tf.data.Dataset.range(3).map(aborting)))
    tf.data.Dataset.range(3).save(str(tmp_path / "saved"))
    with pytest.raises(policy.UnsafeDatasetError, match="LoadDataset|SnapshotChunkDataset|ListSnapshotChunksDataset"):
        policy.check(graph_of(tf.data.Dataset.load(str(tmp_path / "saved"))))
    vocabulary = tmp_path / "vocabulary.txt"
    vocabulary.write_text("a\nb\n")
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            str(vocabulary),
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
        ),
        -1,
    )
    with pytest.raises(policy.UnsafeDatasetError, match="InitializeTableFromTextFile"):
        policy.check(graph_of(tf.data.Dataset.from_tensor_slices(["a", "c"]).map(table.lookup)))


def test_a_graph_naming_an_unregistered_op_is_left_to_the_import():
    # It cannot run: importing it fails, which callers report as a malformed graph (test_errors.py).
    graph = graph_of(tf.data.Dataset.range(3))
    graph.node.add(name="mystery", op="NoSuchOpAnywhere")
    policy.check(graph)
    with tf.Graph().as_default(), pytest.raises((ValueError, tf.errors.NotFoundError), match="NoSuchOpAnywhere"):
        tf.graph_util.import_graph_def(graph, name="")


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
        .cache()
        .map(lambda n: tf.strings.split(tf.strings.as_string(n)))  # ragged
        .batch(2)
        .prefetch(1)
    )
    policy.check(graph_of(dataset))


def test_pipelines_of_each_kind_pass():
    """Pipelines as trainers write them: vocabulary tables, images, parsing, random augmentation,
    loops inside maps, sparse and ragged batching, windows, scans and sampling."""
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(["a", "b"], [1, 2]), -1)
    image = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8))
    example = tf.train.Example(
        features=tf.train.Features(feature={"x": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))})
    ).SerializeToString()
    pipelines = [
        tf.data.Dataset.from_tensor_slices(["a", "c"]).map(table.lookup),
        tf.data.Dataset.from_tensors(image)
        .repeat(3)
        .map(lambda png: tf.image.resize(tf.io.decode_png(png), [2, 2]))
        .map(lambda img: tf.image.stateless_random_flip_left_right(img, seed=[1, 2])),
        tf.data.Dataset.from_tensors(example).map(
            lambda e: tf.io.parse_single_example(e, {"x": tf.io.FixedLenFeature([1], tf.int64)})
        ),
        tf.data.Dataset.range(4).map(lambda x: tf.map_fn(lambda y: y * 2, tf.range(x))),
        tf.data.Dataset.range(4).map(lambda x: x + tf.random.uniform([], maxval=3, dtype=tf.int64)),
        tf.data.Dataset.range(6).map(lambda x: tf.sparse.from_dense(tf.reshape(x, [1]))).batch(2),
        tf.data.Dataset.range(6).map(lambda x: tf.range(x)).ragged_batch(2),
        tf.data.Dataset.range(6).window(2).flat_map(lambda w: w.batch(2)),
        tf.data.Dataset.range(6).scan(tf.constant(0, tf.int64), lambda s, x: (s + x, s)),
        tf.data.Dataset.sample_from_datasets([tf.data.Dataset.range(3), tf.data.Dataset.range(3)], seed=1),
        tf.data.Dataset.range(6).shuffle(6).group_by_window(lambda x: x % 2, lambda k, w: w.batch(2), 2),
    ]
    for dataset in pipelines:
        policy.check(graph_of(dataset))
