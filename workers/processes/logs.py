"""Worker logs an operator can search: Celery's text lines, or one JSON object per line
(`edgetrain worker ... --log-format json`, EDGETRAIN_LOG_FORMAT=json).

Every line about a task carries the job and device it serves, the task's name and its id (each
delivery of a task, a retry included, runs under its id): read from the Celery task being run,
or from what Celery's own lines about a task say. A device worker's lines name its device."""

from __future__ import annotations

import ast
import json
import logging
from datetime import datetime, timezone
from typing import Any

from celery import current_task
from celery.signals import after_setup_logger, after_setup_task_logger

from edgetrain.tasks.leases import task_subject

CONTEXT = ("job_id", "device_id", "task_name", "task_id")


class TaskContext(logging.Filter):
    """Adds job_id, device_id, task_name and task_id to each record (None where unknown);
    `device_id` is the device of a device worker. In the process that runs a task they come
    from the task; Celery's own lines about a task ("received", "succeeded") carry its id,
    name and arguments (as their repr, which names the job and device)."""

    def __init__(self, device_id: str | None = None):
        super().__init__()
        self.device_id = device_id

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate `record` (never drops it)."""
        found: dict[str, Any] = {"device_id": self.device_id}
        task = current_task._get_current_object() if current_task else None
        if task is not None and task.request.id:
            found |= _subject(task.name, tuple(task.request.args or ())) | {"task_name": task.name, "task_id": task.request.id}
        elif isinstance(data := getattr(record, "data", None), dict) and data.get("id"):  # Celery's "received", "succeeded"
            name = str(data.get("name") or "").partition("[")[0]  # the task's name without its label (tasks/contract.py)
            found |= _subject(name, _arguments(data.get("args"))) | {"task_name": name or None, "task_id": data["id"]}
        for key in CONTEXT:
            if getattr(record, key, None) is None:
                setattr(record, key, found.get(key))
        return True


def _subject(name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    return {k: v for k, v in task_subject(name, args).items() if k in CONTEXT and v is not None}


def _arguments(argsrepr: object) -> tuple[Any, ...]:
    """A task's arguments from Celery's repr of them (JSON values: a Python literal), () when it
    is not one (Celery shortens long ones)."""
    try:
        args = ast.literal_eval(argsrepr) if isinstance(argsrepr, str) else ()
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ()
    return tuple(args) if isinstance(args, (list, tuple)) else ()


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, process,
    the task context where known, and the exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        entry |= {key: value for key in CONTEXT if (value := getattr(record, key, None)) is not None}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def use_log_format(log_format: str, device_id: str | None = None) -> None:
    """Make the loggers Celery sets up in this worker (and its pool children) write
    `log_format` ("text": Celery's own; "json": JsonFormatter) with the task context."""
    if log_format != "json":
        return

    def configure(logger: logging.Logger, **_: Any) -> None:
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())
            handler.addFilter(TaskContext(device_id))

    after_setup_logger.connect(configure, weak=False, dispatch_uid="edgetrain-log-format")
    after_setup_task_logger.connect(configure, weak=False, dispatch_uid="edgetrain-task-log-format")
