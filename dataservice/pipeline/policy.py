"""The dataset policy: a pipeline may produce elements and nothing else.

A dataset graph is code that the workers run. Ops that write, delete or rename
files, write summaries, save datasets or checkpoints, dump tensors for debugging
or make remote calls act outside producing elements: a `tf.io.write_file` inside
a `map` writes any file on a worker. The dispatcher refuses such a graph when it
is registered and a worker before it builds a pipeline (defence in depth: a
worker may serve a dispatcher configured otherwise), with PERMISSION_DENIED
naming the op and the function it sits in; `allow_unsafe_ops` turns the policy
off.

The refused ops are found by rules over TensorFlow's op registry (every op this
process knows), not listed by hand, so that new versions of an op
(SaveDatasetV3, DebugIdentityV4) are refused too; tests/unit/test_policy.py
checks every rule still matches registered ops. PrintV2 is refused only when
it prints to a file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from tensorflow.core.framework import graph_pb2, node_def_pb2

from dataservice import tf_internal

# (pattern over op names, what such an op does)
RULES: tuple[tuple[str, str], ...] = (
    (r"^(WriteFile|Save|SaveV\d+|SaveSlices|MergeV\d+Checkpoints)$", "writes or replaces files"),
    (r"^(Experimental)?DatasetToTFRecord$", "writes a TFRecord file"),
    (r"^(SaveDataset(V\d+)?|DistributedSave|SnapshotDataset(V\d+)?)$", "writes a dataset to disk"),
    (r"SummaryWriter|^Write\w*Summary$|^ImportEvent$|^CreateSummary\w*Writer$", "writes summaries to files"),
    (r"^Debug(Identity|NanCount|NumericSummary)\w*$|^DumpTensor$", "dumps tensors for debugging"),
    (r"^Rpc", "makes remote procedure calls"),
)
# PrintV2's output_stream: "stderr", "stdout", "log(info)"...; "file://PATH" appends to a file.
_PRINT_TO_FILE = "file://"


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


@functools.lru_cache(maxsize=1)
def unsafe_ops() -> dict[str, str]:
    """Every registered op the policy refuses, with what it does."""
    rules = [(re.compile(pattern), reason) for pattern, reason in RULES]
    refused: dict[str, str] = {}
    for name in tf_internal.registered_op_names():
        for pattern, reason in rules:
            if pattern.search(name):
                refused[name] = reason
                break
    return refused


def _nodes(graph: graph_pb2.GraphDef) -> Iterator[tuple[node_def_pb2.NodeDef, str | None]]:
    for node in graph.node:
        yield node, None
    for function in graph.library.function:
        for node in function.node_def:
            yield node, function.signature.name


def check(graph: graph_pb2.GraphDef) -> None:
    """Raises UnsafeDatasetError for the first op of `graph` (its library functions included,
    however nested) that the policy refuses."""
    refused = unsafe_ops()
    for node, function in _nodes(graph):
        reason = refused.get(node.op)
        if reason is None and node.op == "PrintV2":
            stream = node.attr["output_stream"].s.decode(errors="replace") if "output_stream" in node.attr else ""
            if stream.startswith(_PRINT_TO_FILE):
                reason = f"prints to the file {stream[len(_PRINT_TO_FILE) :]!r}"
        if reason is not None:
            raise UnsafeDatasetError(node.op, node.name, function, reason)
