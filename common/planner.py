"""The job planner: what one device's part of a job needs next, as a pure function.

`plan(view) -> Decision`, with no Redis and no Celery: tasks/workflow.py reads the store into
a `PartView`, calls `plan` and applies the decision (claims, dispatches, part updates, events).

A part's states and their transitions:

    pending    -> profiling | estimating | queued | failed
    profiling  -> estimating | queued | failed       the table is ready (or failed)
    estimating -> profiling | queued | failed        the vector is ready (or failed); a table
                                                     that went stale is profiled again
    queued     -> finetuning                         the device's worker takes its fine-tune up
    finetuning -> completed | failed | cancelled     reported by the attempt running it
    any other  -> cancelled                          the job was cancelled
    completed, failed, cancelled                     final (an operator may re-queue a part)

The planner only decides; common/part_events.py holds every transition's rules and
tasks/workflow.py applies the decision as events.

A device that stops heartbeating (after it was seen) does not fail its parts at once: they
wait `spec.device_grace_s` seconds after the fleet gives it up (its heartbeat TTL) for it to come
back, then fail with the time it was last heard from.

The decisions:
- `Wait`: nothing to do now (the part is final, a task owns it, or its device is missing and
  within the grace period: `notice` says so, for `status`).
- `Fail`: the part cannot go on, with the reason (unknown device, a device gone past its grace
  period, a table or vector that failed for this job, a cap no configuration meets, nothing to
  select).
- `Prepare`: the table (`profile`) and/or the relation vector (`estimate`) are missing, or the
  table lacks rows for some of the job's batch sizes (profiled and merged into it); the part
  waits in `state` until they are produced.
- `FineTune`: both exist: the selection of the job's objective (for time to accuracy,
  edgetrain's robust equation (4)) or the target's fixed configuration, checked against the
  table, Baseline 1 for comparison, and the fine-tuning request.
- `Cancel`: the job was cancelled and no attempt runs the part: it is cancelled at once.
- `RequestCancel`: the job was cancelled while an attempt runs the part: it is asked to stop
  at its next step (it checkpoints, restores the device and reports it stopped); a part
  re-queued after the cancel runs again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from .jobs import DISPATCHED, TERMINAL, DevicePart, PartState
from .keys import table_id, vector_key
from .models import get_model
from .part_events import configuration
from .payloads import (
    FinetuneRequest,
    ProfileRequest,
    finetune_request,
    job_profile_request,
)
from .schemas import (
    DeviceInfo,
    DeviceTarget,
    EstimationRequest,
    JobSpec,
    Objective,
    ProfileTable,
    RelationVector,
    Selection,
)
from .selection import (
    Baseline1,
    Energy,
    Fixed,
    Robust,
    SelectionError,
    Strategy,
    TimeWithinEnergyBudget,
    ZeusCost,
    estimated_time_to_accuracy_s,
)
from .tables import missing_batch_sizes, reuse_problem

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartView:
    """What the planner sees of one device's part of a job, read from the store.

    `device` is None when the device has no live heartbeat in the fleet (`last_seen` is its
    last heartbeat, if it ever had one, and the fleet gives a device up `heartbeat_ttl_s` after
    it; `registered` lists the devices that are live);
    `table` and `vector` are None when not stored, and their `*_failure` say why producing
    them failed for this job; `not_before` is set when the job forces a new profile (tables
    older than it are not reused); `now` is the time of the decision."""

    job_id: str
    spec: JobSpec
    target: DeviceTarget
    part: DevicePart
    device: DeviceInfo | None
    table: ProfileTable | None = None
    vector: RelationVector | None = None
    table_failure: str | None = None
    vector_failure: str | None = None
    not_before: datetime | None = None
    registered: tuple[str, ...] = ()
    last_seen: datetime | None = None
    heartbeat_ttl_s: float = 0.0
    now: datetime | None = None
    cancelled_at: datetime | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing to do now; `notice` tells the user what the part waits for, when unusual
    (`device_missing`: its device stopped heartbeating)."""

    reason: str
    notice: str | None = None
    device_missing: bool = False


@dataclass(frozen=True)
class Fail:
    """The part fails with `reason`."""

    reason: str


@dataclass(frozen=True)
class Prepare:
    """Produce what is missing; the part waits in `state` (profiling or estimating)."""

    state: PartState
    device: DeviceInfo
    table_id: str
    vector_key: str
    profile: ProfileRequest | None = None
    estimate: EstimationRequest | None = None
    stale: str | None = None  # why the stored table is not reused


@dataclass(frozen=True)
class FineTune:
    """Both table and vector exist: fine-tune with `selection`."""

    device: DeviceInfo
    selection: Selection
    request: FinetuneRequest
    estimated_time_to_accuracy_s: float | None
    baseline1: Selection | None = None
    baseline1_estimated_time_to_accuracy_s: float | None = None
    baseline1_problem: str | None = None  # why Baseline 1 has no configuration


@dataclass(frozen=True)
class Cancel:
    """The part stops: its job was cancelled."""

    reason: str


@dataclass(frozen=True)
class RequestCancel:
    """The attempt running the part is asked to stop: its job was cancelled."""

    reason: str


Decision = Wait | Fail | Prepare | FineTune | Cancel | RequestCancel


def resource_ids(spec: JobSpec, device_type: str) -> tuple[str, str]:
    """(table id, vector key) that a part of `spec` on a device of `device_type` needs."""
    return table_id(device_type, spec.model, get_model(spec.model).input_shape), vector_key(spec.estimation_request())


def plan(view: PartView) -> Decision:
    """The next step of one device's part of a job (see the module docstring)."""
    part, target, spec = view.part, view.target, view.spec
    if part.state in TERMINAL:
        return Wait(f"part is {part.state.value}")
    if view.cancelled_at is not None and (part.requeued_at is None or part.requeued_at < view.cancelled_at):
        reason = f"cancelled at {view.cancelled_at:%Y-%m-%d %H:%M:%S} UTC"
        if part.attempt is None:
            return Cancel(reason)
        if part.cancel_requested_at is None:
            return RequestCancel(reason)
        return Wait("cancelling")
    device = view.device
    if device is None:
        return _missing_device(view)
    if part.state in DISPATCHED:
        return Wait(part.state.value, notice=None if part.device_missing else part.waiting)  # the attempt's notices stay
    tid, vkey = resource_ids(spec, device.device_type)
    table, stale, missing = view.table, None, None
    if table is not None:
        stale = reuse_problem(table, device, target.cap_at(0.0), view.not_before)
        missing = None if stale else missing_batch_sizes(table, spec.batch_sizes)
        table = None if stale or missing else table
    if table is None and view.table_failure:
        return Fail(view.table_failure)
    if view.vector is None and view.vector_failure:
        return Fail(view.vector_failure)
    if table is None or view.vector is None:
        return Prepare(
            state=PartState.profiling if table is None else PartState.estimating,
            device=device,
            table_id=tid,
            vector_key=vkey,
            profile=_profile(view, device, missing) if table is None else None,
            estimate=spec.estimation_request() if view.vector is None else None,
            stale=stale,
        )
    return _fine_tune(view, device, table, view.vector)


def _missing_device(view: PartView) -> Decision:
    device_id, seen = view.target.device_id, view.last_seen
    if seen is None:
        return Fail(f"unknown device {device_id!r}: not registered in the fleet (registered: {list(view.registered)})")
    assert view.now is not None, "a view of a missing device says when it was made"
    deadline = seen + timedelta(seconds=view.heartbeat_ttl_s + view.spec.device_grace_s)
    if view.now >= deadline:
        return Fail(
            f"device {device_id!r} disappeared at {seen:%Y-%m-%d %H:%M:%S} UTC (its last heartbeat; "
            f"it did not come back within the job's grace period of {view.spec.device_grace_s:g} s)"
        )
    return Wait(
        "device missing",
        notice=f"device {device_id!r} has not been heard from since {seen:%H:%M:%S} UTC; "
        f"the part fails at {deadline:%H:%M:%S} UTC unless it comes back",
        device_missing=True,
    )


def _profile(view: PartView, device: DeviceInfo, missing: list[int] | None) -> ProfileRequest:
    """The whole table, or only the missing rows, to be merged into the stored table."""
    request = job_profile_request(view.job_id, view.spec, view.target, device)
    return request.model_copy(update={"batch_sizes": missing, "merge": True}) if missing else request


def strategy_for(objective: Objective, target: DeviceTarget, vector: RelationVector) -> Strategy:
    """How a job selects for `target`, at the start and whenever its cap changes: the
    target's fixed configuration when it names one, else the job's objective (edgetrain's
    robust equation (4) for time to accuracy)."""
    fixed = target.configuration
    if fixed is not None:
        return Fixed(vector, fixed.batch_size, fixed.frequency_hz)
    if objective.name == "energy":
        return Energy(vector)
    if objective.name == "zeus":
        return ZeusCost(vector, objective.eta)
    if objective.name == "time_within_energy_budget":
        assert objective.energy_budget_j is not None, "the spec requires the budget with this objective"
        return TimeWithinEnergyBudget(vector, objective.energy_budget_j)
    return Robust(vector)


def _fine_tune(view: PartView, device: DeviceInfo, table: ProfileTable, vector: RelationVector) -> Decision:
    cap = view.target.cap_at(0.0)
    try:
        choice = strategy_for(view.spec.objective, view.target, vector).choose(table, cap)
    except SelectionError as exc:
        return Fail(str(exc))
    base, problem = None, None
    try:
        base = Baseline1(vector, device.power_envelope_w).choose(table, cap)
    except SelectionError as exc:
        problem = str(exc)
    why = choice.note or f"estimate T*r_b {choice.estimated_time_s:.4g} s"
    cap_text = "no cap" if cap is None else f"a {cap:g} W cap"
    baseline = configuration(base, device.control) if base else problem
    logger.info("job %s, %s under %s: planned %s with %s (%s); Baseline 1: %s; the device says if it starts otherwise",
                view.job_id, device.device_id, cap_text, configuration(choice, device.control), choice.strategy, why, baseline)  # fmt: skip
    return FineTune(
        device=device,
        selection=choice,
        request=finetune_request(view.job_id, view.spec, view.target, choice, *resource_ids(view.spec, device.device_type)),
        estimated_time_to_accuracy_s=estimated_time_to_accuracy_s(table, vector, choice),
        baseline1=base,
        baseline1_estimated_time_to_accuracy_s=None if base is None else estimated_time_to_accuracy_s(table, vector, base),
        baseline1_problem=problem,
    )
