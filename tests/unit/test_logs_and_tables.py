"""Log lines with ids (text and JSON) and the terminal tables of `data-server status`."""

import json
import logging

import tensorflow as tf
from dispatcher_helpers import FakeClock, RecordingNotifier, heartbeat, make_core, register, start_iteration

from dataservice.monitoring import logs, status_tables
from dataservice.v1 import common_pb2


def _record(message, *args, exc_info=None, **fields):
    record = logging.LogRecord("dataservice.test", logging.INFO, __file__, 1, message, args, exc_info)
    for key, value in logs.ids(**fields).items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_the_ids_as_keys():
    line = logs.JsonFormatter().format(
        _record("task %s created", "x", job_id=3, iteration_id=4, task_id=7, worker="w:1", job_name="")
    )
    entry = json.loads(line)
    assert entry["message"] == "task x created" and entry["level"] == "INFO"
    assert (entry["job_id"], entry["iteration_id"], entry["task_id"], entry["worker"]) == (3, 4, 7, "w:1")
    assert "job_name" not in entry  # empty ids are left out
    assert entry["time"].endswith("+00:00")


def test_json_lines_hold_tracebacks_on_one_line():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        line = logs.JsonFormatter().format(_record("failed", exc_info=sys.exc_info(), task_id=1))
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_text_lines_end_with_the_ids():
    line = logs.TextFormatter().format(_record("worker registered", worker="10.0.0.7:5051"))
    assert line.endswith("dataservice.test: worker registered worker=10.0.0.7:5051")


def test_dispatcher_events_are_logged_with_their_ids(caplog):
    core = make_core(FakeClock(), RecordingNotifier())
    with caplog.at_level(logging.INFO, logger="dataservice.dispatcher"):
        heartbeat(core, "w1:1")
        start_iteration(core, register(core, tf.data.Dataset.range(5)), job_name="train")
    events = {r.getMessage().split(" (")[0]: getattr(r, "dataservice_ids", {}) for r in caplog.records}
    assert events["worker registered"] == {"worker": "w1:1"}
    assert events["dataset registered"] == {"dataset_id": "1"}
    assert events["job created"] == {"job_id": 1, "job_name": "train", "dataset_id": "1"}
    assert events["task created"] == {"job_id": 1, "iteration_id": 1, "task_id": 1, "worker": "w1:1"}
    assert events["client joined"] == {"job_id": 1, "iteration_id": 1, "client_id": 1}


def test_status_tables_show_workers_jobs_iterations_and_clients():
    core = make_core(FakeClock(), RecordingNotifier())
    heartbeat(core, "w1:1")
    start_iteration(
        core, register(core, tf.data.Dataset.range(100)), policy=common_pb2.SHARDING_POLICY_DYNAMIC, job_name="train"
    )
    text = status_tables.render(core.status())
    lines = text.splitlines()
    assert lines[0].startswith("dispatcher test:0: up")
    worker_row = next(line for line in lines if line.strip().startswith("w1:1"))
    assert worker_row.split()[:3] == ["w1:1", "alive", "1"]
    job_row = lines[lines.index("JOBS") + 3].split()
    assert job_row[:4] == ["1", "train", "1", "distributed_epoch"]
    iteration_row = lines[lines.index("ITERATIONS") + 3]
    assert "running" in iteration_row and "0/100" in iteration_row
    assert lines[lines.index("CLIENTS") + 3].split()[:3] == ["1", "1", "1"]


def test_an_empty_dispatcher_renders_none_everywhere():
    text = status_tables.render(make_core(FakeClock(), RecordingNotifier()).status())
    assert text.count("(none)") == 5
