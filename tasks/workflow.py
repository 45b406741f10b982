"""The job workflow: advances on events, never waits on a result inside a task.

`advance_job` looks at the store and does the next step of every device part: dispatch
profiling for a device type without a usable table, dispatch estimation for a missing
relation vector, and once both exist select (equation 4) and dispatch `finetune`. Tasks that
produce a table or a vector call `advance_job` for every job waiting on it. Every dispatch is
claimed in Redis first, so repeated or concurrent advances are harmless.
"""

from __future__ import annotations

from datetime import datetime

from edgetrain.common.estimation import vector_key
from edgetrain.common.models import get_model
from edgetrain.common.schemas import (
    TERMINAL,
    DeviceInfo,
    DevicePart,
    DeviceTarget,
    JobSpec,
    PartState,
    ProfileTable,
    job_state,
)
from edgetrain.common.selection import Baseline1, Equation4, SelectionError, estimated_time_to_accuracy_s
from edgetrain.common.store import PREFIX, table_id

from .app import SERVER_QUEUE, app, device_queue
from .context import store

JOB_LOCK_TIMEOUT_S = 120


def table_resource(tid: str) -> str:
    return f"table:{tid}"


def vector_resource(key: str) -> str:
    return f"vector:{key}"


def notify_waiters(resource: str) -> None:
    """A table or vector is ready (or failed): advance every job waiting for it."""
    for job_id in store().take_waiters(resource):
        advance_job.delay(job_id)


def fail_resource(resource: str, reason: str) -> None:
    """Producing a table or vector failed: record why and wake the jobs waiting for it."""
    store().fail(resource, reason)
    notify_waiters(resource)


def table_problem(
    table: ProfileTable, info: DeviceInfo, power_cap_w: float | None, not_before: datetime | None = None
) -> str | None:
    """Why a stored table cannot serve this device and cap, or None when it can.

    A table made by other software than the device runs now (edgetrain, torch, CUDA or
    JetPack versions) is not reused; nor is one older than `not_before` (a forced profile)."""
    changed = {k: (table.produced_by.get(k), v) for k, v in info.software.items() if table.produced_by.get(k) != v}
    if changed:
        return f"made by other software (table, device): {changed}"
    if table.mode == "staircase" and table.power_cap_w != power_cap_w:
        return f"staircase table for cap {table.power_cap_w} W, not {power_cap_w} W"
    if not_before is not None and table.created_at < not_before:
        return "the job asks to profile again (force)"
    return None


@app.task(name="edgetrain.advance_job")
def advance_job(job_id: str) -> str:
    s = store()
    spec = s.job_spec(job_id)
    if spec is None:
        return "unknown job"
    with s.r.lock(f"{PREFIX}:lock:job:{job_id}", timeout=JOB_LOCK_TIMEOUT_S, blocking_timeout=JOB_LOCK_TIMEOUT_S):
        for target in spec.devices:
            part = s.part(job_id, target.device_id)
            if part.state in TERMINAL or part.state == PartState.finetuning:
                continue
            _advance_part(job_id, spec, target, part)
        parts = [s.part(job_id, d.device_id) for d in spec.devices]
        state = job_state(parts)
        if {p.state for p in parts} <= TERMINAL and s.claim(f"finished:{job_id}", job_id):
            s.event(job_id, f"finished: {state.value}")
    return state.value


def _fail(job_id: str, part: DevicePart, reason: str) -> None:
    store().put_part(job_id, part.model_copy(update={"state": PartState.failed, "reason": reason}))
    store().event(job_id, f"{part.device_id}: failed: {reason}")


def _advance_part(job_id: str, spec: JobSpec, target: DeviceTarget, part: DevicePart) -> None:
    s = store()
    info = s.device(target.device_id)
    if info is None:
        known = [d.device_id for d in s.fleet()]
        _fail(job_id, part, f"unknown device {target.device_id!r}: not registered in the fleet (registered: {known})")
        return
    part = part.model_copy(update={"device_type": info.device_type, "simulated": info.simulated})
    entry = get_model(spec.model)
    tid = table_id(info.device_type, spec.model, entry.input_shape)
    vkey = vector_key(spec.estimation_request())
    table, vector = s.table(tid), s.vector(vkey)
    not_before = s.job_created_at(job_id) if spec.profiling.force else None
    if table is not None and (problem := table_problem(table, info, target.power_cap_w, not_before)):
        if s.claim(f"stale:{tid}:{job_id}", job_id):
            s.event(job_id, f"table {tid} not reused: {problem}")
        table = None
    for resource, ready in ((table_resource(tid), table), (vector_resource(vkey), vector)):
        if ready is None and (reason := s.failure(resource)):
            _fail(job_id, part, reason)
            return
    if table is None:
        _ensure_table(job_id, spec, target, info, tid, not_before)
    if vector is None:
        _ensure_vector(job_id, spec, vkey)
    if table is None or vector is None:
        state = PartState.profiling if table is None else PartState.estimating
        s.put_part(job_id, part.model_copy(update={"state": state}))
        return
    try:
        choice = Equation4(vector).choose(table, target.power_cap_w)
    except SelectionError as exc:
        _fail(job_id, part, str(exc))
        return
    try:
        base = Baseline1(vector, info.power_envelope_w).choose(table, target.power_cap_w)
    except SelectionError as exc:
        base = None
        s.event(job_id, f"{target.device_id}: Baseline 1 has no configuration: {exc}")
    part = part.model_copy(
        update={
            "state": PartState.finetuning,
            "selection": choice,
            "baseline1": base,
            "estimated_time_to_accuracy_s": estimated_time_to_accuracy_s(table, vector, choice),
            "baseline1_estimated_time_to_accuracy_s": base and estimated_time_to_accuracy_s(table, vector, base),
        }
    )
    s.put_part(job_id, part)
    if s.claim(f"finetune:{job_id}:{target.device_id}", job_id):
        s.event(job_id, f"{target.device_id}: selected b={choice.batch_size} f={choice.frequency_hz} Hz; fine-tuning")
        app.send_task("edgetrain.finetune", args=[job_id, target.device_id], queue=device_queue(target.device_id))


def _ensure_table(
    job_id: str, spec: JobSpec, target: DeviceTarget, info: DeviceInfo, tid: str, not_before: datetime | None
) -> None:
    s = store()
    resource = table_resource(tid)
    s.add_waiter(resource, job_id)
    fresh = s.table(tid)
    if fresh is not None and table_problem(fresh, info, target.power_cap_w, not_before) is None:  # produced since we looked
        advance_job.delay(job_id)
    elif s.claim(resource, job_id):
        s.event(job_id, f"profiling {tid} on {info.device_id} ({spec.profiling.mode})")
        app.send_task(
            "edgetrain.profile_device",
            kwargs={
                "device_id": info.device_id,
                "model": spec.model,
                "batch_sizes": spec.batch_sizes,
                "options": spec.profiling.model_dump(),
                "lr": spec.lr.model_dump(),
                "power_cap_w": target.power_cap_w,
            },
            queue=device_queue(info.device_id),
        )


def _ensure_vector(job_id: str, spec: JobSpec, key: str) -> None:
    s = store()
    resource = vector_resource(key)
    s.add_waiter(resource, job_id)
    if s.vector(key) is not None:  # produced since we looked
        advance_job.delay(job_id)
    elif s.claim(resource, job_id):
        s.event(job_id, f"estimating relation vector {key} on the {SERVER_QUEUE} queue")
        app.send_task("edgetrain.estimate_relation_vector", args=[spec.estimation_request().model_dump(mode="json")])
