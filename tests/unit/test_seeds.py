"""pipeline/seeds.py: each task's copy of a seeded pipeline shuffles as a function of its repetition."""

import tensorflow as tf

from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import seeds


def _order(graph_bytes: bytes, element_spec) -> list:
    return [int(x) for x in graph_lib.dataset_from_graph(graph_bytes, element_spec)]


def test_copies_of_one_repetition_shuffle_alike_and_repetitions_differ():
    source = tf.data.Dataset.range(300).shuffle(100, seed=5)
    graph = graph_lib.serialize_dataset(source)
    assert seeds.has_seed_generators(graph_lib.parse_graph(graph))
    first = _order(seeds.reseed(graph, "a", 0), source.element_spec)
    # Another copy, after other copies drew from their generators: the same order.
    _order(seeds.reseed(graph, "b", 0), source.element_spec)
    assert _order(seeds.reseed(graph, "c", 0), source.element_spec) == first
    # Epoch 0 is the order of a local first pass.
    assert first == [int(x) for x in source]
    second = _order(seeds.reseed(graph, "d", 1), source.element_spec)
    assert sorted(second) == sorted(first) and second != first
    assert _order(seeds.reseed(graph, "e", 1), source.element_spec) == second


def test_a_shuffle_that_does_not_reshuffle_keeps_its_order_in_every_epoch():
    source = tf.data.Dataset.range(100).shuffle(100, seed=5, reshuffle_each_iteration=False)
    graph = graph_lib.serialize_dataset(source)
    assert _order(seeds.reseed(graph, "a", 0), source.element_spec) == _order(
        seeds.reseed(graph, "b", 3), source.element_spec
    )


def test_unseeded_shuffles_stay_random_and_plain_pipelines_are_untouched():
    source = tf.data.Dataset.range(200).shuffle(200)
    graph = graph_lib.serialize_dataset(source)
    orders = {tuple(_order(seeds.reseed(graph, name, 1), source.element_spec)) for name in "abc"}
    assert len(orders) == 3
    plain = graph_lib.serialize_dataset(tf.data.Dataset.range(10).map(lambda x: x + 1))
    assert not seeds.has_seed_generators(graph_lib.parse_graph(plain))
    assert _order(seeds.reseed(plain, "a", 4), tf.TensorSpec([], tf.int64)) == list(range(1, 11))
