"""Reseeding a pipeline's reshuffling ops per task, so that a task's element order is a function
of its input and its epoch alone.

A seeded `shuffle` (and `Dataset.random`) serializes with a seed-generator
resource that has a fixed name: every copy of the graph imported into one
process shares that generator, and each new iterator of any copy draws the
next seeds from it. On a worker, a task's shuffle order would then depend on
how many tasks of the dataset the process ran before it, and a task that
replays another (a restored iterator, dispatcher/resume.py) would shuffle
differently from the task it replays.

So each task's copy of the graph gets generators of its own (a fresh
generator starts from the op's seeds, as the first iteration over a local
dataset does), and where the op reshuffles each iteration, its seeds are
mixed with the iteration's repetition: epoch r of a job shuffles the same way
on every worker and in every replay, and differently from epoch r + 1, as
iterating a local dataset again does. Unseeded ops (seed and seed2 both 0)
stay random. Ops inside functions (an interleave's map function) are not
rewritten.
"""

from __future__ import annotations

from typing import NamedTuple

from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2


class _SeededOp(NamedTuple):
    seed: int  # input positions
    seed2: int
    generator: int
    reseed_attr: str  # the attr that says whether each iteration draws new seeds


SEEDED_OPS: dict[str, _SeededOp] = {
    "ShuffleDatasetV3": _SeededOp(2, 3, 4, "reshuffle_each_iteration"),
    "ShuffleAndRepeatDatasetV2": _SeededOp(2, 3, 5, "reshuffle_each_iteration"),
    "RandomDatasetV2": _SeededOp(0, 1, 2, "rerandomize_each_iteration"),
}
# Mixes the repetition into seed2 (an odd 63-bit constant: distinct repetitions, distinct seeds).
_MIX = 0x5851F42D4C957F2D


def _node_name(input_name: str) -> str:
    return input_name.lstrip("^").split(":")[0]


def has_seed_generators(graph: graph_pb2.GraphDef) -> bool:
    return any(node.op in SEEDED_OPS for node in graph.node)


def reseed(graph_bytes: bytes, instance: str, repetition: int) -> bytes:
    """The graph with generators of its own (their names suffixed with `instance`, which must be
    unique in the process) and, for reshuffling ops, seeds mixed with `repetition`."""
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(graph_bytes)
    nodes = {node.name: node for node in graph.node}
    added = []
    for node in list(graph.node):
        op = SEEDED_OPS.get(node.op)
        if op is None or len(node.input) <= op.generator:
            continue
        generator = nodes.get(_node_name(node.input[op.generator]))
        if generator is not None and generator.op == "Const":
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(generator)
            copy.name = f"{generator.name}/{instance}/{node.name}"
            handle = copy.attr["value"].tensor.resource_handle_val
            for h in handle:
                h.name = f"{h.name}/{instance}"
            added.append(copy)
            node.input[op.generator] = copy.name
        seed, seed2 = (_int_const(nodes.get(_node_name(node.input[i]))) for i in (op.seed, op.seed2))
        reshuffles = node.attr[op.reseed_attr].b if op.reseed_attr in node.attr else False
        if repetition and reshuffles and seed is not None and seed2 is not None and (seed or seed2):
            mixed = node_def_pb2.NodeDef(name=f"{node.name}/seed2/{instance}", op="Const")
            mixed.attr["dtype"].type = types_pb2.DT_INT64
            value = mixed.attr["value"].tensor
            value.dtype = types_pb2.DT_INT64
            value.int64_val.append(_mix(seed2, repetition))
            added.append(mixed)
            node.input[op.seed2] = mixed.name
    graph.node.extend(added)
    return graph.SerializeToString()


def _int_const(node) -> int | None:
    if node is None or node.op != "Const":
        return None
    tensor = node.attr["value"].tensor
    return int(tensor.int64_val[0]) if tensor.int64_val else None


def _mix(seed2: int, repetition: int) -> int:
    value = (seed2 + repetition * _MIX) % (1 << 63)
    return value or 1
