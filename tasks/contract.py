"""The queue contract: task names, queues and routes, and the one way to send a task.

Queues: `server` (proxy training and pre-training, scaled by adding server workers),
`device.<id>` (one per device, consumed by that device's worker only, one task at a time) and
`control` (the light job workflow). Payloads are the typed models of common/payloads.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from pydantic import BaseModel

SERVER_QUEUE = "server"
CONTROL_QUEUE = "control"


class TaskName(str, Enum):
    """Every task, by the name producers send and workers register."""

    advance_job = "edgetrain.advance_job"  # payload: the job id
    advance_page = "edgetrain.advance_page"  # JobPage
    profile_device = "edgetrain.profile_device"  # ProfileRequest -> ProfileResult
    finetune = "edgetrain.finetune"  # FinetuneRequest -> RunReport
    estimate_relation_vector = "edgetrain.estimate_relation_vector"  # EstimationRequest -> EstimateResult
    train_proxy = "edgetrain.train_proxy"  # ProxyRunRequest -> TrainingOutcome
    pretrain = "edgetrain.pretrain"  # PretrainRequest -> PretrainResult


class TaskFailed(RuntimeError):
    """A task failed and recorded why in the store (the part or resource it served)."""


def device_queue(device_id: str) -> str:
    """The queue only the worker of `device_id` consumes."""
    return f"device.{device_id}"


FIXED_ROUTES: dict[TaskName, str] = {
    TaskName.advance_job: CONTROL_QUEUE,
    TaskName.advance_page: CONTROL_QUEUE,
    TaskName.estimate_relation_vector: SERVER_QUEUE,
    TaskName.train_proxy: SERVER_QUEUE,
    TaskName.pretrain: SERVER_QUEUE,
}  # profile_device and finetune go to the queue of the device they name


def label(task: TaskName, body: dict[str, Any] | str) -> str:
    """How a task shows in logs and Flower: its name and whom it serves, e.g.
    `edgetrain.finetune[3f2a9c/nano-1]` (job/device) or `edgetrain.train_proxy[b=16 seed=0]`."""
    if isinstance(body, str):
        return f"{task.value}[{body}]"
    if task == TaskName.advance_page:
        return f"{task.value}[{body.get('job_id')} page {body.get('page')}]"
    subject = "/".join(str(body[k]) for k in ("job_id", "device_id") if body.get(k))
    if task == TaskName.profile_device:
        subject = f"{body.get('device_id')} {body.get('model')}"
    elif task == TaskName.train_proxy:
        subject = f"b={body.get('batch_size')} seed={body.get('seed')}"
    elif task in (TaskName.estimate_relation_vector, TaskName.pretrain):
        subject = str(body.get("model") or body.get("request", {}).get("model"))
    return f"{task.value}[{subject}]"


def send(app: Celery, task: TaskName, payload: BaseModel | str, queue: str | None = None) -> AsyncResult:
    """Send `task` with its payload to `queue` (default: its fixed route)."""
    route = queue or FIXED_ROUTES.get(task)
    if route is None:
        raise ValueError(f"{task.value} goes to a device queue: name the queue")
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return app.send_task(task.value, args=[body], queue=route, shadow=label(task, body))
