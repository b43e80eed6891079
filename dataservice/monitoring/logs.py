"""Log lines an operator can search: every event line carries the ids it concerns.

Call sites pass the ids as `extra=ids(job_id=..., task_id=..., worker=...)`. The text format
appends them to the line as `key=value`; `--log_format=json` writes one JSON object per line
with the ids as keys, for log pipelines (Loki, Elasticsearch, Cloud Logging) to index.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

# The record attribute that holds the ids.
_IDS = "dataservice_ids"
ID_KEYS = ("dataset_id", "job_id", "job_name", "iteration_id", "task_id", "client_id", "worker")
FORMATS = ("text", "json")


def ids(**fields: Any) -> dict[str, dict[str, Any]]:
    """The `extra=` argument that attaches ids to a log record (None values are left out)."""
    return {_IDS: {k: v for k, v in fields.items() if v is not None and v != ""}}


def _ids_of(record: logging.LogRecord) -> dict[str, Any]:
    return getattr(record, _IDS, None) or {}


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _ids_of(record)
        if not fields:
            return line
        head, newline, rest = line.partition("\n")  # ids on the first line, before a traceback
        return head + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + newline + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the ids, and
    the exception's traceback if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        entry.update(_ids_of(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Sends the process's log records to stderr in `log_format` ("text" or "json")."""
    if log_format not in FORMATS:
        raise ValueError(f"log_format must be one of {FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
