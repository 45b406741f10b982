"""The job workflow: advances on events and never waits on a result inside a task.

`advance_job` reads each device's part of a job from the store, asks the planner
(common/planner.py) what it needs next and applies the decision: it claims and dispatches
profiling and estimation, records failures, and dispatches `finetune` once a selection is
made. Tasks that produce a table or a vector advance every job waiting on it. Claims and
once-only markers in Redis make repeated or concurrent advances harmless.
"""

from __future__ import annotations

from celery.utils.log import get_task_logger

from edgetrain.common.admission import job_refusal
from edgetrain.common.jobs import TERMINAL, DevicePart, EventKind, JobState, PartState, job_state
from edgetrain.common.keys import table_resource, vector_resource
from edgetrain.common.planner import Decision, Fail, FineTune, PartView, Prepare, Wait, plan, resource_ids
from edgetrain.common.schemas import DeviceInfo, DeviceTarget, JobSpec, ProfileTable, RelationVector
from edgetrain.common.store import Store

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
    """Producing a table or vector failed: record why and wake the jobs waiting for it."""
    logger.warning("%s failed: %s", resource, reason)
    store().coordination.fail(resource, reason)
    notify_waiters(resource)


class _Reader:
    """Reads what the planner needs, each table and vector once per advance."""

    def __init__(self, s: Store, job_id: str, spec: JobSpec, created_at: object):
        self.s, self.job_id, self.spec, self.created_at = s, job_id, spec, created_at
        self._tables: dict[str, ProfileTable | None] = {}
        self._vectors: dict[str, RelationVector | None] = {}

    def view(self, target: DeviceTarget, part: DevicePart) -> PartView:
        s = self.s
        device = s.fleet.device(target.device_id)
        if device is None:
            registered = tuple(d.device_id for d in s.fleet.devices())
            return PartView(self.job_id, self.spec, target, part, None, registered=registered)
        tid, vkey = resource_ids(self.spec, device.device_type)
        if tid not in self._tables:
            self._tables[tid] = s.resources.table(tid)
        if vkey not in self._vectors:
            self._vectors[vkey] = s.resources.vector(vkey)
        return PartView(
            self.job_id, self.spec, target, part, device,
            table=self._tables[tid],
            vector=self._vectors[vkey],
            table_failure=s.coordination.failure(table_resource(tid)),
            vector_failure=s.coordination.failure(vector_resource(vkey)),
            not_before=self.created_at if self.spec.profiling.force else None,  # type: ignore[arg-type]
        )  # fmt: skip


@app.task(name=TaskName.advance_job.value)
def advance_job(job_id: str) -> str:
    """Do the next step of every device part of job `job_id`; returns the job's state."""
    s = store()
    record = s.jobs.record(job_id)
    if record is None:
        logger.warning("advance_job: no job %s", job_id)
        return "unknown job"
    spec = record.spec
    refusal = job_refusal(spec, settings().allowed_model_modules)  # a spec written past the client
    with s.lock(s.keys.job_lock(job_id), JOB_LOCK_TIMEOUT_S):
        reader = _Reader(s, job_id, spec, record.created_at)
        ids = [d.device_id for d in spec.devices]
        for target, part in zip(spec.devices, s.jobs.parts(job_id, ids)):
            if part.state in TERMINAL or part.state == PartState.finetuning:
                continue
            if refusal:
                _fail(job_id, part, refusal)
                continue
            view = reader.view(target, part)
            _apply(job_id, part, view, plan(view))
        parts = s.jobs.parts(job_id, ids)
        state = job_state(parts)
        if state not in (JobState.queued, JobState.running) and s.coordination.once(f"finished:{job_id}"):
            s.jobs.event(job_id, EventKind.finished, f"finished: {state.value}")
    return state.value


def _apply(job_id: str, part: DevicePart, view: PartView, decision: Decision) -> None:
    s = store()
    device_id = part.device_id
    if isinstance(decision, Wait):
        return
    if isinstance(decision, Fail):
        _fail(job_id, part, decision.reason)
        return
    known = _identify(part, decision.device)
    if isinstance(decision, Prepare):
        s.jobs.put_part(job_id, known.model_copy(update={"state": decision.state}))
        if decision.stale and s.coordination.once(f"stale:{decision.table_id}:{job_id}"):
            s.jobs.event(job_id, EventKind.table_not_reused, f"table {decision.table_id} not reused: {decision.stale}", device_id)
        if decision.profile is not None:
            _ensure_table(job_id, view, decision)
        if decision.estimate is not None:
            _ensure_vector(job_id, decision)
        return
    _start_fine_tune(job_id, known, decision)


def _fail(job_id: str, part: DevicePart, reason: str) -> None:
    s = store()
    s.jobs.put_part(job_id, part.model_copy(update={"state": PartState.failed, "reason": reason}))
    s.jobs.event(job_id, EventKind.failed, f"failed: {reason}", part.device_id)


def _identify(part: DevicePart, device: DeviceInfo) -> DevicePart:
    return part.model_copy(update={"device_type": device.device_type, "simulated": device.simulated})


def _ensure_table(job_id: str, view: PartView, decision: Prepare) -> None:
    s = store()
    assert decision.profile is not None
    resource = table_resource(decision.table_id)
    s.coordination.add_waiter(resource, job_id)
    fresh = s.resources.table(decision.table_id)
    if fresh is not None and fresh != view.table:  # produced since we looked
        send(app, TaskName.advance_job, job_id)
    elif s.coordination.claim(resource, job_id):
        request = decision.profile
        s.jobs.event(
            job_id, EventKind.profiling,
            f"profiling {decision.table_id} on {request.device_id} ({request.options.mode})", request.device_id,
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


def _start_fine_tune(job_id: str, part: DevicePart, decision: FineTune) -> None:
    s = store()
    device_id = part.device_id
    if decision.baseline1_problem:
        s.jobs.event(job_id, EventKind.baseline1_unavailable, f"Baseline 1 has no configuration: {decision.baseline1_problem}", device_id)
    s.jobs.put_part(
        job_id,
        part.model_copy(
            update={
                "state": PartState.finetuning,
                "selection": decision.selection,
                "baseline1": decision.baseline1,
                "estimated_time_to_accuracy_s": decision.estimated_time_to_accuracy_s,
                "baseline1_estimated_time_to_accuracy_s": decision.baseline1_estimated_time_to_accuracy_s,
            }
        ),
    )
    if s.coordination.once(f"finetune:{job_id}:{device_id}"):
        choice = decision.selection
        s.jobs.event(job_id, EventKind.selected, f"selected b={choice.batch_size} f={choice.frequency_hz} Hz; fine-tuning", device_id)
        send(app, TaskName.finetune, decision.request, device_queue(device_id))
