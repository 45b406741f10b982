"""Tasks stopped from outside their own code, seen from the worker's main process: a pool child
that died (a crash, the out-of-memory killer, the hard time limit) and a task revoked by an
operator (Flower's Revoke and Terminate, `celery control revoke [--terminate]`). Each ends in
a state that says what happened, at once:

- `finetune`: died -> the part fails with the reason; revoked while it runs (terminated) or
  before it ran -> the part is cancelled (its checkpoint is kept: `edgetrain requeue`
  continues from it); the device's settings are restored;
- `profile_device`: the table fails for the jobs waiting on it (they may be re-queued);
- `train_proxy`: died or revoked, `estimate_relation_vector`: revoked -> the relation vector
  fails with the reason for the jobs waiting on it, and its other runs are skipped;
- `advance_job`, `advance_page`: they only advance a job, so a revoked one is sent again.
"""

from __future__ import annotations

import logging
import signal
from functools import partial
from typing import Any

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import Task
from celery.signals import task_failure, task_revoked

from edgetrain.common.jobs.events import AttemptCancelled, Cancelled, Failed, PartEvent, Refused
from edgetrain.common.keys import vector_key
from edgetrain.common.payloads import FinetuneRequest, JobPage, ProfileRequest, ProxyRunRequest, profile_resource
from edgetrain.common.schemas import EstimationRequest
from edgetrain.common.store import JobNotFoundError, Lease

from .app import app
from .context import bound_device, bound_device_id, store
from .contract import TaskName, send
from .workflow import advance_device, fail_resource, fail_vector

logger = logging.getLogger(__name__)


def _restore_device() -> None:
    device_id = bound_device_id()
    if device_id is not None:
        bound_device(device_id).restore()


def _end_part(request: FinetuneRequest, *events: PartEvent) -> None:
    """Apply the first of `events` the part accepts (none, when it moved on), and advance it."""
    for event in events:
        try:
            store().jobs.apply(request.job_id, request.device_id, event)
            break
        except (Refused, JobNotFoundError) as exc:
            logger.info("finetune %s/%s: %s refused: %s", request.job_id, request.device_id, event.kind, exc)
    advance_device(request.job_id, request.device_id)


def _stopped(name: str, task_id: str, payload: Any, lease: Lease | None, what: str, revoked: bool) -> None:
    """End what task `name` (`task_id`) served: `what` says how it stopped (`revoked` by an
    operator, or its process died). A fine-tune's part ends only while it still runs that task
    (its dispatch): news of a stopped task that arrives after the part was re-queued changes
    nothing."""
    if name == TaskName.finetune.value:
        request = FinetuneRequest.model_validate(payload)
        reason = f"fine-tuning on {request.device_id} {what}"
        if revoked and lease is not None:
            # the terminated process may have stopped its attempt itself first (it checkpoints on
            # SIGTERM and puts its message back): then the part, no attempt running, is cancelled
            reason += "; its checkpoint is kept: `edgetrain requeue` continues from it"
            _end_part(request, AttemptCancelled(attempt=lease.attempt, reason=reason), Cancelled(reason=reason, dispatch=task_id))
        elif revoked:
            _end_part(request, Cancelled(reason=reason, dispatch=task_id))
        else:
            _end_part(request, Failed(reason=reason, attempt=lease.attempt if lease else None, dispatch=task_id))
    elif name == TaskName.profile_device.value:
        profile = ProfileRequest.model_validate(payload)
        resource = profile_resource(profile)
        fail_resource(resource, f"profiling on {profile.device_id} {what}", owner=profile.owner)
    elif name == TaskName.train_proxy.value:
        run = ProxyRunRequest.model_validate(payload)
        fail_vector(vector_key(run.request), f"proxy training b={run.batch_size} seed={run.seed} {what}")
    elif name == TaskName.estimate_relation_vector.value:
        fail_vector(vector_key(EstimationRequest.model_validate(payload)), f"relation vector estimation {what}")
    elif name == TaskName.advance_job.value:
        send(app, TaskName.advance_job, payload)
    elif name == TaskName.advance_page.value:
        send(app, TaskName.advance_page, JobPage.model_validate(payload))


def _own_lease(task_id: str, instance: str, what: str) -> tuple[bool, Lease | None]:
    """(whether this worker `instance` may end what task `task_id` served, the lease it holds
    on it): not when another worker's run of the task holds the lease (this worker froze, and
    the task was handed on), which is left to that run."""
    lease = store().liveness.lease(task_id)
    if lease is not None and lease.instance != instance:
        logger.warning("task %s %s here, but %s runs it now: left to it", task_id, what, lease.instance or lease.node)
        return False, None
    return True, lease


# tasks whose pool child's death ends what they served here (a job's step is sent again); a model
# that kills its process would kill every retry of them
DIED_HERE_ENDS = {
    t.value for t in (TaskName.finetune, TaskName.profile_device, TaskName.train_proxy, TaskName.advance_job, TaskName.advance_page)
}


def on_lost_child(sender: Task | None = None, task_id: str = "", exception: BaseException | None = None,
                  args: tuple[Any, ...] = (), instance: str = "", **_: Any) -> None:  # fmt: skip
    """task_failure in the main process of worker `instance` (node:pid): the pool child running
    a task died or hit its hard time limit. The worker lives on; what the task served fails
    with what happened, unless another worker runs the task now."""
    if sender is None or not isinstance(exception, (WorkerLostError, TimeLimitExceeded)) or not args:
        return
    if sender.name not in DIED_HERE_ENDS:
        return  # the other tasks' runs are handed on by the reaper
    what = f"exceeded its time limit ({exception})" if isinstance(exception, TimeLimitExceeded) else f"its process died: {exception}"
    _restore_device()
    ours, lease = _own_lease(task_id, instance, what)
    if not ours:
        return
    if lease is not None:
        store().liveness.release(task_id, lease.attempt)
    _stopped(sender.name, task_id, args[0], lease, what, revoked=False)


def on_revoked(sender: Task | None = None, request: Any = None, terminated: bool = False, signum: int | None = None,
               expired: bool = False, instance: str = "", **_: Any) -> None:  # fmt: skip
    """task_revoked in the main process of worker `instance` (node:pid): an operator revoked a
    task (running: terminated; queued: discarded on receipt), or it expired. `sender` is the
    task, `request` its context (id, args). A task another worker runs now is left to it."""
    if sender is None or request is None or not request.args:
        return
    how = "expired before it ran" if expired else "was revoked before it ran"
    if terminated:
        name = signal.Signals(signum).name if signum else "a signal"
        how = f"was terminated by an operator ({name}, e.g. Flower's Terminate or `celery control revoke --terminate`)"
    logger.warning("task %s %s", request.id, how)
    ours, lease = _own_lease(request.id, instance, how)
    if not ours:
        return
    store().ledger.done(request.id)  # it will not run: what it served ends here
    if terminated:
        _restore_device()
        if lease is not None:
            store().liveness.release(request.id, lease.attempt)
    _stopped(sender.name, request.id, request.args[0], lease, how, revoked=True)


def watch_stopped_tasks(instance: str) -> None:
    """In the main process of worker `instance` (node:pid): end what a task served when it is
    revoked or its pool child dies (the worker itself lives on)."""
    task_failure.connect(partial(on_lost_child, instance=instance), weak=False, dispatch_uid="edgetrain-lost-child")
    task_revoked.connect(partial(on_revoked, instance=instance), weak=False, dispatch_uid="edgetrain-revoked")
