"""A task's supply of splits from the dispatcher, for distributed_epoch.

Each source of the pipeline asks for index ranges of its split group; a
range is fetched once and read by every source of the group (the inputs of
one zip), so zipped sources see the same indices. Each restart of a source
(a repeat() in the pipeline) reads the next repetition, which the dispatcher
hands out anew: repeat() inside the pipeline gives every split once per
repetition across all workers.

How many splits a range holds the task asks for (SplitRate): enough for
about RANGE_SECONDS of its pipeline's work at the rate measured on this
worker's earlier ranges of the dataset, so that a range's GetSplits round
trip (a journal append at the dispatcher) is a small part of producing it;
and a worker lost with a range started loses about that much work. The
dispatcher hands out at most a fair share of what is left (split_handout.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from dataservice import status
from dataservice.pipeline.splits import Source
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import dispatcher_pb2
from dataservice.worker.rates import MedianRate

_log = logging.getLogger(__name__)


# How long a range should take the pipeline to produce.
RANGE_SECONDS = 0.1
# The most splits a task asks for in one range.
MAX_RANGE_SPLITS = 1 << 20


class SplitRate(MedianRate):
    """How long a dataset's pipeline takes per split on this worker (rates.MedianRate over its
    ranges, each from being handed to the pipeline to the pipeline's asking for the next),
    shared by the dataset's tasks."""

    def range_splits(self) -> int:
        """The splits to ask for in a range: RANGE_SECONDS' worth, within [1, MAX_RANGE_SPLITS];
        0 (the dispatcher's default) before any range was measured."""
        seconds = self.measured()
        if seconds is None:
            return 0
        return max(1, min(MAX_RANGE_SPLITS, int(RANGE_SECONDS / max(seconds, 1e-9))))


class _GroupLog:
    """The ranges of one (group, repetition) fetched so far."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.ended = False
        # The dispatcher gave the task up (its worker was taken for lost): the last range fetched was
        # never confirmed started, and went back to the pool.
        self.lost = False
        self.fetching = False


class SplitFetcher:
    def __init__(
        self,
        dispatcher: DispatcherClient,
        iteration_id: int,
        task_id: int,
        sources: list[Source],
        rate: SplitRate | None = None,
    ):
        self._dispatcher = dispatcher
        self._rate = rate or SplitRate()
        self._iteration_id = iteration_id
        self._task_id = task_id
        self._cond = threading.Condition()
        self._logs: dict[tuple[int, int], _GroupLog] = {}
        self._repetitions: dict[str, int] = {s.node_name: -1 for s in sources}
        self._group_of = {s.node_name: s.group for s in sources}

    def ranges(self, source: Source) -> Iterator[tuple[int, int]]:
        """(begin, end) pairs for `source` (a splits.RangeSupply): a new repetition each call,
        each range yielded once the dispatcher knows it starts (see _range)."""
        with self._cond:
            repetition = self._repetitions[source.node_name] + 1
            self._repetitions[source.node_name] = repetition
            self._forget_passed(source.group)
        index = 0
        while True:
            split_range = self._range(source.group, repetition, index)
            if split_range is None:
                return
            handed = time.perf_counter()
            yield split_range
            # Asked for the next range: the pipeline is through this one.
            self._rate.record(split_range[1] - split_range[0], time.perf_counter() - handed)
            index += 1

    def _forget_passed(self, group: int) -> None:
        """Drops the ranges of repetitions that every source of the group has moved past."""
        oldest = min(r for name, r in self._repetitions.items() if self._group_of[name] == group)
        for key in [k for k in self._logs if k[0] == group and k[1] < oldest]:
            del self._logs[key]

    def _range(self, group: int, repetition: int, index: int) -> tuple[int, int] | None:
        """Range `index` of the group's repetition, once the dispatcher knows the task starts it.

        Asking the dispatcher for range index + 1 is what tells it that range
        `index` is starting; so a range is yielded only after that answer, and a
        range the dispatcher still counts as unstarted never produced an element.
        """
        with self._cond:
            group_log = self._logs.setdefault((group, repetition), _GroupLog())
            while not (group_log.ended or index + 1 < len(group_log.ranges)):
                if group_log.fetching:
                    self._cond.wait()
                    continue
                group_log.fetching = True
                wanted = len(group_log.ranges)
                self._cond.release()
                response = None
                try:
                    response = self._fetch(group, repetition, wanted)
                except status.OutOfRangeError as e:
                    _log.warning("task %d: %s", self._task_id, e.message)
                finally:
                    self._cond.acquire()
                    group_log.fetching = False
                    self._cond.notify_all()
                if response is None:
                    group_log.ended = group_log.lost = True
                elif response.end_of_splits:
                    group_log.ended = True
                else:
                    group_log.ranges.append((response.begin, response.end))
            confirmed = index + 1 < len(group_log.ranges) or (index < len(group_log.ranges) and not group_log.lost)
            return group_log.ranges[index] if confirmed else None

    def _fetch(self, group: int, repetition: int, index: int) -> dispatcher_pb2.GetSplitsResponse:
        return self._dispatcher.get_splits(
            self._iteration_id, self._task_id, group, repetition, index, self._rate.range_splits()
        )
