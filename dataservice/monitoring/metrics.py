"""Prometheus metrics of the dispatcher and the workers (prometheus_client).

Each server has its own CollectorRegistry, so several servers in one process (tests,
LocalCluster) export separately. What a server already counts (its state, its tasks'
production, its streams) is read when Prometheus scrapes, by a collector, rather than
counted twice; what happens in between (RPCs, journal appends) goes into histograms as it
happens. Names start with `dataservice_`, carry their unit, and counters end in `_total`
(README, section Operations, lists them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from dataservice.rpc import handlers

# RPCs range from tens of microseconds (heartbeats) to minutes (element streams).
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 120, 600)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)
SNAPSHOT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class RpcMetricsInterceptor(grpc.ServerInterceptor):
    """Times every RPC the server answers, by service, method and status code
    (`dataservice_rpc_duration_seconds`; its `_count` is the RPCs by method and code).
    A stream is timed to its end."""

    def __init__(self, registry: CollectorRegistry):
        self._histogram = Histogram(
            "dataservice_rpc_duration_seconds",
            "Time to answer an RPC (a stream: to its end), by service, method and gRPC status code",
            ["service", "method", "code"],
            registry=registry,
            buckets=RPC_BUCKETS,
        )

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        service = service.rpartition(".")[2]
        histogram = self._histogram

        def timed(behavior: Callable, client_streaming: bool, server_streaming: bool) -> Callable:
            return (_timed_stream if server_streaming else _timed_unary)(behavior, histogram, service, method)

        return handlers.rewrap(handler, timed)


def _code_name(context: grpc.ServicerContext, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


def _timed_unary(behavior: Callable, histogram: Histogram, service: str, method: str) -> Callable:
    def timed(request, context):
        started = time.perf_counter()
        failed = True
        try:
            response = behavior(request, context)
            failed = False
            return response
        finally:
            histogram.labels(service, method, _code_name(context, failed)).observe(time.perf_counter() - started)

    return timed


def _timed_stream(behavior: Callable, histogram: Histogram, service: str, method: str) -> Callable:
    def timed(request, context):
        started = time.perf_counter()
        failed = True
        try:
            yield from behavior(request, context)
            failed = False
        finally:
            histogram.labels(service, method, _code_name(context, failed)).observe(time.perf_counter() - started)

    return timed


class JournalMetrics:
    """The journal's appends (each durable: write and fdatasync) and snapshots; a
    journal.JournalObserver."""

    def __init__(self, registry: CollectorRegistry):
        self._append = Histogram(
            "dataservice_journal_append_duration_seconds",
            "Time to make one journal update durable (write and fdatasync)",
            registry=registry,
            buckets=FSYNC_BUCKETS,
        )
        self._appends = Counter(
            "dataservice_journal_appends", "Updates appended to the dispatcher's journal", registry=registry
        )
        self._snapshot = Histogram(
            "dataservice_journal_snapshot_duration_seconds",
            "Time to write a journal snapshot (in the background) and delete the files it replaces",
            registry=registry,
            buckets=SNAPSHOT_BUCKETS,
        )

    def appended(self, seconds: float) -> None:
        self._appends.inc()
        self._append.observe(seconds)

    def snapshotted(self, seconds: float) -> None:
        self._snapshot.observe(seconds)


def _gauge(name: str, doc: str, value: float | None = None, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=None if value is not None else list(labels))


class DispatcherCollector:
    """The dispatcher's state and its jobs' load, read from its status document at each scrape."""

    def __init__(self, status: Callable[[], dict[str, Any]]):
        self._status = status

    def collect(self) -> Iterator[Metric]:
        doc = self._status()
        workers = _gauge(
            "dataservice_dispatcher_workers", "Workers known to the dispatcher, by state", labels=["state"]
        )
        for state in ("alive", "lost"):
            workers.add_metric([state], sum(w["state"] == state for w in doc["workers"]))
        yield workers
        yield _gauge("dataservice_dispatcher_datasets", "Datasets registered", len(doc["datasets"]))
        yield _gauge("dataservice_dispatcher_jobs", "Jobs created", len(doc["jobs"]))
        iterations = _gauge("dataservice_dispatcher_iterations", "Iterations, by state", labels=["state"])
        tasks = _gauge("dataservice_dispatcher_tasks", "Tasks, by state", labels=["state"])
        all_iterations = [it for job in doc["jobs"] for it in job["iterations"]]
        iterations.add_metric(["active"], sum(not it["finished"] for it in all_iterations))
        iterations.add_metric(["finished"], sum(it["finished"] for it in all_iterations))
        active = sum(it["active_tasks"] for it in all_iterations if not it["finished"])
        lost = sum(it["lost_tasks"] for it in all_iterations)
        tasks.add_metric(["active"], active)
        tasks.add_metric(["lost"], lost)
        tasks.add_metric(["finished"], sum(it["tasks"] for it in all_iterations) - active - lost)
        yield iterations
        yield tasks
        yield _gauge("dataservice_dispatcher_clients", "Iteration clients reading now", len(doc["clients"]))
        yield from self._iteration_metrics(doc)
        yield from self._job_metrics(doc)

    @staticmethod
    def _iteration_metrics(doc: dict[str, Any]) -> Iterator[Metric]:
        labels = ["job_id", "job_name", "iteration_id"]
        handed = _gauge(
            "dataservice_iteration_splits_handed_out",
            "distributed_epoch: splits of the source handed to workers in the current epoch",
            labels=labels,
        )
        total = _gauge(
            "dataservice_iteration_splits", "distributed_epoch: splits of the source in one epoch", labels=labels
        )
        for job in doc["jobs"]:
            for it in job["iterations"]:
                if it["splits"] is not None and not it["finished"]:
                    values = [str(job["job_id"]), job["job_name"], str(it["iteration_id"])]
                    handed.add_metric(values, it["splits"]["handed_out"])
                    total.add_metric(values, it["splits"]["total"])
        yield handed
        yield total

    @staticmethod
    def _job_metrics(doc: dict[str, Any]) -> Iterator[Metric]:
        labels = ["job_id", "job_name"]
        families: list[tuple[str, str, str, bool]] = [
            # (document key, metric name, help, counter?)
            ("workers", "dataservice_job_workers", "Workers with an active task of the job", False),
            (
                "recommended_workers",
                "dataservice_job_recommended_workers",
                "Workers that would keep the job's clients from waiting (sum of the clients' consumption rates over "
                "the mean worker throughput, as TensorFlow's auto_scaler computes it)",
                False,
            ),
            (
                "missing_workers",
                "dataservice_job_missing_workers",
                "Recommended workers minus the workers serving the job (0 when there are enough)",
                False,
            ),
            (
                "wait_fraction",
                "dataservice_job_client_wait_ratio",
                "Share of the last seconds the job's clients spent waiting for data (mean over clients)",
                False,
            ),
            (
                "consumption_rate",
                "dataservice_job_client_consumption_rate_elements_per_second",
                "Elements per second the job's clients would take if they never waited",
                False,
            ),
            (
                "worker_throughput",
                "dataservice_job_worker_throughput_elements_per_second",
                "Elements per second of pipeline time, mean over the job's workers",
                False,
            ),
            (
                "elements_per_s",
                "dataservice_job_client_received_rate_elements_per_second",
                "Elements per second the job's clients received over the last seconds",
                False,
            ),
            (
                "elements_received",
                "dataservice_job_client_elements_received",
                "Elements the job's clients received (clients report them in heartbeats)",
                True,
            ),
            (
                "bytes_received",
                "dataservice_job_client_bytes_received",
                "Bytes of elements the job's clients received",
                True,
            ),
            (
                "wait_seconds",
                "dataservice_job_client_wait_seconds",
                "Seconds the job's clients spent waiting for data",
                True,
            ),
        ]
        live_jobs = [job for job in doc["jobs"] if any(not it["finished"] for it in job["iterations"])]
        for key, name, doc_string, counter in families:
            family = (
                CounterMetricFamily(name, doc_string, labels=labels)
                if counter
                else GaugeMetricFamily(name, doc_string, labels=labels)
            )
            for job in live_jobs:
                if job[key] is not None:
                    family.add_metric([str(job["job_id"]), job["job_name"]], job[key])
            yield family


class WorkerCollector:
    """A worker's tasks, production and transfers, read at each scrape."""

    def __init__(self, read: Callable[[], dict[str, Any]]):
        """`read` returns {"running_tasks", "buffered_elements", "buffered_bytes",
        "buffer_capacity_bytes", "memory_budget_bytes", "unacknowledged_bytes",
        "produced": {dataset: (elements, bytes, seconds)},
        "sent": {protocol: (elements, bytes)}, "open_streams": {protocol: n},
        "shared_memory": {"ring_bytes", "messages", "inline_messages"}}."""
        self._read = read

    def collect(self) -> Iterator[Metric]:
        data = self._read()
        yield _gauge(
            "dataservice_worker_running_tasks", "Tasks whose pipelines run on the worker", data["running_tasks"]
        )
        yield _gauge(
            "dataservice_worker_buffered_elements",
            "Elements produced and not yet sent, over the running tasks",
            data["buffered_elements"],
        )
        yield _gauge("dataservice_worker_buffered_bytes", "Bytes produced and not yet sent", data["buffered_bytes"])
        yield _gauge(
            "dataservice_worker_buffer_capacity_bytes",
            "Bytes the running tasks may buffer in all",
            data["buffer_capacity_bytes"],
        )
        yield _gauge(
            "dataservice_worker_memory_budget_bytes",
            "What the task buffers, cache windows and unacknowledged messages may hold together (memory_budget_bytes)",
            data["memory_budget_bytes"],
        )
        yield _gauge(
            "dataservice_worker_unacknowledged_bytes",
            "Bytes sent and kept until their clients acknowledge them (sent again on a reconnect)",
            data["unacknowledged_bytes"],
        )
        elements = CounterMetricFamily(
            "dataservice_worker_elements_produced", "Elements the worker's pipelines produced", labels=["dataset_id"]
        )
        nbytes = CounterMetricFamily(
            "dataservice_worker_bytes_produced",
            "Bytes of elements the worker's pipelines produced",
            labels=["dataset_id"],
        )
        per_element = SummaryMetricFamily(
            "dataservice_worker_element_processing_seconds",
            "Time the pipeline took per element (the worker waiting for clients not included)",
            labels=["dataset_id"],
        )
        for dataset_id, (count, size, seconds) in sorted(data["produced"].items()):
            elements.add_metric([dataset_id], count)
            nbytes.add_metric([dataset_id], size)
            per_element.add_metric([dataset_id], count_value=count, sum_value=seconds)
        yield elements
        yield nbytes
        yield per_element
        sent = CounterMetricFamily(
            "dataservice_worker_elements_sent", "Elements sent to clients, by transfer protocol", labels=["protocol"]
        )
        sent_bytes = CounterMetricFamily(
            "dataservice_worker_bytes_sent",
            "Bytes sent to clients (after compression), by transfer protocol",
            labels=["protocol"],
        )
        for protocol, (count, size) in sorted(data["sent"].items()):
            sent.add_metric([protocol], count)
            sent_bytes.add_metric([protocol], size)
        yield sent
        yield sent_bytes
        streams = _gauge(
            "dataservice_worker_open_streams", "Element streams open, by transfer protocol", labels=["protocol"]
        )
        for protocol, count in sorted(data["open_streams"].items()):
            streams.add_metric([protocol], count)
        yield streams
        shared = data["shared_memory"]
        yield _gauge(
            "dataservice_worker_shared_memory_bytes",
            "Bytes of the rings of shared memory of the open streams to clients on the worker's host",
            shared["ring_bytes"],
        )
        messages = CounterMetricFamily(
            "dataservice_worker_shared_memory_messages",
            "Messages of streams with a ring of shared memory, by where their body went: the ring, or the "
            "socket (no free slot: the client still held them)",
            labels=["body"],
        )
        messages.add_metric(["ring"], shared["messages"])
        messages.add_metric(["socket"], shared["inline_messages"])
        yield messages


def new_registry(collector: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
