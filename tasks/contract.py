"""The queue contract: task names, queues and routes, and the one way to send a task.

Queues: `server` (proxy training and pre-training, scaled by adding server workers),
`device.<id>` (one per device, consumed by that device's worker only, one task at a time) and
`control` (the light job workflow). Payloads are the typed models of common/payloads.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from enum import Enum
from typing import Any

from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.result import AsyncResult
from pydantic import BaseModel

from edgetrain.common.ids import is_id
from edgetrain.common.store.coordination import token_job
from edgetrain.common.store.ledger import SentTask, TaskLedger

SERVER_QUEUE = "server"
CONTROL_QUEUE = "control"
TASK_PROGRESS_EVENT = "task-progress"  # Flower shows the task in state PROGRESS


class TaskName(str, Enum):
    """Every task, by the name producers send and workers register."""

    plan_submitted = "edgetrain.plan_submitted"  # payload: the id of the job that rang (those submitted since come too)
    advance_job = "edgetrain.advance_job"  # payload: the job id
    advance_page = "edgetrain.advance_page"  # JobPage
    profile_device = "edgetrain.profile_device"  # ProfileRequest -> ProfileResult
    finetune = "edgetrain.finetune"  # FinetuneRequest -> RunReport
    estimate_relation_vector = "edgetrain.estimate_relation_vector"  # EstimationRequest -> EstimateResult
    train_proxy = "edgetrain.train_proxy"  # ProxyRunRequest -> TrainingOutcome (or why it was skipped)
    pretrain = "edgetrain.pretrain"  # PretrainRequest -> PretrainResult
    federated_advance = "edgetrain.federated_advance"  # payload: the federated job id
    federated_train = "edgetrain.federated_train"  # TrainRequest -> the update's acceptance
    federated_aggregate = "edgetrain.federated_aggregate"  # AggregateRequest -> the round's global accuracy
    federated_cleanup = "edgetrain.federated_cleanup"  # payload: the id of a federated job that ended


class TaskFailed(RuntimeError):
    """A task failed and recorded why in the store (the part or resource it served)."""


def device_queue(device_id: str) -> str:
    """The queue only the worker of `device_id` consumes."""
    return f"device.{device_id}"


ROLES = ("control", "server", "device")
HANDED_ON, RETRIES = "handed_on", "retries"  # counters by role (store.monitoring): tasks of lost workers handed on, redeliveries run


def queue_role(queue: str | None) -> str:
    """The role of the workers that consume `queue`: control, server or device ("unknown"
    for a queue edgetrain does not name)."""
    if queue in (CONTROL_QUEUE, SERVER_QUEUE):
        return queue
    return "device" if queue and queue.startswith("device.") else "unknown"


FIXED_ROUTES: dict[TaskName, str] = {
    TaskName.plan_submitted: CONTROL_QUEUE,
    TaskName.advance_job: CONTROL_QUEUE,
    TaskName.advance_page: CONTROL_QUEUE,
    TaskName.estimate_relation_vector: SERVER_QUEUE,
    TaskName.train_proxy: SERVER_QUEUE,
    TaskName.pretrain: SERVER_QUEUE,
    TaskName.federated_advance: CONTROL_QUEUE,
    TaskName.federated_aggregate: SERVER_QUEUE,
    TaskName.federated_cleanup: SERVER_QUEUE,
}  # profile_device, finetune and federated_train go to the queue of the device they name


def claiming_job(owner: object) -> str | None:
    """The job of a claim's owner (a job id or a job's claim token), None for a command's."""
    job = token_job(owner) if isinstance(owner, str) else None
    return job if is_id(job) else None


def label(task: TaskName, body: dict[str, Any] | str, job_id: str | None = None, setting: str | None = None) -> str:
    """How a task shows in logs and Flower: its name, the job it serves and what it does, e.g.
    `edgetrain.finetune[3f2a9c4d1e07/nano-1 planned b=16 f=844.8 MHz]` (job/device, the
    selected batch size and `setting`, the device's setting in its unit; the device may start
    otherwise, and its progress says what runs), `edgetrain.train_proxy[3f2a9c4d1e07 b=8
    seed=1]`. The job comes from the payload (its `job_id`, or the job whose claim a profile
    request holds), else `job_id`."""
    if isinstance(body, str):
        return f"{task.value}[{body}]"
    if task == TaskName.advance_page:
        return f"{task.value}[{body.get('job_id')} page {body.get('page')}]"
    job = body.get("job_id") or job_id or claiming_job(body.get("owner"))
    if task == TaskName.profile_device:
        subject = f"{body.get('device_id')} {body.get('model')}"
    elif task == TaskName.finetune:
        subject = f"{body.get('device_id')} planned b={body.get('batch_size')} f={setting or body.get('frequency_hz')}"
    elif task == TaskName.train_proxy:
        subject = f"b={body.get('batch_size')} seed={body.get('seed')}"
    elif task == TaskName.federated_train:
        subject = (f"{body.get('device_id')} round {body.get('round')} b={body.get('batch_size')} "
                   f"f={setting or body.get('frequency_hz')} x{body.get('local_steps')}")  # fmt: skip
    elif task == TaskName.federated_aggregate:
        subject = f"round {body.get('round')}"
    else:  # estimate_relation_vector, pretrain
        subject = str(body.get("model") or body.get("request", {}).get("model"))
    sep = "/" if task in (TaskName.profile_device, TaskName.finetune, TaskName.federated_train) else " "
    return f"{task.value}[{job}{sep}{subject}]" if job else f"{task.value}[{subject}]"


def show_progress(task: Task, text: str) -> None:
    """Show how far a running task is where Flower shows a task: its state becomes PROGRESS
    and its result `text` (a custom task event; the task's own result replaces it at the end).
    The event names the task by its label, so a Flower started after the task was received
    (which missed the event that named it) shows its name too."""
    task.send_event(TASK_PROGRESS_EVENT, result=text, name=task.request.shadow or task.name)


def send(
    app: Celery,
    task: TaskName,
    payload: BaseModel | dict[str, Any] | str,
    queue: str | None = None,
    job_id: str | None = None,
    task_id: str | None = None,
    awaited: bool = False,
    setting: str | None = None,
) -> AsyncResult:
    """Send `task` with its payload to `queue` (default: its fixed route), as task `task_id`
    (default: a new id); `job_id` names the job it serves in its label when the payload does
    not, `setting` the device setting it trains at, in words. The message is pushed onto the
    queue's list and nothing else (no declaration, which would read the queue), so a sender
    needs only the right to push there (workers/commands/redis_acl.py).
    Only an `awaited` task's result is stored: the others report through the store, and Flower
    reads how they ended from the workers' events (a task that fails is stored all the same)."""
    route = queue or FIXED_ROUTES.get(task)
    if route is None:
        raise ValueError(f"{task.value} goes to a device queue: name the queue")
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return app.send_task(task.value, args=[body], queue=route, shadow=label(task, body, job_id, setting), task_id=task_id,
                         declare=[], ignore_result=not awaited, argsrepr=_argsrepr(body), kwargsrepr="{}")  # fmt: skip


def _argsrepr(body: dict[str, Any] | str) -> str:
    """What Celery logs and Flower shows as a task's arguments: the job and device it serves
    (the label says what it does). Celery's own repr of a payload would cost the sender a
    quarter of the time it takes to plan and dispatch a fine-tune."""
    subject = body if isinstance(body, str) else {key: body[key] for key in ("job_id", "device_id") if body.get(key)}
    return repr([subject])


def send_tracked(
    app: Celery, ledger: TaskLedger, task: TaskName, payloads: Sequence[BaseModel | str], queue: str | None = None,
    job_id: str | None = None,
) -> None:  # fmt: skip
    """`send` `task` once per payload, all written down in the ledger first (common/store/ledger.py):
    a message Redis loses, or one never sent because the sender stopped midway (a Redis outage
    past the publish retries, a crash), is sent again by the reaper until the task has run."""
    tracked = [to_track(task, payload, queue, job_id) for payload in payloads]
    ledger.record(tracked)
    for sent in tracked:
        send_again(app, sent)


def to_track(task: TaskName, payload: BaseModel | str, queue: str | None = None, job_id: str | None = None) -> SentTask:
    """A task as the ledger of sent tasks keeps it (under a new task id), to write down and then send."""
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return SentTask(task_id=uuid.uuid4().hex, task=task.value, queue=queue or FIXED_ROUTES[task], payload=body, job_id=job_id)


def tracked(task_id: str) -> bool:
    """Whether `task_id` is one `to_track` made (32 hex digits; Celery's own ids have dashes)."""
    return len(task_id) == 32 and all(c in "0123456789abcdef" for c in task_id)


def wake_ups(job_ids: Sequence[str]) -> list[SentTask]:
    """An `advance_job` of each of `job_ids` (jobs waiting on a table or vector that is ready or
    failed), as the ledger of sent tasks keeps it."""
    return [to_track(TaskName.advance_job, job_id) for job_id in job_ids]


def send_again(app: Celery, sent: SentTask) -> AsyncResult:
    """Send a task of the ledger again, under its own task id."""
    return send(app, TaskName(sent.task), sent.payload, sent.queue, sent.job_id, sent.task_id)


def describe(exc: BaseException) -> str:
    """What went wrong in a task, in a few words."""
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"exceeded its time limit ({type(exc).__name__})"
    return str(exc) or type(exc).__name__
