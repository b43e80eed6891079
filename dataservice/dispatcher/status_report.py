"""The dispatcher's status document: what the status page, /status.json, `data-server status`
and the Prometheus metrics show, built from one place so that they agree.

The document is plain JSON-ready data (README, section Operations, lists its keys). Times
are seconds ago, not clock readings, so a reader on another host needs no common clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dataservice import modes
from dataservice.dispatcher.load import HISTORY_BUCKET_S, LoadTracker
from dataservice.dispatcher.state import DispatcherState, Iteration, Job
from dataservice.v1 import common_pb2

STATUS_FORMAT = 1

PROCESSING_MODES = {
    common_pb2.SHARDING_POLICY_OFF: "parallel_epochs",
    common_pb2.SHARDING_POLICY_DYNAMIC: "distributed_epoch",
    common_pb2.SHARDING_POLICY_FILE: "FILE",
    common_pb2.SHARDING_POLICY_DATA: "DATA",
    common_pb2.SHARDING_POLICY_FILE_OR_DATA: "FILE_OR_DATA",
    common_pb2.SHARDING_POLICY_HINT: "HINT",
}
TARGET_WORKERS = {v: k.removeprefix("TARGET_WORKERS_") for k, v in common_pb2.TargetWorkers.items()}


@dataclasses.dataclass(frozen=True)
class DispatcherInfo:
    address: str
    fault_tolerant_mode: bool
    work_dir: str | None
    uptime_s: float
    journal_appends: int


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _splits(state: DispatcherState, job: Job, iteration: Iteration) -> dict[str, int] | None:
    """distributed_epoch: splits handed out in the current repetition of each split group, and in all;
    None for a pipeline with a source repeated for ever (its splits never end: no progress to show)."""
    if job.sharding_policy != common_pb2.SHARDING_POLICY_DYNAMIC:
        return None
    if any(size >= modes.INFINITE_SPLITS for size in job.split_group_sizes):
        return None
    handed_out = 0
    for group, size in enumerate(job.split_group_sizes):
        _, position = state.split_position(iteration, group)
        handed_out += min(position, size)
    total = sum(job.split_group_sizes)
    if iteration.finished:
        handed_out = total
    return {"handed_out": handed_out, "total": total}


def build(
    state: DispatcherState,
    load: LoadTracker,
    info: DispatcherInfo,
    worker_seen: Mapping[str, float],
    client_seen: Mapping[int, float],
    now: float,
) -> dict[str, Any]:
    """The status document of `state` and `load` at time `now` (of the clock that `*_seen` read)."""
    active_tasks: dict[str, int] = {}
    for worker in state.workers():
        active_tasks[worker.address] = len(state.active_tasks_of_worker(worker.address))
    workers = [
        {
            "address": w.address,
            "transfer_address": w.transfer_address,
            "state": "alive" if w.alive else "lost",
            "active_tasks": active_tasks[w.address],
            "last_heartbeat_s": _round(now - worker_seen[w.address], 1) if w.address in worker_seen else None,
        }
        for w in state.workers()
    ]
    datasets = [
        {
            "dataset_id": d.dataset_id,
            "fingerprint": d.fingerprint,
            "cardinality": d.metadata.cardinality,
        }
        for d in state.datasets()
    ]
    jobs: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    for job in state.jobs():
        job_load = load.load(job.job_id, now)
        iterations = []
        serving: set[str] = set()
        for repetition, iteration_id in sorted(job.iterations.items()):
            iteration = state.known_iteration(iteration_id)
            tasks = state.task_infos(iteration)
            active = [t for t, _ in tasks if not t.finished]
            if not iteration.finished:
                serving.update(t.worker_address for t in active)
            iterations.append(
                {
                    "iteration_id": iteration.iteration_id,
                    "repetition": repetition,
                    # A restored iterator's iteration: the one it continues.
                    "resumes_iteration_id": iteration.resumes_iteration_id or None,
                    "finished": iteration.finished,
                    "tasks": len(tasks),
                    "active_tasks": len(active),
                    "lost_tasks": sum(t.lost for t, _ in tasks),
                    "clients": len(iteration.client_ids),
                    "splits": _splits(state, job, iteration),
                }
            )
            for client_id in sorted(iteration.client_ids):
                window = load.client_window(client_id, now)
                elements, wait_s = load.client_totals(client_id)
                clients.append(
                    {
                        "client_id": client_id,
                        "job_id": job.job_id,
                        "iteration_id": iteration.iteration_id,
                        "elements_received": elements,
                        "wait_seconds": _round(wait_s),
                        "wait_fraction": _round(min(1.0, window[2] / window[0])) if window and window[0] > 0 else None,
                        "elements_per_s": _round(window[1] / window[0], 1) if window and window[0] > 0 else None,
                        "last_heartbeat_s": _round(now - client_seen[client_id], 1)
                        if client_id in client_seen
                        else None,
                    }
                )
        recommended = job_load.recommended_workers
        throughputs = list(job_load.worker_throughputs.values())
        jobs.append(
            {
                "job_id": job.job_id,
                "job_name": job.job_name,
                "dataset_id": job.dataset_id,
                "processing_mode": PROCESSING_MODES.get(job.sharding_policy, str(job.sharding_policy)),
                "num_consumers": job.num_consumers,
                "target_workers": TARGET_WORKERS.get(job.target_workers, str(job.target_workers)),
                "workers": len(serving),
                "recommended_workers": recommended,
                "missing_workers": None if recommended is None else max(0, recommended - len(serving)),
                "wait_fraction": _round(job_load.wait_fraction),
                "elements_per_s": _round(job_load.received_rate, 1),
                "consumption_rate": _round(sum(job_load.consumption_rates.values()), 1),
                "worker_throughput": _round(sum(throughputs) / len(throughputs), 1) if throughputs else None,
                "elements_received": job_load.elements_received,
                "bytes_received": job_load.bytes_received,
                "wait_seconds": _round(job_load.wait_seconds),
                "iterations": iterations,
            }
        )
    return {
        "format": STATUS_FORMAT,
        "dispatcher": {
            "address": info.address,
            "fault_tolerant_mode": info.fault_tolerant_mode,
            "work_dir": info.work_dir,
            "uptime_s": _round(info.uptime_s, 1),
            "journal_appends": info.journal_appends,
        },
        "summary": state.summary(),
        "workers": workers,
        "datasets": datasets,
        "jobs": jobs,
        "clients": clients,
        "throughput": {
            "bucket_s": HISTORY_BUCKET_S,
            "points": [[_round(start - now, 1), _round(rate, 1)] for start, rate in load.history(now)],
        },
    }
