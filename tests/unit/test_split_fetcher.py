"""A distributed_epoch task's ranges of splits (worker/split_fetcher.py): their size follows how
fast this worker's pipeline went through the dataset's earlier ranges, within the dispatcher's
fair share. The fetcher asks a real DispatcherCore, through the request its gRPC stub would send."""

from __future__ import annotations

import time

import tensorflow as tf
from dispatcher_helpers import DYNAMIC, FakeClock, RecordingNotifier, heartbeat, make_core, register, start_iteration
from dispatcher_helpers import tasks_by_worker as tasks_of

from dataservice.pipeline import graph as graph_lib
from dataservice.pipeline import splits
from dataservice.rpc.dispatcher_client import splits_request
from dataservice.worker import split_fetcher
from dataservice.worker.split_fetcher import SplitFetcher, SplitRate


class _CoreTransport:
    """DispatcherClient.get_splits's request, handed to the core without a socket."""

    def __init__(self, core) -> None:
        self.core = core
        self.asked: list[int] = []

    def get_splits(self, iteration_id, task_id, split_group, repetition, index, max_splits=0):
        self.asked.append(max_splits)
        return self.core.get_splits(splits_request(iteration_id, task_id, split_group, repetition, index, max_splits))


def test_a_range_holds_about_range_seconds_of_work_at_the_measured_rate():
    rate = SplitRate()
    assert rate.range_splits() == 0, "unmeasured: the dispatcher's default"
    rate.record(1000, 0.01)  # 10 us a split
    assert rate.range_splits() == round(split_fetcher.RANGE_SECONDS / 1e-5)
    slow = SplitRate()
    slow.record(1, 2.0)  # a file that takes 2 s
    assert slow.range_splits() == 1
    fast = SplitRate()
    fast.record(10**9, 1.0)
    assert fast.range_splits() == split_fetcher.MAX_RANGE_SPLITS


def test_one_slow_range_does_not_shrink_the_next_ones():
    rate = SplitRate()
    for _ in range(SplitRate.WINDOW - 1):
        rate.record(1000, 0.01)
    rate.record(10, 0.5)  # the pipeline stood still (its consumer held back), not slow splits
    assert rate.range_splits() == round(split_fetcher.RANGE_SECONDS / 1e-5)


def test_a_task_asks_for_ranges_sized_by_how_fast_the_ones_before_went():
    core = make_core(FakeClock(), RecordingNotifier())
    heartbeat(core, "w1:1")
    dataset = tf.data.Dataset.range(10**7)
    iteration = start_iteration(core, register(core, dataset), DYNAMIC)
    task_id = next(iter(tasks_of(core, iteration.iteration_client_id).values()))
    source = splits.find_sources(graph_lib.parse_graph(graph_lib.serialize_dataset(dataset)))[0]
    transport = _CoreTransport(core)
    fetcher = SplitFetcher(transport, iteration.iteration_id, task_id, [source], SplitRate())
    ranges = fetcher.ranges(source)
    # Range i is handed out once range i + 1 is fetched (asking for it says i started).
    assert next(ranges) == (0, 1024), "nothing measured yet: the dispatcher's default"
    time.sleep(0.05)  # the pipeline takes 50 ms over the first range: about 49 us a split
    assert next(ranges) == (1024, 2048)
    third = next(ranges)  # asked for when the second was handed out: the first range measured
    size = third[1] - third[0]
    # About RANGE_SECONDS' worth (the sleep overshoots a little): some 2,000 splits.
    assert 1024 < size <= round(split_fetcher.RANGE_SECONDS / (0.05 / 1024)), size
    assert transport.asked[:2] == [0, 0] and transport.asked[2] == size
    core.validate()
