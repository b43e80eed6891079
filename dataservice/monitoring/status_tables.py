"""The status document as tables for a terminal (`data-server status`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def table(title: str, columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    """A titled table with aligned columns; "(none)" when there are no rows."""
    if not rows:
        return f"{title}\n  (none)\n"
    cells: list[list[str]] = [[name for name, _ in columns]]
    cells += [[_text(value(row)) for _, value in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return title + "\n" + "\n".join(lines) + "\n"


def _progress(splits: Any) -> str:
    if not splits:
        return "-"
    done = splits["handed_out"] / splits["total"] if splits["total"] else 1.0
    filled = round(done * 20)
    return "[" + "#" * filled + "." * (20 - filled) + f"] {splits['handed_out']}/{splits['total']}"


def render(doc: dict[str, Any]) -> str:
    d = doc["dispatcher"]
    mode = f"fault tolerant, journal in {d['work_dir']}" if d["fault_tolerant_mode"] else "not fault tolerant"
    parts = [f"dispatcher {d['address']}: up {d['uptime_s']:.0f} s, {mode}\n"]
    parts.append(
        table(
            "WORKERS",
            [
                ("ADDRESS", lambda w: w["address"]),
                ("STATE", lambda w: w["state"]),
                ("ACTIVE TASKS", lambda w: w["active_tasks"]),
                ("LAST HEARTBEAT (S AGO)", lambda w: w["last_heartbeat_s"]),
            ],
            doc["workers"],
        )
    )
    parts.append(
        table(
            "JOBS",
            [
                ("JOB", lambda j: j["job_id"]),
                ("NAME", lambda j: j["job_name"] or "-"),
                ("DATASET", lambda j: j["dataset_id"]),
                ("MODE", lambda j: j["processing_mode"]),
                ("WORKERS", lambda j: j["workers"]),
                ("RECOMMENDED", lambda j: j["recommended_workers"]),
                ("CLIENTS WAIT", lambda j: _percent(j["wait_fraction"])),
                ("ELEMENTS/S", lambda j: j["elements_per_s"]),
                ("ELEMENTS", lambda j: j["elements_received"]),
            ],
            doc["jobs"],
        )
    )
    iterations = [dict(it, job_id=job["job_id"]) for job in doc["jobs"] for it in job["iterations"]]
    parts.append(
        table(
            "ITERATIONS",
            [
                ("JOB", lambda i: i["job_id"]),
                ("ITERATION", lambda i: i["iteration_id"]),
                ("EPOCH", lambda i: i["repetition"]),
                ("STATE", _iteration_state),
                ("TASKS", lambda i: f"{i['active_tasks']}/{i['tasks']}"),
                ("CLIENTS", lambda i: i["clients"]),
                ("SPLITS", lambda i: _progress(i["splits"])),
            ],
            iterations,
        )
    )
    parts.append(
        table(
            "CLIENTS",
            [
                ("CLIENT", lambda c: c["client_id"]),
                ("JOB", lambda c: c["job_id"]),
                ("ITERATION", lambda c: c["iteration_id"]),
                ("ELEMENTS", lambda c: c["elements_received"]),
                ("ELEMENTS/S", lambda c: c["elements_per_s"]),
                ("WAITING", lambda c: _percent(c["wait_fraction"])),
            ],
            doc["clients"],
        )
    )
    parts.append(
        table(
            "DATASETS",
            [("DATASET", lambda s: s["dataset_id"]), ("FINGERPRINT", lambda s: s["fingerprint"])],
            doc["datasets"],
        )
    )
    return "\n".join(parts)


def _iteration_state(iteration: dict) -> str:
    state = "finished" if iteration["finished"] else "running"
    resumed = iteration.get("resumes_iteration_id")
    return f"{state} (resumes {resumed})" if resumed else state
