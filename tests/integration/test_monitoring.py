"""Operations: /metrics scraped during a job, the worker recommendation under starvation, gRPC
health through a real health client, `data-server status` and JSON logs of real processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
import tensorflow as tf
from conftest import scrape, total, wait_for_workers
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dataservice
from dataservice import errors, tf_internal
from dataservice.dispatcher import journal
from dataservice.local_cluster import LocalCluster
from dataservice.monitoring.health import LIVENESS_SERVICE
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import dispatcher_pb2, dispatcher_pb2_grpc, journal_pb2, worker_pb2, worker_pb2_grpc


def health(port: int, service: str = "") -> str:
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def http_status(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://localhost:{port}{path}", timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_metrics_move_while_a_job_runs(tmp_path):
    with LocalCluster(
        2,
        processes=False,
        fault_tolerant_mode=True,
        work_dir=str(tmp_path),
        dispatcher_options={"monitoring_port": 0},
        worker_options={"monitoring_port": 0, "heartbeat_interval_ms": 200},
    ) as cluster:
        dataset = tf.data.Dataset.range(10**7).apply(
            dataservice.distribute("distributed_epoch", cluster.target, job_name="metered")
        )
        iterator = iter(dataset)
        for _ in range(200):
            next(iterator)
        time.sleep(1.5)  # a client heartbeat (every second) reports what it received
        dispatcher_port = cluster.dispatcher.monitoring_port
        worker_ports = [w.monitoring_port for w in cluster.workers]
        before = scrape(dispatcher_port)
        workers_before = [scrape(p) for p in worker_ports]
        # A worker asks for ranges sized by its measured rate (a tenth of a second of its work), so
        # the dispatcher hands out splits again only once the client has read past what the workers
        # already hold: read until it has, within a bound.
        splits_before = total(before, "dataservice_iteration_splits_handed_out", job_name="metered")
        deadline = time.monotonic() + 60
        while True:
            for _ in range(5000):
                next(iterator)
            handed_out = total(scrape(dispatcher_port), "dataservice_iteration_splits_handed_out", job_name="metered")
            if handed_out > splits_before or time.monotonic() > deadline:
                break
        time.sleep(1.5)
        # A request that fails is counted under its code.
        with pytest.raises(errors.NotFoundError):
            DispatcherClient(cluster.address, 5).get_data_service_metadata("no-such-dataset")
        # A call each worker surely serves (a task may reach a worker by its heartbeat's answer
        # rather than by a ProcessTask push): the dispatcher's PrepareDataset.
        for worker in cluster.workers:
            with grpc.insecure_channel(worker.address) as channel:
                worker_pb2_grpc.WorkerServiceStub(channel).PrepareDataset(
                    worker_pb2.PrepareDatasetRequest(dataset_id="1"), timeout=10
                )
        after = scrape(dispatcher_port)
        workers_after = [scrape(p) for p in worker_ports]

        job = {"job_name": "metered"}
        assert total(after, "dataservice_dispatcher_workers", state="alive") == 2
        assert total(after, "dataservice_dispatcher_tasks", state="active") == 2
        assert total(after, "dataservice_dispatcher_clients") == 1
        for name in ("dataservice_job_client_elements_received_total", "dataservice_iteration_splits_handed_out"):
            assert total(after, name, **job) > total(before, name, **job) > 0, name
        assert total(after, "dataservice_job_client_elements_received_total", **job) >= 5200
        assert total(after, "dataservice_iteration_splits", **job) == 10**7
        heartbeats = {"method": "ClientHeartbeat", "code": "OK"}
        assert total(after, "dataservice_rpc_duration_seconds_count", **heartbeats) > total(
            before, "dataservice_rpc_duration_seconds_count", **heartbeats
        )
        assert (
            total(after, "dataservice_rpc_duration_seconds_count", method="GetDataServiceMetadata", code="NOT_FOUND")
            == 1
        )
        assert total(after, "dataservice_journal_appends_total") > total(before, "dataservice_journal_appends_total")
        assert total(after, "dataservice_journal_append_duration_seconds_count") == total(
            after, "dataservice_journal_appends_total"
        )

        produced = [total(s, "dataservice_worker_elements_produced_total") for s in workers_after]
        assert sum(produced) > sum(total(s, "dataservice_worker_elements_produced_total") for s in workers_before)
        # The workers run in this process: the client reads them through memory (transfer/local.py).
        assert sum(total(s, "dataservice_worker_elements_sent_total", protocol="local") for s in workers_after) >= 5200
        for samples in workers_after:
            assert total(samples, "dataservice_worker_running_tasks") == 1
            assert total(samples, "dataservice_worker_element_processing_seconds_count") == total(
                samples, "dataservice_worker_elements_produced_total"
            )
            assert total(samples, "dataservice_worker_open_streams", protocol="local") == 1
            assert total(samples, "dataservice_rpc_duration_seconds_count", method="PrepareDataset") >= 1
        del iterator


def _job_status(client: DispatcherClient) -> dict:
    (job,) = client.get_status()["jobs"]
    return job


def _read_for(iterator, seconds: float, per_element_s: float) -> tuple[float, float]:
    """Reads for `seconds`, spending `per_element_s` on each element. Returns two paces that
    bound the consumption rate the dispatcher should see: the elements received per second
    over the whole read (what the client got, waits included) and the pace by the consumer's
    own clock (elements per second of its time outside `next`, which leaves out the iterator's
    own costs between a chunk's hand-out and the next request; on a loaded machine both are
    well below 1 / per_element_s)."""
    started_at = time.monotonic()
    deadline = started_at + seconds
    elements, own_s = 0, 0.0
    while time.monotonic() < deadline:
        next(iterator)
        started = time.perf_counter()
        time.sleep(per_element_s)
        elements += 1
        own_s += time.perf_counter() - started
    return elements / (time.monotonic() - started_at), elements / own_s


def _assert_recommendation_follows(job: dict, paces: tuple[float, float]) -> None:
    """The dispatcher's figures agree with what the test saw: the client's consumption rate
    lies between what it received and its own pace, and the recommendation is consumption
    over one worker's throughput."""
    received, own_pace = paces
    assert received * 0.7 <= job["consumption_rate"] <= own_pace * 1.3, (paces, job)
    needed = job["consumption_rate"] / job["worker_throughput"]
    assert needed - 1 <= job["recommended_workers"] <= needed + 2, job
    assert job["missing_workers"] == max(0, job["recommended_workers"] - job["workers"]), job


def test_recommendation_when_a_slow_pipeline_starves_a_client_and_with_more_workers():
    # Each worker makes 25 elements/s (40 ms a element); the client takes at least 4 ms an
    # element, so it needs several times the 2 workers it starts with and waits most of the time.
    # How fast the client really goes depends on the machine's load, so the test holds the
    # dispatcher's figures against the paces the client measured itself.
    with LocalCluster(
        2, processes=False, dispatcher_options={"monitoring_port": 0}, worker_options={"heartbeat_interval_ms": 500}
    ) as cluster:
        client = DispatcherClient(cluster.address, 10)
        slow = tf.data.Dataset.range(10**7).apply(tf_internal.sleep(40_000))
        iterator = iter(slow.apply(dataservice.distribute("parallel_epochs", cluster.target, job_name="starved")))
        starved_pace = _read_for(iterator, 8, 0.004)
        starved = _job_status(client)
        # The client waits a clear share of its time, and not more than its own clock allows (its
        # time outside `next` was all its own). On a loaded machine the client works slower and so
        # waits less than on an idle one (CI saw 0.48 and 0.53): the starved share is also held
        # against the fed one below rather than a fixed line alone.
        received, own_pace = starved_pace
        assert own_pace > 1.4 * received, ("the client outpaces two workers", starved_pace)
        assert 0.25 < starved["wait_fraction"] <= 1 - received / own_pace + 0.1, (starved, starved_pace)
        assert starved["worker_throughput"] == pytest.approx(25, rel=0.3), starved
        _assert_recommendation_follows(starved, starved_pace)
        assert starved["missing_workers"] >= 1, starved  # a client at 4 ms an element outpaces 2 workers
        # The gauge says the same (read a moment later, so within a worker or two).
        gauge = total(scrape(cluster.dispatcher.monitoring_port), "dataservice_job_recommended_workers")
        assert abs(gauge - starved["recommended_workers"]) <= 2, (gauge, starved)

        cluster.add_workers(10, heartbeat_interval_ms=500)
        fed_pace = _read_for(iterator, 16, 0.004)  # the window (10 s) forgets the starved seconds
        fed = _job_status(client)
        print(f"starved: {starved} at {starved_pace}/s\nfed: {fed} at {fed_pace}/s")
        assert fed["workers"] == 12
        assert fed["wait_fraction"] < 0.3, fed
        assert starved["wait_fraction"] > fed["wait_fraction"] + 0.2, (starved, fed)
        # The client's pace is measured while it starves too (no prefetch hides it): the
        # recommendation follows the client's pace whether or not it waits.
        _assert_recommendation_follows(fed, fed_pace)
        assert fed["missing_workers"] <= 3, fed
        del iterator


def test_worker_health_turns_serving_once_registered():
    dispatcher_port = free_port()
    worker = dataservice.WorkerServer(
        dataservice.WorkerConfig(
            dispatcher_address=f"localhost:{dispatcher_port}", dispatcher_timeout_ms=60_000, monitoring_port=0
        ),
        start=False,
    )
    starting = threading.Thread(target=worker.start, daemon=True)
    starting.start()
    try:
        deadline = time.monotonic() + 10
        while health(worker.port, LIVENESS_SERVICE) != "SERVING" and time.monotonic() < deadline:
            time.sleep(0.05)
        while worker.monitoring_port is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health(worker.port, LIVENESS_SERVICE) == "SERVING"  # alive ...
        assert health(worker.port) == "NOT_SERVING"  # ... but not ready: no dispatcher yet
        assert http_status(worker.monitoring_port, "/readyz") == 503
        assert http_status(worker.monitoring_port, "/healthz") == 200
        assert health(worker.port, "dataservice.v1.WorkerService") == "NOT_SERVING"
        with dataservice.DispatchServer(dataservice.DispatcherConfig(port=dispatcher_port)):
            starting.join(timeout=30)
            assert health(worker.port) == "SERVING"
            assert health(worker.port, "dataservice.v1.WorkerService") == "SERVING"
            assert http_status(worker.monitoring_port, "/readyz") == 200
            worker.stop()
            assert health(worker.port) in ("NOT_SERVING", "UNAVAILABLE")
    finally:
        worker.stop()


def test_dispatcher_is_not_serving_while_it_replays_its_journal(tmp_path):
    # A journal long enough that replaying it takes a second or so.
    writer = journal.JournalWriter(tmp_path / "journal", 1, sync=False)
    for i in range(200_000):
        writer.append(journal_pb2.Update(reserve_ids=journal_pb2.ReserveIdsUpdate(next_task_id=i + 1)))
    writer.close()
    port, monitoring_port = free_port(), free_port()
    config = dataservice.DispatcherConfig(
        port=port, work_dir=str(tmp_path), fault_tolerant_mode=True, monitoring_port=monitoring_port
    )
    servers: list[dataservice.DispatchServer] = []
    threading.Thread(target=lambda: servers.append(dataservice.DispatchServer(config)), daemon=True).start()
    seen: list[str] = []
    refused_while_replaying: list[str] = []
    http_while_replaying: dict[str, int] = {}
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)
        while time.monotonic() < deadline and (not seen or seen[-1] != "SERVING"):
            state = health(port)
            if not seen or seen[-1] != state:
                seen.append(state)
            if state == "NOT_SERVING" and not http_while_replaying:
                http_while_replaying.update(
                    {path: http_status(monitoring_port, path) for path in ("/healthz", "/readyz", "/status.json")}
                )
            if state == "NOT_SERVING" and not refused_while_replaying:
                try:
                    stub.GetWorkers(dispatcher_pb2.GetWorkersRequest(), timeout=2)
                except grpc.RpcError as e:
                    refused_while_replaying.append(f"{e.code().name}: {e.details()}")
            time.sleep(0.01)
    try:
        assert "NOT_SERVING" in seen and seen[-1] == "SERVING", seen
        assert seen.index("NOT_SERVING") < seen.index("SERVING")
        # Over HTTP too (Kubernetes probes of a TLS cluster): alive, not ready (unless the replay
        # ended between the two checks).
        assert http_while_replaying["/healthz"] == 200 and http_while_replaying["/status.json"] == 200
        assert http_status(monitoring_port, "/readyz") == 200 and http_status(monitoring_port, "/healthz") == 200
        if refused_while_replaying:  # the replay may end between the health check and the call
            assert refused_while_replaying[0].startswith("UNAVAILABLE") and "journal" in refused_while_replaying[0]
    finally:
        for server in servers:
            server.stop()


def _read_lines(proc: subprocess.Popen, sink: list[str]) -> None:
    for line in proc.stderr:
        sink.append(line)


def test_processes_serve_metrics_status_and_json_logs(processes):
    dispatcher = processes("--role=dispatcher", "--port=0", "--log_format=json")
    logs: list[str] = dispatcher.stderr_lines
    worker = processes("--role=worker", "--port=0", f"--dispatcher_address={dispatcher.address}", "--log_format=json")
    assert dispatcher.monitoring_port and worker.monitoring_port
    wait_for_workers(dispatcher.address, 1)
    assert health(dispatcher.port) == "SERVING" and health(worker.port) == "SERVING"
    dataset = tf.data.Dataset.range(10**6).apply(
        dataservice.distribute("distributed_epoch", f"grpc://{dispatcher.address}", job_name="watched")
    )
    iterator = iter(dataset)
    for _ in range(100):
        next(iterator)
    time.sleep(1.5)
    assert total(scrape(worker.monitoring_port), "dataservice_worker_elements_produced_total") >= 100
    page = urllib.request.urlopen(f"http://localhost:{dispatcher.monitoring_port}/", timeout=10).read().decode()
    assert "<title>dataservice dispatcher</title>" in page

    command = [sys.executable, "-m", "dataservice.cli", "status", f"--dispatcher_address={dispatcher.address}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"dispatcher localhost:{dispatcher.port}: up")
    worker_row = next(line for line in lines if worker.address in line)
    assert worker_row.split()[1:3] == ["alive", "1"]
    job_row = lines[lines.index("JOBS") + 3].split()
    assert job_row[1:4] == ["watched", "1", "distributed_epoch"]
    assert lines[lines.index("CLIENTS") + 3].split()[:2] == ["1", "1"]
    as_json = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert as_json["jobs"][0]["job_name"] == "watched" and as_json["summary"]["alive_workers"] == 1
    # An unreachable dispatcher: a clear error and exit status 1.
    unreachable = subprocess.run(
        [*command[:-1], f"--dispatcher_address=localhost:{free_port()}", "--timeout_s=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unreachable.returncode == 1 and "unavailable" in unreachable.stderr.lower()
    del iterator

    events = [json.loads(line) for line in logs if line.startswith("{")]
    assert events and all({"time", "level", "logger", "message"} <= set(e) for e in events)
    task_created = [e for e in events if e["message"] == "task created"]
    assert task_created and {"job_id", "iteration_id", "task_id", "worker"} <= set(task_created[0])
    assert task_created[0]["worker"] == worker.address
    assert any(e["message"] == "worker registered" and e["worker"] == worker.address for e in events)
    # A worker turns TensorFlow's oneDNN rewrites and the TFG hook off for its pipelines
    # (worker/tensorflow_settings.py).
    worker_events = [json.loads(line) for line in worker.stderr_lines if line.startswith("{")]
    assert any("oneDNN graph rewrites are off" in e["message"] for e in worker_events), worker_events
    assert any("TFG hook is left out" in e["message"] for e in worker_events), worker_events


def test_monitoring_can_be_turned_off(processes):
    dispatcher = processes("--role=dispatcher", "--port=0", "--no-monitoring")
    assert dispatcher.monitoring_port is None
    assert health(dispatcher.port) == "SERVING"  # gRPC, health included, is served all the same
