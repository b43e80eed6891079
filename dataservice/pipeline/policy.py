"""The dataset policy: a pipeline may produce elements and nothing else.

A dataset graph is code that the workers run, sent by any client holding the
token. The policy is an allowlist: an op runs only if a rule allows it, so an op
that a new TensorFlow version adds is refused until someone looks at it. The
dispatcher checks a graph when it is registered and a worker before it builds a
pipeline (defence in depth: a worker may serve a dispatcher configured
otherwise); a refusal is PERMISSION_DENIED naming the op and the function it
sits in. `allow_unsafe_ops` turns the policy off.

The rules work over TensorFlow's op registry by op library: every op with a
Python wrapper belongs to one `gen_*_ops` module (math, array, string, parsing,
image, dataset...), which says what kind of op it is without a hand-written
list of some 1,900 names. A library is allowed whole, refused whole, or allowed
but for ops named with the reason (`Abort` among the control-flow ops, the file
writers among the io ops). Ops without a Python wrapper (internal, test and
rewritten ops) are refused. A few allowed ops are allowed only with safe
arguments: `cache` only in memory, `tf.print` not to a file, proto decoding
only with descriptors from the binary or the graph.

Reading files (`ReadFile`, `TFRecordDataset`, `list_files`) is allowed: it is
what input pipelines are for. Which files a worker's pipelines may read is the
file sandbox's job (`data_roots`, worker/sandbox.py), not this module's.
tests/unit/test_policy.py lists every registered op with its verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import re
import sys
from collections.abc import Iterator

from tensorflow.core.framework import graph_pb2, node_def_pb2

from dataservice import tf_internal

# What each op library is, and whether its ops may run in a pipeline. A library
# missing here is refused ("not reviewed"), so a new library starts refused.
ALLOWED_LIBRARIES: dict[str, str] = {
    "array_ops": "array manipulation",
    "audio_ops": "audio decoding",
    "bitwise_ops": "bitwise math",
    "candidate_sampling_ops": "sampling",
    "clustering_ops": "clustering math",
    "composite_tensor_ops": "composite tensors",
    "control_flow_ops": "control flow",
    "count_ops": "counting",
    "ctc_ops": "sequence math",
    "data_flow_ops": "tensor arrays and stitching",
    "dataset_ops": "dataset transformations and readers",
    "decode_proto_ops": "proto decoding",
    "encode_proto_ops": "proto encoding",
    "experimental_dataset_ops": "dataset transformations and readers",
    "functional_ops": "function calls and control flow",
    "image_ops": "image decoding and processing",
    "io_ops": "reading files",
    "linalg_ops": "linear algebra",
    "list_ops": "tensor lists",
    "logging_ops": "assertions and printing",
    "lookup_ops": "lookup tables",
    "manip_ops": "array manipulation",
    "map_ops": "tensor maps",
    "math_ops": "math",
    "nn_ops": "neural-network math",
    "optional_ops": "optionals",
    "parsing_ops": "parsing",
    "ragged_array_ops": "ragged tensors",
    "ragged_conversion_ops": "ragged tensors",
    "ragged_math_ops": "ragged tensors",
    "random_index_shuffle_ops": "random permutations",
    "random_ops": "random numbers",
    "rnn_ops": "recurrent-network math",
    "set_ops": "set math",
    "sparse_csr_matrix_ops": "sparse matrices",
    "sparse_ops": "sparse tensors",
    "special_math_ops": "math",
    "spectral_ops": "spectral math",
    "stateless_random_ops": "random numbers",
    "stateless_random_ops_v2": "random numbers",
    "string_ops": "strings",
    "uniform_quant_ops": "quantized math",
}
REFUSED_LIBRARIES: dict[str, str] = {
    "batch_ops": "batches work across sessions of the worker process",
    "boosted_trees_ops": "trains models in shared resources",
    "checkpoint_ops": "reads checkpoints and vocabulary files",
    "collective_ops": "communicates with other processes",
    "cudnn_rnn_ops": "runs on accelerators",
    "debug_ops": "dumps tensors for debugging",
    "filesystem_ops": "changes file-system settings",
    "nccl_ops": "communicates with other devices",
    "resource_variable_ops": "reads or changes variables of the worker process",
    "script_ops": "runs Python code of the client's process",
    "sdca_ops": "trains models",
    "sendrecv_ops": "communicates with other processes",
    "state_ops": "reads or changes variables of the worker process",
    "stateful_random_ops": "changes random-generator variables of the worker process",
    "summary_ops": "writes summaries to files",
    "sync_ops": "synchronizes devices",
    "tpu_ops": "runs on accelerators",
    "tpu_partition_ops": "runs on accelerators",
    "user_ops": "is a sample op",
    "xla_ops": "runs on accelerators",
}

_WRITES = "writes files"
_OTHER_SERVERS = "connects to other servers"
_READS_SAVED = "reads saved datasets or checkpoints"
# Ops refused inside an allowed library: (library, pattern over op names, what such an op does).
REFUSED_IN_ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("array_ops", r"^ImmutableConst$", "maps a file of the worker into memory"),
    ("control_flow_ops", r"^Abort$", "terminates the worker process"),
    ("functional_ops", r"^RemoteCall$", "runs a function on another device or process"),
    ("io_ops", r"^(WriteFile|Save|SaveV\d+|SaveSlices|MergeV\d+Checkpoints)$", _WRITES),
    ("io_ops", r"^Restore", _READS_SAVED),
    ("io_ops", r"Reader", "reads files through queue-based readers of the worker process"),
    ("lookup_ops", r"^InitializeTableFromTextFile", "reads a table from a file"),
    (
        "data_flow_ops",
        r"Queue|^Barrier|Accumulator|Stage|^Unstage$|^(Ordered)?Map[A-Z]|SessionHandle|SessionTensor|^RecordInput$",
        "shares state across sessions of the worker process",
    ),
    ("dataset_ops|experimental_dataset_ops", r"DataServiceDataset|^RegisterDataset", _OTHER_SERVERS),
    (
        "dataset_ops|experimental_dataset_ops",
        r"^(SaveDataset(V\d+)?|DistributedSave|SnapshotDataset(V\d+)?|(Experimental)?DatasetToTFRecord)$",
        "writes a dataset to disk",
    ),
    (
        "dataset_ops|experimental_dataset_ops",
        r"^(LoadDataset|ListSnapshotChunksDataset|SnapshotChunkDataset|SnapshotNestedDataset|Snapshot\w*Reader)$",
        _READS_SAVED,
    ),
    ("dataset_ops|experimental_dataset_ops", r"SqlDataset$", "reads an SQL database"),
    ("dataset_ops|experimental_dataset_ops", r"SummaryWriter", "writes summaries to files"),
    (
        "dataset_ops|experimental_dataset_ops",
        r"^DatasetFromGraph$",
        "builds a pipeline from a graph at run time, out of the policy's sight",
    ),
    (
        "dataset_ops|experimental_dataset_ops",
        r"^(Iterator|IteratorV2|IteratorFromStringHandle(V2)?|DeserializeIterator)$|MultiDeviceIterator",
        "reaches iterators of the worker process by name or handle",
    ),
)
# The verdict table someone reviewed for the pinned TensorFlow version, beside this module; regenerate it
# with `python -m dataservice.pipeline.policy > dataservice/pipeline/op_verdicts.tsv` and read the diff.
REVIEWED_TABLE = "op_verdicts.tsv"
# Graph plumbing that has no Python wrapper.
_PLUMBING = {"_Arg": "function arguments", "_Retval": "function results"}

# PrintV2's output_stream: "stderr", "stdout", "log(info)"...; "file://PATH" appends to a file.
_PRINT_TO_FILE = "file://"
# DecodeProtoV2/EncodeProto descriptor_source: "local://" (the binary's own) or "bytes://..." (inline);
# anything else is a file path the worker would read.
_SAFE_DESCRIPTOR_SOURCES = ("local://", "bytes://")
_CACHE_OPS = {"CacheDataset", "CacheDatasetV2"}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the policy says of one op: allowed or not, and why in words."""

    allowed: bool
    reason: str  # the kind of op when allowed ("math"); what it does when refused

    def __str__(self) -> str:
        return f"{'allowed' if self.allowed else 'refused'}: {self.reason}"


class UnsafeDatasetError(ValueError):
    """The pipeline contains an op the policy refuses; the message names it and where it is."""

    def __init__(self, op: str, node: str, function: str | None, reason: str):
        where = (
            f"in function {function!r} (a map, filter, interleave or other function)" if function else "in the graph"
        )
        super().__init__(
            f"the dataset is refused by the dataset policy: its op {op} (node {node!r}) {where} {reason}. "
            "A dataset served by dataservice may only produce elements; move this step out of the pipeline, or "
            "start the dispatcher and the workers with allow_unsafe_ops=True (--allow_unsafe_ops) if every client "
            "of the cluster is trusted"
        )
        self.op = op
        self.function = function


def _verdict(library: str | None, op: str) -> Verdict:
    if library is None:
        return Verdict(False, "is not an op a pipeline may use (no public wrapper: internal, test or rewritten)")
    if library in REFUSED_LIBRARIES:
        return Verdict(False, REFUSED_LIBRARIES[library])
    if library not in ALLOWED_LIBRARIES:
        return Verdict(False, f"comes from the op library {library}, which the policy has not reviewed")
    for libraries, pattern, reason in REFUSED_IN_ALLOWED:
        if library in libraries.split("|") and re.search(pattern, op):
            return Verdict(False, reason)
    return Verdict(True, ALLOWED_LIBRARIES[library])


def rule_verdicts() -> dict[str, Verdict]:
    """The rules' verdict on every op registered in this process (what the reviewed table must say)."""
    table = {op: _verdict(tf_internal.op_library(op), op) for op in tf_internal.registered_op_names()}
    table.update({op: Verdict(True, kind) for op, kind in _PLUMBING.items()})
    return table


def format_table(table: dict[str, Verdict]) -> str:
    """The verdict table as text: one op a line, "op<TAB>allowed|refused<TAB>reason", sorted by op."""
    lines = (f"{op}\t{'allowed' if v.allowed else 'refused'}\t{v.reason}\n" for op, v in sorted(table.items()))
    return "".join(lines)


def reviewed_allowed_ops() -> frozenset[str]:
    """The ops the reviewed table (REVIEWED_TABLE, package data) allows."""
    text = importlib.resources.files(__package__).joinpath(REVIEWED_TABLE).read_text(encoding="utf-8")
    return frozenset(line.split("\t", 1)[0] for line in text.splitlines() if line.split("\t")[1:2] == ["allowed"])


@functools.lru_cache(maxsize=1)
def verdicts() -> dict[str, Verdict]:
    """The policy's verdict on every op registered in this process: what the rules say, and an op the
    rules allow but the reviewed table does not list (one a newer TensorFlow added) is refused."""
    return combine(rule_verdicts(), reviewed_allowed_ops())


def combine(rules: dict[str, Verdict], reviewed_allowed: frozenset[str]) -> dict[str, Verdict]:
    """The rules' verdicts, with every op they allow that `reviewed_allowed` does not list refused."""
    unreviewed = Verdict(False, f"is not in the reviewed op table {REVIEWED_TABLE} (new in this TensorFlow?)")
    return {op: v if not v.allowed or op in reviewed_allowed else unreviewed for op, v in rules.items()}


def unsafe_ops() -> dict[str, str]:
    """Every registered op the policy refuses, with what it does."""
    return {op: verdict.reason for op, verdict in verdicts().items() if not verdict.allowed}


def _scopes(graph: graph_pb2.GraphDef) -> Iterator[tuple[list[node_def_pb2.NodeDef], str | None]]:
    yield list(graph.node), None
    for function in graph.library.function:
        yield list(function.node_def), function.signature.name


def _const_string(nodes: dict[str, node_def_pb2.NodeDef], reference: str) -> bytes | None:
    """The value of the string constant `reference` names in its scope ("name", "name:0" in a graph,
    "name:output:0" in a function), or None when it is not a scalar string constant."""
    node = nodes.get(reference.lstrip("^").split(":")[0])
    if node is None or node.op != "Const":
        return None
    tensor = node.attr["value"].tensor
    if tensor.tensor_shape.dim or len(tensor.string_val) != 1:
        return None
    return tensor.string_val[0]


def _argument_reason(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef]) -> str | None:
    """Why an allowed op is refused with these arguments, or None when they are safe."""
    if node.op == "PrintV2" and "output_stream" in node.attr:
        stream = node.attr["output_stream"].s.decode(errors="replace")
        if stream.startswith(_PRINT_TO_FILE):
            return f"prints to the file {stream[len(_PRINT_TO_FILE) :]!r}"
    if node.op in ("DecodeProtoV2", "EncodeProto") and "descriptor_source" in node.attr:
        source = node.attr["descriptor_source"].s.decode(errors="replace")
        if not source.startswith(_SAFE_DESCRIPTOR_SOURCES):
            return f"reads proto descriptors from the file {source!r}"
    if node.op in _CACHE_OPS:
        filename = _const_string(nodes, node.input[1]) if len(node.input) > 1 else None
        if filename is None:
            return "caches to a file whose name is computed at run time"
        if filename:
            return f"caches to the file {filename.decode(errors='replace')!r} (only cache() in memory may run)"
    return None


def check(graph: graph_pb2.GraphDef) -> None:
    """Raises UnsafeDatasetError for the first op of `graph` (its library functions included,
    however nested) that the policy refuses."""
    table = verdicts()
    functions = {function.signature.name for function in graph.library.function}
    for nodes, function in _scopes(graph):
        by_name = {node.name: node for node in nodes}
        for node in nodes:
            if node.op in functions:  # a call of a function of the graph, which is checked itself
                continue
            verdict = table.get(node.op)
            if verdict is None:
                # Not an op of this TensorFlow: the graph does not import, which the caller reports
                # as a malformed graph (INVALID_ARGUMENT); it can never run.
                continue
            if not verdict.allowed:
                reason = verdict.reason
            else:
                reason = _argument_reason(node, by_name)
            if reason is not None:
                raise UnsafeDatasetError(node.op, node.name, function, reason)


if __name__ == "__main__":
    sys.stdout.write(format_table(rule_verdicts()))
