"""The control worker's side of a federated job: rounds driven event by event.

`federated_advance` runs on every event of a job (submitted, an update arrived, a round
aggregated, a table profiled, the reaper seeing a deadline pass) and never waits in a task:
it opens a round (participants, each one's (b, f*_b) and local steps: common/federated/plan.py)
and sends each participant its `federated_train` task; it closes the round once every
update is in or its deadline passed, and sends `federated_aggregate` to the server pool;
after an aggregated round it finishes the job or opens the next. A lock per job serialises
advances, and the store's transactions make a repeated advance harmless."""

from __future__ import annotations

from datetime import timedelta

from celery.utils.log import get_task_logger

from edgetrain.common.federated.plan import Assignment, DeviceInRound, assign, participants
from edgetrain.common.federated.records import FINAL, AggregateRequest, FederatedRecord, FederatedState, TrainRequest
from edgetrain.common.jobs import EventKind, JobEvent
from edgetrain.common.keys import table_id, table_resource
from edgetrain.common.models import get_model
from edgetrain.common.payloads import profile_request
from edgetrain.common.schemas import DeviceInfo, ProfileTable, ProfilingOptions, utc_now
from edgetrain.common.store import claim_token
from edgetrain.common.store.federated import Refused

from .app import app
from .context import store
from .contract import TaskName, device_queue, send, send_again, send_tracked, to_track

logger = get_task_logger(__name__)
EMPTY_ROUNDS = 3  # rounds in a row without an update after which a job fails
LOCK_TIMEOUT_S = 30  # an advance takes milliseconds; a killed worker's lock frees itself after this (s)


@app.task(name=TaskName.federated_advance.value)
def federated_advance(job_id: str) -> str:
    """Take the federated job `job_id` one step further; returns its phase."""
    s = store()
    record = s.federated.record(job_id)
    if record is None:
        logger.warning("federated_advance: no federated job %s", job_id)
        return "unknown job"
    with s.lock(s.keys.federated(job_id) + ":lock", LOCK_TIMEOUT_S):
        state = s.federated.state(job_id)
        assert state is not None
        if state.phase in FINAL or state.phase == "aggregating":
            return state.phase
        try:
            if state.phase == "training":
                return _maybe_close(record, state)
            return _next_round(record, state)
        except Exception as exc:  # a bug, or a record this worker cannot plan: fail the job, saying why
            logger.exception("advancing federated job %s failed", job_id)
            return fail(job_id, f"planning failed: {type(exc).__name__}: {exc}")


def _maybe_close(record: FederatedRecord, state: FederatedState) -> str:
    """Close the open round once every assigned update is in, or its deadline passed."""
    s, job_id = store(), record.job_id
    arrived = set(s.federated.updates(job_id, state.round))
    missing = sorted({a.device_id for a in state.assignments} - arrived)
    overdue = state.deadline_at is not None and utc_now() >= state.deadline_at
    if missing and not overdue:
        return state.phase
    aggregation = to_track(TaskName.federated_aggregate, AggregateRequest(job_id=job_id, round=state.round), job_id=job_id)
    try:  # closed and the aggregation written down together: a crash before it is sent leaves it to the reaper
        closed = s.federated.close_round(job_id, state.round, lambda p: s.ledger.write(p, aggregation))
    except Refused:
        return state.phase
    late = sorted({a.device_id for a in state.assignments} - set(closed.closed_with))
    note = f"; no update from {', '.join(late)} by the deadline" if late else ""
    s.federated.event(job_id, EventKind.federated_round, f"round {state.round} closed with {len(closed.closed_with)} updates{note}")
    send_again(app, aggregation)
    return closed.phase


def fail(job_id: str, reason: str) -> str:
    """End the federated job as failed with `reason` (unless it has finished already)."""
    return _finish(job_id, "failed", reason)


def _finish(job_id: str, phase: str, reason: str) -> str:
    def decide(state: FederatedState, _: object) -> FederatedState:
        if state.phase in FINAL:
            raise Refused(f"federated job {job_id} has finished ({state.phase})")
        return state.model_copy(update={"phase": phase, "reason": reason, "assignments": [], "notice": None})

    kind = EventKind.completed if phase == "completed" else EventKind.failed
    try:
        store().federated.change(job_id, decide, JobEvent(kind=kind, message=reason))
    except Refused:
        pass
    return phase


def _next_round(record: FederatedRecord, state: FederatedState) -> str:
    """After round `state.round` (0: none yet): finish the job, or open the next round."""
    s, spec, job_id = store(), record.spec, record.job_id
    accuracy = f"{state.accuracy:.4f}" if state.accuracy is not None else "none"
    if state.accuracy is not None and state.accuracy >= spec.target_accuracy:
        return _finish(job_id, "completed", f"global accuracy {accuracy} reached the target {spec.target_accuracy} in round {state.round}")
    if state.empty_rounds >= EMPTY_ROUNDS:
        return _finish(job_id, "failed", f"no device handed in an update in {EMPTY_ROUNDS} rounds in a row (the events say why)")
    if state.round >= spec.max_rounds:
        why = f"the target {spec.target_accuracy} was not reached in {spec.max_rounds} rounds (global accuracy {accuracy})"
        return _finish(job_id, "failed", why)
    live = s.fleet.devices_by_id([d.device_id for d in spec.devices])
    if not live:
        return _wait(job_id, "no device of the job is heard from: the next round starts when one is")
    shape = get_model(spec.model).input_shape
    tables = {d.device_type: s.resources.table(table_id(d.device_type, spec.model, shape)) for d in live.values()}
    ready = {t: table for t, table in tables.items() if table is not None}
    if missing := sorted(set(tables) - set(ready)):
        _profile(record, [next(d for d in live.values() if d.device_type == t) for t in missing])
        return _wait(job_id, f"waiting for the lookup tables of {', '.join(missing)}")
    r = state.round + 1
    taking_part = participants([d.device_id for d in spec.devices if d.device_id in live], spec.participation.fraction, spec.seed, r)
    try:
        plan = assign([_in_round(record, live[d], ready[live[d].device_type], r) for d in taking_part], spec.local)
    except ValueError as exc:
        return _finish(job_id, "failed", f"round {r}: {exc}")
    deadline = utc_now() + timedelta(seconds=spec.participation.deadline_s)

    def decide(now: FederatedState, _: object) -> FederatedState:
        if now.round != state.round or now.phase not in ("starting", "aggregated"):
            raise Refused(f"round {r} is already open")
        return now.model_copy(update={"phase": "training", "round": r, "assignments": plan, "deadline_at": deadline,
                                      "closed_with": [], "notice": None})  # fmt: skip

    try:
        s.federated.change(job_id, decide, JobEvent(kind=EventKind.federated_round, message=_opened(r, plan, live)))
    except Refused:
        return "training"
    for a in plan:
        request = TrainRequest(job_id=job_id, round=r, device_id=a.device_id, batch_size=a.batch_size, frequency_hz=a.frequency_hz,
                               local_steps=a.local_steps)  # fmt: skip
        send(app, TaskName.federated_train, request, device_queue(a.device_id), setting=live[a.device_id].control.describe(a.frequency_hz))
    return "training"


def _in_round(record: FederatedRecord, device: DeviceInfo, table: ProfileTable, r: int) -> DeviceInRound:
    """A participant of round `r` with its cap: one set on the device (`edgetrain cap`) since
    the job was submitted, else the spec's for that round."""
    set_on_device = store().fleet.power_cap(device.device_id)
    if set_on_device is not None and set_on_device.set_at > record.created_at:
        cap = set_on_device.power_cap_w
    else:
        cap = next(d for d in record.spec.devices if d.device_id == device.device_id).cap_in(r)
    return DeviceInRound(device.device_id, device.device_type, cap, table, device.power_envelope_w)


def _opened(r: int, plan: list[Assignment], live: dict[str, DeviceInfo]) -> str:
    setting = {a.device_id: live[a.device_id].control.describe(a.frequency_hz) for a in plan}
    each = ", ".join(f"{a.device_id} b={a.batch_size} f={setting[a.device_id]} x{a.local_steps}" for a in plan)
    return f"round {r} opened: {each}"


def _wait(job_id: str, notice: str) -> str:
    state = store().federated.state(job_id)
    if state is not None and state.notice != notice:
        store().federated.change(job_id, lambda now, _: now.model_copy(update={"notice": notice}))
    return "waiting"


def _profile(record: FederatedRecord, devices: list[DeviceInfo]) -> None:
    """Have each device profile the model for its type (once: the claim is shared with jobs);
    the job is advanced when the table is stored."""
    s, spec = store(), record.spec
    for device in devices:
        resource = table_resource(table_id(device.device_type, spec.model, get_model(spec.model).input_shape))
        s.coordination.add_waiter(resource, record.job_id)
        if s.coordination.claim(resource, token := claim_token(record.job_id)):
            request = profile_request(device, token, spec.model, spec.batch_sizes, ProfilingOptions(), None)
            s.federated.event(record.job_id, EventKind.profiling, f"profiling {spec.model} on {device.device_id}", device.device_id)
            send_tracked(app, s.ledger, TaskName.profile_device, request, device_queue(device.device_id), record.job_id)

