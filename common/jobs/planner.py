"""The job planner: what one device's part of a job needs next, as a pure function.

`plan(view) -> Step`, with no Redis and no Celery: tasks/workflow.py reads the store into a
`PartView`, calls `plan`, applies the step's event to the part (common/jobs/events.py decides
whether it applies) and, when it applied, carries out the step's effects (common/jobs/effects.py).

A part's states and their transitions:

    pending    -> profiling | estimating | queued | failed
    profiling  -> estimating | queued | failed       the table is ready (or failed)
    estimating -> profiling | queued | failed        the vector is ready (or failed); a table
                                                     that went stale is profiled again
    queued     -> finetuning                         the device's worker takes its fine-tune up
    finetuning -> completed | failed | cancelled     reported by the attempt running it; queued
                                                     again when the attempt is lost or stopped;
                                                     failed when its device is gone past its grace
    any other  -> cancelled                          the job was cancelled
    completed, failed, cancelled                     final (an operator may re-queue a part:
                                                     pending again; a queued one too)

(common/jobs/events.py has every transition with the event that makes it.)

A device that stops heartbeating (after it was seen) does not fail its parts at once: they
wait `spec.device_grace_s` seconds after the fleet gives it up (its heartbeat TTL) for it to come
back, then fail with the time it was last heard from. A device that has not registered yet gets
the same grace from the job's submission (or the part's re-queue): its worker may start after
the job was submitted (`AwaitDevice`: the reaper advances the job when it registers, or then);
then the part fails as an unknown device.

The steps:
- nothing (no event) for a final part, or one whose cancel is asked for already;
- `Waiting` while a task owns the part or its device is missing or not registered yet within the
  grace period (the notice says so, for `status`; a table claim the job holds on that device is
  released);
- `Failed` when the part cannot go on, with the reason (a device unknown or gone past its grace
  period, a table or vector that failed for this job, a cap no configuration meets);
- `Prepared` while the table (`ClaimAndProfile`: the whole table, or the rows it lacks, merged
  into it; common/tables.py `table_need`) and/or the relation vector (`ClaimAndEstimate`) are
  produced;
- `Dispatched` with `SendFineTune` once both exist: the selection of the job's objective (for
  time to accuracy, edgetrain's robust equation (4)) or the target's fixed configuration,
  checked against the table, Baseline 1 for comparison, and the fine-tuning request;
- `Cancelled` when the job was cancelled and no attempt runs the part; `CancelRequested` when
  an attempt runs it (it stops at its next step: it checkpoints, restores the device and reports
  it stopped); a part re-queued after the cancel runs again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..keys import table_id, vector_key
from ..models import get_model
from ..payloads import ProfileRequest, finetune_request, job_profile_request
from ..schemas import DeviceInfo, DeviceTarget, JobSpec, ProfileTable, RelationVector
from ..selection import Baseline1, SelectionError, estimated_time_to_accuracy_s, strategy_for
from ..tables import NoTable, Profile, table_need
from .effects import AwaitDevice, ClaimAndEstimate, ClaimAndProfile, Effect, Note, ReleaseTableClaim, SendFineTune
from .events import Cancelled, CancelRequested, Dispatched, Failed, Identified, PartEvent, Prepared, Waiting, configuration
from .state import DISPATCHED, TERMINAL, DevicePart, EventKind, PartState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartView:
    """What the planner sees of one device's part of a job, read from the store.

    `device` is None when the device has no live heartbeat in the fleet (`last_seen` is its
    last heartbeat, if it ever had one, and the fleet gives a device up `heartbeat_ttl_s` after
    it; `registered` lists the devices that are live; `submitted_at`: when the job was);
    `table` and `vector` are None when not stored, and their `*_failure` say why producing
    them failed for this job; `not_before` is set when the job forces a new profile (tables
    older than it are not reused); `now` is the time of the decision; `token` names the
    fine-tune this step would dispatch (a fresh task id)."""

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
    token: str = ""
    submitted_at: datetime | None = None


@dataclass(frozen=True)
class Step:
    """The event to apply to the part (None: nothing changes) and what to do once it applied."""

    event: PartEvent | None
    effects: tuple[Effect, ...] = ()


def resource_ids(spec: JobSpec, device_type: str) -> tuple[str, str]:
    """(table id, vector key) that a part of `spec` on a device of `device_type` needs."""
    return table_id(device_type, spec.model, get_model(spec.model).input_shape), vector_key(spec.estimation_request())


def plan(view: PartView) -> Step:
    """The next step of one device's part of a job (see the module docstring)."""
    part, target, spec = view.part, view.target, view.spec
    if part.state in TERMINAL:
        return Step(None)
    if view.cancelled_at is not None and (part.requeued_at is None or part.requeued_at < view.cancelled_at):
        reason = f"cancelled at {view.cancelled_at:%Y-%m-%d %H:%M:%S} UTC"
        if part.attempt is None:
            return Step(Cancelled(reason=reason))
        return Step(CancelRequested(reason=reason) if part.cancel_requested_at is None else None)
    device = view.device
    if device is None:
        return _missing_device(view)
    if part.state in DISPATCHED:
        return Step(Waiting(notice=None if part.device_missing else part.waiting))  # the attempt's notices stay
    tid, vkey = resource_ids(spec, device.device_type)
    need = table_need(view.table, device, spec.batch_sizes, target.cap_at(0.0), view.table_failure, view.not_before)
    if isinstance(need, NoTable):
        return Step(Failed(reason=need.reason))
    if view.vector is None and view.vector_failure:
        return Step(Failed(reason=view.vector_failure))
    identity = Identified(device_type=device.device_type, simulated=device.simulated, control=device.control)
    if isinstance(need, Profile) or view.vector is None:
        effects: list[Effect] = []
        if isinstance(need, Profile):
            if need.why is not None:
                effects.append(Note(f"stale:{tid}:{view.job_id}", EventKind.table_not_reused, f"table {tid} not reused: {need.why}",
                                    device.device_id))  # fmt: skip
            effects.append(ClaimAndProfile(tid, _profile(view, device, need), need.stored_at))
        if view.vector is None:
            effects.append(ClaimAndEstimate(vkey, spec.estimation_request()))
        state = PartState.profiling if isinstance(need, Profile) else PartState.estimating
        return Step(Prepared(state=state, device=identity), tuple(effects))
    return _fine_tune(view, device, identity, need.table, view.vector)


UNREGISTERED = "not registered in the fleet"  # in the reason of a part whose device never registered


def never_registered(reason: str | None) -> bool:
    """Whether `reason` (a failed part's) says that its device never registered."""
    return reason is not None and reason.startswith("unknown device ") and UNREGISTERED in reason


def _missing_device(view: PartView) -> Step:
    device_id, seen = view.target.device_id, view.last_seen
    assert view.now is not None, "a view of a missing device says when it was made"
    if seen is None:
        return _unregistered_device(view)
    deadline = seen + timedelta(seconds=view.heartbeat_ttl_s + view.spec.device_grace_s)
    if view.now >= deadline:
        return Step(Failed(
            reason=f"device {device_id!r} disappeared at {seen:%Y-%m-%d %H:%M:%S} UTC (its last heartbeat; "
            f"it did not come back within the job's grace period of {view.spec.device_grace_s:g} s)"
        ))  # fmt: skip
    notice = (f"device {device_id!r} has not been heard from since {seen:%H:%M:%S} UTC; "
              f"the part fails at {deadline:%H:%M:%S} UTC unless it comes back")  # fmt: skip
    device_type = view.part.device_type  # a profile it claimed cannot happen there now: free the table for the others
    release = (ReleaseTableClaim(resource_ids(view.spec, device_type)[0]),) if device_type else ()
    return Step(Waiting(notice=notice, device_missing=True), release)


def _unregistered_device(view: PartView) -> Step:
    """A device never heard from waits the job's grace from the submission (or the re-queue)."""
    assert view.now is not None
    device_id, grace = view.target.device_id, view.spec.device_grace_s
    since = max((t for t in (view.submitted_at, view.part.requeued_at) if t is not None), default=view.now)
    deadline = since + timedelta(seconds=grace)
    if view.now >= deadline:
        return Step(Failed(reason=f"unknown device {device_id!r}: {UNREGISTERED} within the job's grace period of {grace:g} s "
                           f"(registered: {list(view.registered)})"))  # fmt: skip
    notice = (f"device {device_id!r} is {UNREGISTERED} (yet); the part fails at {deadline:%H:%M:%S} UTC unless its worker "
              "starts (`edgetrain worker device --device-id ...`)")  # fmt: skip
    return Step(Waiting(notice=notice, device_missing=True), (AwaitDevice(device_id, deadline),))


def _profile(view: PartView, device: DeviceInfo, need: Profile) -> ProfileRequest:
    """The whole table, or only the missing rows, to be merged into the stored table."""
    request = job_profile_request(view.job_id, view.spec, view.target, device)
    return request.model_copy(update={"batch_sizes": need.rows, "merge": True}) if need.merge else request


def _fine_tune(view: PartView, device: DeviceInfo, identity: Identified, table: ProfileTable, vector: RelationVector) -> Step:
    cap = view.target.cap_at(0.0)
    try:
        choice = strategy_for(view.spec.objective, vector, view.target.configuration).choose(table, cap)
    except SelectionError as exc:
        return Step(Failed(reason=str(exc)))
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
    request = finetune_request(view.job_id, view.spec, view.target, choice, *resource_ids(view.spec, device.device_type))
    dispatched = Dispatched(
        device=identity, token=view.token, request=request, selection=choice,
        estimated_time_to_accuracy_s=estimated_time_to_accuracy_s(table, vector, choice), baseline1=base,
        baseline1_estimated_time_to_accuracy_s=None if base is None else estimated_time_to_accuracy_s(table, vector, base),
    )  # fmt: skip
    effects: list[Effect] = [SendFineTune(view.token, request, device.control)]
    if problem:
        effects.append(Note(f"baseline1:{view.job_id}:{device.device_id}:{view.token}", EventKind.baseline1_unavailable,
                            f"Baseline 1 has no configuration: {problem}", device.device_id))  # fmt: skip
    return Step(dispatched, tuple(effects))
