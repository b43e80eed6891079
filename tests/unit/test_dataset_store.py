"""The dispatcher's store of dataset graphs keeps what graphs hold of memory under
graph_memory_bytes: with a work_dir, as a cache of the files (least recently used dropped, read
back when needed); without one, as a cap that refuses a graph with RESOURCE_EXHAUSTED and loses
nothing registered before."""

import pytest
import tensorflow as tf
from dispatcher_helpers import FakeClock, RecordingNotifier, make_core, register

from dataservice import status
from dataservice.dispatcher.dataset_store import DatasetStore
from dataservice.pipeline import graph as graph_lib


def test_with_a_work_dir_memory_holds_the_graphs_used_last(tmp_path):
    store = DatasetStore(str(tmp_path), memory_bytes=100)
    store.put("a", b"a" * 60)
    store.put("b", b"b" * 60)
    assert store.bytes_in_memory == 60  # b; a is on disk only
    assert store.get("a") == b"a" * 60  # read back from its file...
    assert store.bytes_in_memory == 60  # ... and kept in b's place
    store.put("huge", b"h" * 150)  # larger than the cache: never held in memory
    assert store.get("huge") == b"h" * 150 and store.bytes_in_memory <= 100
    assert store.get("b") == b"b" * 60 and store.get("missing") is None
    # A restarted dispatcher reads them all from the work_dir.
    assert DatasetStore(str(tmp_path), memory_bytes=100).get("a") == b"a" * 60


def test_without_a_work_dir_a_graph_past_the_bound_is_refused_and_nothing_is_lost():
    store = DatasetStore(None, memory_bytes=100)
    store.put("a", b"a" * 60)
    with pytest.raises(status.ServiceError, match="past graph_memory_bytes \\(100\\)") as refused:
        store.put("b", b"b" * 60)
    assert refused.value.code == status.Code.RESOURCE_EXHAUSTED
    assert store.get("a") == b"a" * 60 and store.get("b") is None
    store.put("c", b"c" * 40)
    assert store.bytes_in_memory == 100


def test_the_dispatcher_refuses_a_registration_past_the_bound_without_journaling_it():
    graph_bytes = len(graph_lib.serialize_dataset(tf.data.Dataset.range(10)))
    small = make_core(FakeClock(), RecordingNotifier(), graph_memory_bytes=graph_bytes + 10)
    register(small, tf.data.Dataset.range(10))
    with pytest.raises(status.ServiceError, match="graph_memory_bytes") as refused:
        register(small, tf.data.Dataset.range(10).map(lambda x: x + 1))
    assert refused.value.code == status.Code.RESOURCE_EXHAUSTED
    assert small.summary()["datasets"] == 1
