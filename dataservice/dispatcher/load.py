"""How loaded each job is, and how many workers would keep its clients from waiting.

Clients report in their heartbeats, as totals, the elements they were handed, the
seconds they waited for data and the seconds their consumer spent on what it was
handed (its own pace); workers report per task the elements their pipeline produced
and the seconds it spent producing them. From the last WINDOW_S seconds of these
reports the tracker computes, per job:

- each client's consumption rate, the elements per second it would take if it never
  waited: elements / consume seconds (TensorFlow's "target processing time");
- each worker's throughput: elements / processing seconds of its tasks of the job;
- the recommended number of workers, as TensorFlow's auto_scaler.cc computes it: the
  sum of the consumption rates over the mean worker throughput, rounded up, after
  replacing rates more than one standard deviation from the mean by the median.

Nothing here is journaled: after a restart the rates are measured anew. The clock is
passed in, so the arithmetic is unit-tested without sleeping.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Iterable

# Rates are measured over the reports of the last seconds.
WINDOW_S = 10.0
# A client that waits nearly all the time hides its consumer's pace when its pipeline has a
# prefetch after distribute(): the next element is asked for at once, by a background thread.
# It is taken to have spent at least this share of the window on its elements, which bounds
# the estimate of its rate to 1/share times the rate it receives: an upper bound while it
# starves, exact once enough workers run that it stops waiting.
MIN_CONSUME_SHARE = 0.1
# Rates further than this many standard deviations from the mean count as the median.
OUTLIER_SIGMAS = 1.0
# The elements/s history: buckets of this many seconds, this many kept.
HISTORY_BUCKET_S = 5.0
HISTORY_BUCKETS = 120


@dataclasses.dataclass(frozen=True)
class _Report:
    time: float
    elements: int
    nbytes: int
    # Clients: seconds waited; workers: seconds producing.
    seconds_a: float
    # Clients: seconds consuming; workers: unused.
    seconds_b: float


class _Series:
    """A peer's cumulative reports over the last WINDOW_S seconds (and one older, as the base)."""

    def __init__(self) -> None:
        self._reports: collections.deque[_Report] = collections.deque()

    @property
    def latest(self) -> _Report | None:
        return self._reports[-1] if self._reports else None

    def add(self, report: _Report) -> tuple[int, int, float]:
        """Records a report; returns what it adds to the previous one (elements, bytes,
        seconds_a), never negative: a peer whose totals went down restarted its count."""
        previous = self.latest
        if previous is not None and (report.elements < previous.elements or report.seconds_a < previous.seconds_a):
            self._reports.clear()
            previous = None
        self._reports.append(report)
        while len(self._reports) > 2 and report.time - self._reports[1].time >= WINDOW_S:
            self._reports.popleft()
        if previous is None:
            return report.elements, report.nbytes, report.seconds_a
        return (
            report.elements - previous.elements,
            max(0, report.nbytes - previous.nbytes),
            report.seconds_a - previous.seconds_a,
        )

    def window(self, now: float) -> tuple[float, int, float, float] | None:
        """(seconds, elements, seconds_a, seconds_b) between the oldest and newest report of the
        window; None without two reports or when the newest is older than the window."""
        if len(self._reports) < 2 or now - self._reports[-1].time > WINDOW_S:
            return None
        first, last = self._reports[0], self._reports[-1]
        return (
            last.time - first.time,
            last.elements - first.elements,
            last.seconds_a - first.seconds_a,
            last.seconds_b - first.seconds_b,
        )


@dataclasses.dataclass
class JobLoad:
    """A job's load as measured over the last WINDOW_S seconds, and its totals."""

    job_id: int
    # Elements per second each client would take if it never waited.
    consumption_rates: dict[int, float]
    # Elements per second of pipeline time, per worker address.
    worker_throughputs: dict[str, float]
    # Share of the window the clients waited for data (mean over clients), None if unknown.
    wait_fraction: float | None
    # Elements per second the clients received.
    received_rate: float
    # TensorFlow's auto_scaler estimate; None until both clients and workers have reported.
    recommended_workers: int | None
    # Totals since the dispatcher started (counters): clients' elements, bytes and wait.
    elements_received: int
    bytes_received: int
    wait_seconds: float


def _without_outliers(rates: Iterable[float]) -> list[float]:
    """TensorFlow's ReplaceOutliers: a rate further than OUTLIER_SIGMAS standard deviations
    from the mean counts as the median."""
    values = list(rates)
    if len(values) < 2:
        return values
    mean = statistics.fmean(values)
    deviation = statistics.stdev(values)
    median = sorted(values)[len(values) // 2]
    return [v if abs(v - mean) <= deviation * OUTLIER_SIGMAS else median for v in values]


def recommended_workers(consumption_rates: Iterable[float], worker_throughputs: Iterable[float]) -> int | None:
    """ceil(sum of consumption rates / mean worker throughput), at least 1; None without rates."""
    consumption = _without_outliers(consumption_rates)
    throughputs = _without_outliers(worker_throughputs)
    if not consumption or not throughputs:
        return None
    mean_throughput = sum(throughputs) / len(throughputs)
    if mean_throughput <= 0:
        return None
    return max(1, math.ceil(sum(consumption) / mean_throughput - 1e-9))


class LoadTracker:
    """Clients' and workers' reports, by job. Not thread-safe: the dispatcher core calls it
    under its lock."""

    def __init__(self) -> None:
        # job -> client -> reports; job -> (worker, task) -> reports
        self._clients: dict[int, dict[int, _Series]] = collections.defaultdict(dict)
        self._tasks: dict[int, dict[tuple[str, int], _Series]] = collections.defaultdict(dict)
        self._client_job: dict[int, int] = {}
        # job -> [elements, bytes, wait seconds] received by its clients, released ones included.
        self._totals: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
        # bucket index -> elements received by all clients in it
        self._history: dict[int, int] = {}

    def report_client(
        self,
        job_id: int,
        client_id: int,
        now: float,
        elements: int,
        nbytes: int,
        wait_s: float,
        consume_s: float,
    ) -> None:
        series = self._clients[job_id].setdefault(client_id, _Series())
        self._client_job[client_id] = job_id
        added, added_bytes, added_wait = series.add(_Report(now, elements, nbytes, wait_s, consume_s))
        totals = self._totals[job_id]
        totals[0] += added
        totals[1] += added_bytes
        totals[2] += added_wait
        if added:
            bucket = int(now // HISTORY_BUCKET_S)
            self._history[bucket] = self._history.get(bucket, 0) + added
            for old in [b for b in self._history if b <= bucket - HISTORY_BUCKETS]:
                del self._history[old]

    def report_task(
        self, job_id: int, worker: str, task_id: int, now: float, elements: int, nbytes: int, processing_s: float
    ) -> None:
        self._tasks[job_id].setdefault((worker, task_id), _Series()).add(
            _Report(now, elements, nbytes, processing_s, 0.0)
        )

    def forget_client(self, client_id: int) -> None:
        job_id = self._client_job.pop(client_id, None)
        if job_id is not None:
            self._clients[job_id].pop(client_id, None)

    def forget_worker(self, worker: str) -> None:
        for tasks in self._tasks.values():
            for key in [k for k in tasks if k[0] == worker]:
                del tasks[key]

    def forget_job(self, job_id: int) -> None:
        """Everything about a job that is gone (dropped by retention): its rates and totals, and
        with them its metric series."""
        for client_id in list(self._clients.pop(job_id, {})):
            self._client_job.pop(client_id, None)
        self._tasks.pop(job_id, None)
        self._totals.pop(job_id, None)

    def seconds_per_element(self, job_id: int) -> float | None:
        """The job's pipeline time per element over what its tasks reported (None before any
        element): new tasks of the job size their chunks by it (worker/chunk_iterator.py)."""
        elements, seconds = 0, 0.0
        for series in self._tasks.get(job_id, {}).values():
            latest = series.latest
            if latest is not None:
                elements += latest.elements
                seconds += latest.seconds_a
        return seconds / elements if elements else None

    def load(self, job_id: int, now: float) -> JobLoad:
        consumption: dict[int, float] = {}
        waits: list[float] = []
        received = 0.0
        for client_id, series in self._clients.get(job_id, {}).items():
            window = series.window(now)
            if window is None or window[0] <= 0:
                continue
            seconds, elements, wait_s, consume_s = window
            waits.append(min(1.0, max(0.0, wait_s / seconds)))
            received += elements / seconds
            if elements > 0:
                consumption[client_id] = elements / max(consume_s, MIN_CONSUME_SHARE * seconds)
        elements_by_worker: dict[str, float] = collections.defaultdict(float)
        seconds_by_worker: dict[str, float] = collections.defaultdict(float)
        for (worker, _), series in self._tasks.get(job_id, {}).items():
            window = series.window(now)
            if window is not None and window[2] > 0:
                elements_by_worker[worker] += window[1]
                seconds_by_worker[worker] += window[2]
        throughputs = {w: elements_by_worker[w] / seconds_by_worker[w] for w in elements_by_worker}
        total_elements, nbytes, wait_total = self._totals.get(job_id, (0, 0, 0.0))
        return JobLoad(
            job_id=job_id,
            consumption_rates=consumption,
            worker_throughputs=throughputs,
            wait_fraction=statistics.fmean(waits) if waits else None,
            received_rate=received,
            recommended_workers=recommended_workers(consumption.values(), throughputs.values()),
            elements_received=int(total_elements),
            bytes_received=int(nbytes),
            wait_seconds=float(wait_total),
        )

    def client_window(self, client_id: int, now: float) -> tuple[float, int, float, float] | None:
        job_id = self._client_job.get(client_id)
        series = self._clients.get(job_id, {}).get(client_id) if job_id is not None else None
        return series.window(now) if series is not None else None

    def client_totals(self, client_id: int) -> tuple[int, float]:
        """(elements, wait seconds) the client last reported."""
        job_id = self._client_job.get(client_id)
        series = self._clients.get(job_id, {}).get(client_id) if job_id is not None else None
        latest = series.latest if series is not None else None
        return (latest.elements, latest.seconds_a) if latest is not None else (0, 0.0)

    def history(self, now: float) -> list[tuple[float, float]]:
        """(bucket start, elements/s received by all clients) for the last HISTORY_BUCKETS buckets,
        oldest first; the current, partial bucket is left out."""
        current = int(now // HISTORY_BUCKET_S)
        return [
            (b * HISTORY_BUCKET_S, self._history.get(b, 0) / HISTORY_BUCKET_S)
            for b in range(current - HISTORY_BUCKETS, current)
        ]
