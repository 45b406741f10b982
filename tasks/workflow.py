"""The job workflow: advances on events and never waits on a result inside a task.

`advance_job` reads each device's part of a job from the store, asks the planner
(common/planner.py) what it needs next and applies the decision: it claims and dispatches
profiling and estimation, records failures, and dispatches `finetune` once a selection is
made. Tasks that produce a table or a vector advance every job waiting on it. Claims and
once-only markers in Redis make repeated or concurrent advances harmless.
"""

from __future__ import annotations

import math

from celery.utils.log import get_task_logger

from edgetrain.common.admission import job_refusal
from edgetrain.common.jobs import (
    TERMINAL,
    DevicePart,
    EventKind,
    JobRecord,
    JobState,
    PartState,
    job_state,
)
from edgetrain.common.keys import table_resource, vector_resource
from edgetrain.common.payloads import JobPage, device_page
from edgetrain.common.planner import (
    Cancel,
    Decision,
    Fail,
    FineTune,
    PartView,
    Prepare,
    Wait,
    plan,
    resource_ids,
)
from edgetrain.common.schemas import (
    DeviceTarget,
    ProfileTable,
    RelationVector,
    utc_now,
)
from edgetrain.common.store import Store, claim_token, token_job

from .app import app
from .context import settings, store
from .contract import TaskName, device_queue, send

logger = get_task_logger(__name__)
JOB_LOCK_TIMEOUT_S = 120


def notify_waiters(resource: str) -> None:
    """A table or vector is ready (or failed): advance every job waiting for it."""
    for job_id in store().coordination.take_waiters(resource):
        send(app, TaskName.advance_job, job_id)


def fail_resource(resource: str, reason: str) -> None:
    """Producing a table or vector failed: record why for the jobs waiting on this attempt
    (and the one that claimed it), and wake them. Jobs that come later try again."""
    logger.warning("%s failed: %s", resource, reason)
    c = store().coordination
    holder, waiting = c.holder(resource), c.take_waiters(resource)
    c.fail(resource, reason, waiting + ([token_job(holder)] if holder else []))
    for job_id in sorted(set(waiting + c.take_waiters(resource))):
        send(app, TaskName.advance_job, job_id)


class _Reader:
    """Reads what the planner needs for one page of a job: its devices in one round trip,
    each table and vector once, failures only where a table or vector is missing."""

    def __init__(self, s: Store, record: JobRecord, targets: list[DeviceTarget]):
        self.s, self.job_id, self.spec, self.record = s, record.job_id, record.spec, record
        self._devices = s.fleet.devices_by_id([t.device_id for t in targets])
        self._tables: dict[str, ProfileTable | None] = {}
        self._vectors: dict[str, RelationVector | None] = {}

    def view(self, target: DeviceTarget, part: DevicePart) -> PartView:
        s = self.s
        device = self._devices.get(target.device_id)
        if device is None:
            registered = tuple(d.device_id for d in s.fleet.devices())
            seen = s.fleet.last_seen(target.device_id)
            return PartView(
                self.job_id, self.spec, target, part, None,
                registered=registered, last_seen=seen, heartbeat_ttl_s=settings().heartbeat_ttl_s, now=utc_now(),
                cancelled_at=self.record.cancelled_at,
            )  # fmt: skip
        tid, vkey = resource_ids(self.spec, device.device_type)
        if tid not in self._tables:
            self._tables[tid] = s.resources.table(tid)
        if vkey not in self._vectors:
            self._vectors[vkey] = s.resources.vector(vkey)
        return PartView(
            self.job_id, self.spec, target, part, device,
            table=self._tables[tid],
            vector=self._vectors[vkey],
            table_failure=self._failure(table_resource(tid)) if self._tables[tid] is None else None,
            vector_failure=self._failure(vector_resource(vkey)) if self._vectors[vkey] is None else None,
            not_before=self.record.created_at if self.spec.profiling.force else None,
            now=utc_now(),
            cancelled_at=self.record.cancelled_at,
        )  # fmt: skip

    def _failure(self, resource: str) -> str | None:
        failure = self.s.coordination.failure(resource)
        return failure.for_job(self.job_id) if failure else None


def advance_device(job_id: str, device_id: str) -> None:
    """Advance the page of job `job_id` that holds `device_id` (its part changed)."""
    record = store().jobs.record(job_id)
    if record is not None:
        send(app, TaskName.advance_page, device_page(job_id, record.spec, device_id, settings().page_size))


@app.task(name=TaskName.advance_job.value)
def advance_job(job_id: str) -> str:
    """Do the next step of every device part of job `job_id`: at once for a job of one page,
    else one `advance_page` task per page (control workers run them side by side, and no lock
    or read grows with the fleet). Returns the job's state, or "paged"."""
    record = store().jobs.record(job_id)
    if record is None:
        logger.warning("advance_job: no job %s", job_id)
        return "unknown job"
    pages = math.ceil(len(record.spec.devices) / settings().page_size)
    if pages == 1:
        return _advance_page(record, 0)
    for page in range(pages):
        send(app, TaskName.advance_page, JobPage(job_id=job_id, page=page))
    return "paged"


@app.task(name=TaskName.advance_page.value, pydantic=True)
def advance_page(page: JobPage) -> str:
    """Do the next step of the parts of one page of a job; returns the job's state."""
    record = store().jobs.record(page.job_id)
    if record is None:
        logger.warning("advance_page: no job %s", page.job_id)
        return "unknown job"
    return _advance_page(record, page.page)


def _advance_page(record: JobRecord, page: int) -> str:
    s, job_id, spec = store(), record.job_id, record.spec
    size = settings().page_size
    targets = spec.devices[page * size : (page + 1) * size]
    refusal = job_refusal(spec, settings().allowed_model_modules)  # a spec written past the client
    with s.lock(s.keys.job_lock(job_id, page), JOB_LOCK_TIMEOUT_S):
        reader = _Reader(s, record, targets)
        for target, part in zip(targets, s.jobs.parts(job_id, [t.device_id for t in targets])):
            if part.state in TERMINAL:
                continue
            if refusal:
                _fail(job_id, part, refusal)
                continue
            try:
                view = reader.view(target, part)
                _apply(job_id, part, view, plan(view))
            except Exception as exc:  # a bug or a model this worker cannot load: fail the part, say why
                logger.exception("advancing %s/%s failed", job_id, part.device_id)
                _fail(job_id, part, f"planning failed: {type(exc).__name__}: {exc}")
    state = job_state(s.jobs.parts(job_id, [d.device_id for d in spec.devices]))
    if state not in (JobState.queued, JobState.running) and s.coordination.once(f"finished:{job_id}"):
        s.jobs.event(job_id, EventKind.finished, f"finished: {state.value}")
    return state.value


def _apply(job_id: str, part: DevicePart, view: PartView | None, decision: Decision) -> None:
    """Apply the planner's decision for one part (which the planner saw in `part.state`)."""
    s = store()
    device_id, seen = part.device_id, part.state
    if isinstance(decision, Wait):
        if decision.notice != part.waiting and s.jobs.update_part(job_id, device_id, {"waiting": decision.notice}, seen):
            if decision.device_missing:
                s.jobs.event(job_id, EventKind.device_missing, decision.notice or "", device_id)
                _release_table_claim(job_id, view, part)
        return
    if isinstance(decision, Fail):
        _fail(job_id, part, decision.reason)
        return
    if isinstance(decision, Cancel):
        s.jobs.update_part(job_id, device_id, {"state": PartState.cancelled, "reason": decision.reason, "waiting": None}, seen)
        return
    device = decision.device
    identity = {"device_type": device.device_type, "simulated": device.simulated, "control": device.control, "waiting": None}
    if isinstance(decision, Prepare):
        assert view is not None
        if not s.jobs.update_part(job_id, device_id, identity | {"state": decision.state}, seen):
            return
        if decision.stale and s.coordination.once(f"stale:{decision.table_id}:{job_id}"):
            s.jobs.event(job_id, EventKind.table_not_reused, f"table {decision.table_id} not reused: {decision.stale}", device_id)
        if decision.profile is not None:
            _ensure_table(job_id, view, decision)
        if decision.estimate is not None:
            _ensure_vector(job_id, decision)
        return
    _start_fine_tune(job_id, seen, identity, decision)


def _release_table_claim(job_id: str, view: PartView | None, part: DevicePart) -> None:
    """A part's device went missing: a profile this job claimed cannot happen there now, so
    free the table for the other jobs waiting on it (on another device of the type)."""
    if view is None or part.device_type is None:
        return
    resource = table_resource(resource_ids(view.spec, part.device_type)[0])
    if store().coordination.release_if_held_by(resource, job_id):
        notify_waiters(resource)


def _fail(job_id: str, part: DevicePart, reason: str) -> None:
    """Fail a part (which was read in `part.state`) with `reason`."""
    s = store()
    if s.jobs.update_part(job_id, part.device_id, {"state": PartState.failed, "reason": reason, "waiting": None}, part.state):
        s.jobs.event(job_id, EventKind.failed, f"failed: {reason}", part.device_id)


def _ensure_table(job_id: str, view: PartView, decision: Prepare) -> None:
    s = store()
    assert decision.profile is not None
    resource = table_resource(decision.table_id)
    s.coordination.add_waiter(resource, job_id)
    fresh = s.resources.table(decision.table_id)
    if fresh is not None and fresh != view.table:  # produced since we looked
        send(app, TaskName.advance_job, job_id)
    elif s.coordination.claim(resource, token := claim_token(job_id)):
        request = decision.profile.model_copy(update={"owner": token})
        rows = f"rows {request.batch_sizes} " if request.merge else ""
        s.jobs.event(
            job_id, EventKind.profiling,
            f"profiling {rows}{decision.table_id} on {request.device_id} ({request.options.mode})", request.device_id,
        )  # fmt: skip
        send(app, TaskName.profile_device, request, device_queue(request.device_id))


def _ensure_vector(job_id: str, decision: Prepare) -> None:
    s = store()
    assert decision.estimate is not None
    resource = vector_resource(decision.vector_key)
    s.coordination.add_waiter(resource, job_id)
    if s.resources.vector(decision.vector_key) is not None:  # produced since we looked
        send(app, TaskName.advance_job, job_id)
    elif s.coordination.claim(resource, job_id):
        s.jobs.event(job_id, EventKind.estimating, f"estimating relation vector {decision.vector_key} on the server queue")
        send(app, TaskName.estimate_relation_vector, decision.estimate)


def _start_fine_tune(job_id: str, seen: PartState, identity: dict[str, object], decision: FineTune) -> None:
    s = store()
    device_id = decision.request.device_id
    changes = identity | {
        "state": PartState.finetuning,
        "selection": decision.selection,
        "baseline1": decision.baseline1,
        "estimated_time_to_accuracy_s": decision.estimated_time_to_accuracy_s,
        "baseline1_estimated_time_to_accuracy_s": decision.baseline1_estimated_time_to_accuracy_s,
    }
    if not s.jobs.update_part(job_id, device_id, changes, seen):
        return
    if decision.baseline1_problem:
        s.jobs.event(job_id, EventKind.baseline1_unavailable, f"Baseline 1 has no configuration: {decision.baseline1_problem}", device_id)
    if s.coordination.once(f"finetune:{job_id}:{device_id}"):
        choice = decision.selection
        s.jobs.event(job_id, EventKind.selected, f"selected b={choice.batch_size} f={choice.frequency_hz} Hz; fine-tuning", device_id)
        send(app, TaskName.finetune, decision.request, device_queue(device_id))
