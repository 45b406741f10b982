"""A part's transitions: typed events in, one pure function deciding the change.

Whoever sees something happen to a device's part of a job reports it as an event: the planner
(the control worker), the attempt running the part's fine-tune (the device worker), the reaper
(a lost attempt) and an operator (through the client). `transition(part, event, now)` returns
the part after the event with a line for the job's log, or raises `Refused` saying why the
event does not apply: a state it cannot move from, a stale attempt, a forged dispatch.
`JobStore.apply` runs it inside one Redis transaction; nothing else writes a part.

    pending | profiling | estimating
        --Prepared-->          profiling | estimating      the table or vector is missing
        --Dispatched-->        queued                      (b, f) selected, fine-tune sent to the device's queue
    queued
        --AttemptStarted-->    finetuning, attempt set     the dispatched request, taken up by the device
        --Redispatched-->      queued                      no task was found for it: sent again
    finetuning
        --AttemptSelected-->   finetuning                  it trains at another (b, f) than the plan, and why
        --AttemptNoticed-->    finetuning                  the attempt's notice (a pause) for status
        --AttemptLost-->       queued, attempt cleared     its process stopped; the task is handed on
        --AttemptStopped-->    queued, attempt cleared     its worker stopped it; the task is re-queued
        --AttemptFinished-->   completed                   a report consistent with the dispatch
        --AttemptFailed-->     failed
        --AttemptCancelled-->  cancelled                   it stopped: a cancel or an operator's revoke
        --CancelRequested-->   finetuning                  the live attempt stops at its next step
    any state but a final one
        --Waiting-->           same state, notice for status
        --Failed-->            failed
        --Cancelled-->         cancelled                   no live attempt runs it
    failed | cancelled | queued
        --Requeued-->          pending                     planned again (a checkpoint is kept)

An attempt event names its attempt's token, and a part accepts it only from the attempt it
holds, so a worker that was frozen and replaced cannot change the part again."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from ..control_axis import ControlAxis
from ..payloads import FinetuneRequest
from ..schemas import RunReport, Selection, Strict
from .reports import completed_message
from .state import TERMINAL, Attempt, DevicePart, Dispatch, EventField, EventKind, PartState, Refused, Started


class ReportMismatch(Refused):
    """A finished attempt's report is not what the dispatched fine-tune could produce."""


class _Event(Strict):
    pass


class Identified(Strict):
    """The device's identity as the planner saw it, recorded with the part's next state."""

    device_type: str
    simulated: bool
    control: ControlAxis


class Waiting(_Event):
    """The part waits; `notice` says on what, when that is unusual (None clears it)."""

    kind: Literal["waiting"] = "waiting"
    notice: str | None
    device_missing: bool = False


class Prepared(_Event):
    """The table or the vector is missing: the part waits in `state` while it is produced."""

    kind: Literal["prepared"] = "prepared"
    state: Literal[PartState.profiling, PartState.estimating]
    device: Identified


class Dispatched(_Event):
    """(b, f) is selected and the fine-tune is sent with task id `token`."""

    kind: Literal["dispatched"] = "dispatched"
    device: Identified
    token: str
    request: FinetuneRequest
    selection: Selection
    estimated_time_to_accuracy_s: float | None
    baseline1: Selection | None = None
    baseline1_estimated_time_to_accuracy_s: float | None = None


class Failed(_Event):
    """The part cannot go on (the planner's decision, or an attempt that died with the reason
    before it could say so: `attempt` then names it; a task stopped from outside names its
    `dispatch`, and the event applies only while the part runs that dispatch)."""

    kind: Literal["failed"] = "failed"
    reason: str
    attempt: str | None = None
    dispatch: str | None = None


class Cancelled(_Event):
    """The part stops without a live attempt: its job was cancelled, or its task revoked (then
    `dispatch` names the task, and the event applies only while the part runs that dispatch)."""

    kind: Literal["cancelled"] = "cancelled"
    reason: str
    dispatch: str | None = None


class CancelRequested(_Event):
    """The job was cancelled while an attempt runs the part: it stops at its next step."""

    kind: Literal["cancel_requested"] = "cancel_requested"
    reason: str


class Requeued(_Event):
    """An operator plans the part again."""

    kind: Literal["requeued"] = "requeued"


class Redispatched(_Event):
    """For longer than a lease, nothing ran the dispatched fine-tune and no message of it
    waited on its queue: `outcome` says how it was sent on (its unacknowledged message put
    back, or sent again under the same token)."""

    kind: Literal["redispatched"] = "redispatched"
    token: str
    outcome: str
    seen_at: datetime = Field(description="when the dispatch the reaper found was last sent: another reaper's send since refuses this one")


class AttemptStarted(_Event):
    """A worker starts running the fine-tune dispatched as `dispatch`, with the request whose
    digest is `digest`; `lost_device_time_s` and `lost_energy_j` are what the previous attempt
    did after its last checkpoint (lost with it), read from its progress written at `lost_at`
    (a progress counted once already, by an attempt that died before writing its own, counts
    nothing)."""

    kind: Literal["attempt_started"] = "attempt_started"
    dispatch: str
    digest: str
    attempt: str
    node: str
    lost_device_time_s: float = Field(0.0, ge=0)
    lost_energy_j: float = Field(0.0, ge=0)
    lost_at: datetime | None = Field(None, description="when the progress the lost work was read from was written")
    resumed_at_samples: int | None = None


class AttemptSelected(_Event):
    """The running attempt trains from its first step at another configuration than the
    dispatched one (`started` says which and why)."""

    kind: Literal["attempt_selected"] = "attempt_selected"
    attempt: str
    started: Started


class AttemptNoticed(_Event):
    """The running attempt's notice for status (e.g. paused: no configuration meets the cap)."""

    kind: Literal["attempt_noticed"] = "attempt_noticed"
    attempt: str
    notice: str | None


class AttemptLost(_Event):
    """The process running the attempt stopped (its lease expired); `outcome` says how its
    task was handed on."""

    kind: Literal["attempt_lost"] = "attempt_lost"
    attempt: str
    outcome: str


class AttemptStopped(_Event):
    """The attempt's worker stopped it (a warm shutdown): its checkpoint is kept and the task
    re-queued, to continue when a worker serves the device again."""

    kind: Literal["attempt_stopped"] = "attempt_stopped"
    attempt: str
    reason: str


class AttemptFinished(_Event):
    """The attempt ran to the target or the budget."""

    kind: Literal["attempt_finished"] = "attempt_finished"
    attempt: str
    report: RunReport


class AttemptFailed(_Event):
    """The attempt failed with `reason`."""

    kind: Literal["attempt_failed"] = "attempt_failed"
    attempt: str
    reason: str


class AttemptCancelled(_Event):
    """The attempt stopped: its job was cancelled or its task revoked (`reason`)."""

    kind: Literal["attempt_cancelled"] = "attempt_cancelled"
    attempt: str
    reason: str


PartEvent = Annotated[
    Waiting | Prepared | Dispatched | Failed | Cancelled | CancelRequested | Requeued | Redispatched | AttemptStarted
    | AttemptSelected | AttemptNoticed | AttemptLost | AttemptStopped | AttemptFinished | AttemptFailed | AttemptCancelled,
    Field(discriminator="kind"),
]  # fmt: skip


class Change(Strict):
    """What an event does: the part after it, and the line it adds to the job's log (if any),
    with its typed fields."""

    part: DevicePart
    kind: EventKind | None = None
    message: str | None = None
    fields: dict[str, EventField] = Field(default_factory=dict)


def transition(part: DevicePart, event: PartEvent, now: datetime) -> Change:
    """The part after `event` (see the module docstring); Refused when it does not apply."""
    return _RULES.get(type(event), _attempt_transition)(part, event, now)


def _waiting(part: DevicePart, event: Waiting, now: datetime) -> Change:
    _open(part, event)
    kind = EventKind.device_missing if event.device_missing and event.notice else None
    return _change(part, now, {"waiting": event.notice, "device_missing": event.device_missing}, kind, event.notice)


def _prepared(part: DevicePart, event: Prepared, now: datetime) -> Change:
    _expect(part, event, PartState.pending, PartState.profiling, PartState.estimating)
    return _change(part, now, {"state": event.state, "waiting": None, **event.device.model_dump()})


def _dispatched(part: DevicePart, event: Dispatched, now: datetime) -> Change:
    _expect(part, event, PartState.pending, PartState.profiling, PartState.estimating)
    choice = event.selection
    return _change(
        part, now,
        {
            "state": PartState.queued, "waiting": None, **event.device.model_dump(),
            "dispatch": Dispatch(token=event.token, request=event.request, at=now), "attempt": None,
            "selection": choice, "started": None, "estimated_time_to_accuracy_s": event.estimated_time_to_accuracy_s,
            "baseline1": event.baseline1,
            "baseline1_estimated_time_to_accuracy_s": event.baseline1_estimated_time_to_accuracy_s,
        },
        EventKind.selected, f"selected {configuration(choice, event.device.control)}; queued on the device",
        {"batch_size": choice.batch_size, "frequency_hz": choice.frequency_hz},
    )  # fmt: skip


def _failed(part: DevicePart, event: Failed, now: datetime) -> Change:
    _open(part, event)
    _dispatched_as(part, event.dispatch)
    if event.attempt is not None:
        _held(part, event.attempt)
    return _final(part, now, PartState.failed, event.reason, EventKind.failed, f"failed: {event.reason}")


def _cancelled(part: DevicePart, event: Cancelled, now: datetime) -> Change:
    _open(part, event)
    _dispatched_as(part, event.dispatch)
    if part.attempt is not None:
        raise Refused(f"an attempt runs the part ({part.attempt.node}): it is asked to stop instead")
    return _final(part, now, PartState.cancelled, event.reason, EventKind.cancelled, event.reason)


def _cancel_requested(part: DevicePart, event: CancelRequested, now: datetime) -> Change:
    _open(part, event)
    if part.attempt is None:
        raise Refused("no attempt runs the part: it is cancelled at once instead")
    if part.cancel_requested_at is not None:
        raise Refused("cancelling was asked for already")
    return _change(part, now, {"cancel_requested_at": now, "waiting": "cancelled: the fine-tune stops at its next step"})


def _requeued(part: DevicePart, event: Requeued, now: datetime) -> Change:
    if part.state == PartState.completed:
        raise Refused("it completed: submit the job again to fine-tune anew")
    if part.state in (PartState.pending, PartState.profiling, PartState.estimating):
        raise Refused(f"it is {part.state.value} and goes on by itself")
    if part.attempt is not None:
        raise Refused(f"an attempt runs it on {part.attempt.node}: cancel the job first, or wait")
    changes = {
        "state": PartState.pending, "reason": None, "waiting": None, "selection": None, "started": None, "baseline1": None,
        "estimated_time_to_accuracy_s": None, "baseline1_estimated_time_to_accuracy_s": None, "report": None,
        "dispatch": None, "cancel_requested_at": None, "requeued_at": now,
    }  # fmt: skip
    return _change(part, now, changes, EventKind.requeued, "re-queued")


def _redispatched(part: DevicePart, event: Redispatched, now: datetime) -> Change:
    _expect(part, event, PartState.queued)
    if part.dispatch is None or part.dispatch.token != event.token:
        raise Refused("the dispatch moved on")
    if part.dispatch.at != event.seen_at:
        raise Refused("sent on already")
    return _change(part, now, {"dispatch": part.dispatch.model_copy(update={"at": now})}, EventKind.attempt_lost,
                   f"nothing ran the fine-tune and none of its messages waited on its queue: {event.outcome}")  # fmt: skip


_RULES: dict[type, Callable[[DevicePart, Any, datetime], Change]] = {
    Waiting: _waiting, Prepared: _prepared, Dispatched: _dispatched, Failed: _failed, Cancelled: _cancelled,
    CancelRequested: _cancel_requested, Requeued: _requeued, Redispatched: _redispatched,
}  # fmt: skip  # the attempt's own events: _attempt_transition


AttemptEvent = (
    AttemptStarted | AttemptSelected | AttemptNoticed | AttemptLost | AttemptStopped | AttemptFinished | AttemptFailed
    | AttemptCancelled
)  # fmt: skip


def _attempt_transition(part: DevicePart, event: AttemptEvent, now: datetime) -> Change:
    """An event of the attempt that runs the part: it starts it, or it holds the part."""
    if isinstance(event, AttemptStarted):
        return _attempt_started(part, event, now)
    _expect(part, event, PartState.finetuning)
    _held(part, event.attempt)
    if isinstance(event, AttemptSelected):
        assert part.selection is not None and part.control is not None, "a part with an attempt was dispatched"
        chosen = event.started.selection
        message = (f"trains at {configuration(chosen, part.control)}, not the planned {configuration(part.selection, part.control)}"
                   f": {chosen.note or 'chosen on the device'}")  # fmt: skip
        return _change(part, now, {"started": event.started}, EventKind.started, message)
    if isinstance(event, AttemptNoticed):
        return _change(part, now, {"waiting": event.notice})
    if isinstance(event, AttemptLost):
        message = f"the worker running the fine-tune ({_node(part)}) stopped; {event.outcome}"
        changes = {"state": PartState.queued, "attempt": None, "waiting": f"attempt lost: {event.outcome}"}
        return _change(part, now, changes, EventKind.attempt_lost, message)
    if isinstance(event, AttemptStopped):
        notice = f"{event.reason}; it continues from its checkpoint when a worker serves {part.device_id} again"
        return _change(part, now, {"state": PartState.queued, "attempt": None, "waiting": notice}, EventKind.attempt_lost, notice)
    if isinstance(event, AttemptFinished):
        return _attempt_finished(part, event, now)
    if isinstance(event, AttemptFailed):
        return _final(part, now, PartState.failed, event.reason, EventKind.failed, f"failed: {event.reason}")
    return _final(part, now, PartState.cancelled, event.reason, EventKind.cancelled, event.reason)


def _attempt_started(part: DevicePart, event: AttemptStarted, now: datetime) -> Change:
    if part.attempt is not None:
        raise Refused(f"attempt {part.attempt.number} runs it on {part.attempt.node}")
    _expect(part, event, PartState.queued)
    dispatch = part.dispatch
    if dispatch is None or dispatch.token != event.dispatch:
        raise Refused("it was not dispatched to the part (a stale or forged fine-tune)")
    if request_digest(dispatch.request) != event.digest:
        raise Refused("its request is not the one dispatched (a forged fine-tune)")
    if part.cancel_requested_at is not None:
        raise Refused("its job was cancelled")
    attempt = Attempt(token=event.attempt, number=part.attempts + 1, node=event.node, started_at=now)
    counted = event.lost_at is not None and part.lost_counted_at is not None and event.lost_at <= part.lost_counted_at
    changes = {
        "state": PartState.finetuning, "attempt": attempt, "attempts": attempt.number, "waiting": None,
        "lost_device_time_s": part.lost_device_time_s + (0.0 if counted else event.lost_device_time_s),
        "lost_energy_j": part.lost_energy_j + (0.0 if counted else event.lost_energy_j),
        "lost_counted_at": event.lost_at or part.lost_counted_at,
    }  # fmt: skip
    if event.resumed_at_samples is None:
        return _change(part, now, changes)
    message = f"attempt {attempt.number} resumed from the checkpoint at {event.resumed_at_samples} samples"
    return _change(part, now, changes, EventKind.resumed, message, {"attempt": attempt.number, "samples": event.resumed_at_samples})


def _attempt_finished(part: DevicePart, event: AttemptFinished, now: datetime) -> Change:
    _check_report(part, event.report)
    report = event.report.model_copy(
        update={"attempts": part.attempts, "lost_device_time_s": part.lost_device_time_s, "lost_energy_j": part.lost_energy_j}
    )
    assert part.dispatch is not None, "a part with an attempt was dispatched"
    message = completed_message(report, part.dispatch.request.target_accuracy)
    return _final(part, now, PartState.completed, None, EventKind.completed, message, {"report": report})


def configuration(choice: Selection, control: ControlAxis | None) -> str:
    """A selection's (b, f) for people, the setting in its axis' unit: "b=64 f=921.6 MHz"."""
    return f"b={choice.batch_size} f={(control or ControlAxis.GPU_CLOCK_HZ).describe(choice.frequency_hz)}"


def request_digest(request: FinetuneRequest) -> str:
    """A digest of a fine-tune request: what a device checks it runs what was dispatched."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()[:32]


def _check_report(part: DevicePart, report: RunReport) -> None:
    """Refuse a report that is not what the dispatched fine-tune could have produced."""
    assert part.dispatch is not None, "a part with an attempt was dispatched"
    request = part.dispatch.request
    ran = {b for s in report.switches for b in (s.old_batch_size, s.new_batch_size) if b is not None} | {request.batch_size}
    problems = []
    if report.device_id != part.device_id:
        problems.append(f"it is of device {report.device_id!r}")
    if report.batch_size not in ran:
        problems.append(f"batch size {report.batch_size} never ran (dispatched b={request.batch_size})")
    if report.reached and report.final_accuracy < request.target_accuracy:
        problems.append(f"it says reached at accuracy {report.final_accuracy:.3f}, below the target {request.target_accuracy}")
    if report.samples_processed > request.max_samples + max(ran):
        problems.append(f"{report.samples_processed} samples is more than the budget of {request.max_samples}")
    if problems:
        raise ReportMismatch("the report does not match the dispatched fine-tune: " + "; ".join(problems))


def _node(part: DevicePart) -> str:
    return part.attempt.node if part.attempt else "?"


def _open(part: DevicePart, event: _Event) -> None:
    if part.state in TERMINAL:
        raise Refused(f"the part is {part.state.value}: {type(event).__name__} does not apply")


def _expect(part: DevicePart, event: _Event, *states: PartState) -> None:
    if part.state not in states:
        allowed = ", ".join(s.value for s in states)
        raise Refused(f"the part is {part.state.value}: {type(event).__name__} applies only when it is {allowed}")


def _dispatched_as(part: DevicePart, token: str | None) -> None:
    """Refuse an event about task `token` once the part was dispatched anew (re-queued since)."""
    if token is not None and (part.dispatch is None or part.dispatch.token != token):
        raise Refused("the part was dispatched anew since that task")


def _held(part: DevicePart, token: str) -> None:
    if part.attempt is None or part.attempt.token != token:
        raise Refused("the attempt no longer holds the part (another attempt replaced it, or it was handed on)")


def _change(part: DevicePart, now: datetime, changes: Mapping[str, object], kind: EventKind | None = None,
            message: str | None = None, fields: Mapping[str, EventField] | None = None) -> Change:  # fmt: skip
    """The part with `changes` (validated), and the log line with its fields; the part itself
    when nothing changes."""
    updated = DevicePart.model_validate({**part.model_dump(), "device_missing": False, **changes, "updated_at": part.updated_at})
    if updated == part:
        return Change(part=part)
    return Change(part=updated.model_copy(update={"updated_at": now}), kind=kind if message else None, message=message,
                  fields=dict(fields or {}) if message else {})  # fmt: skip


def _final(part: DevicePart, now: datetime, state: PartState, reason: str | None, kind: EventKind, message: str,
           more: Mapping[str, object] | None = None) -> Change:  # fmt: skip
    changes = {"state": state, "reason": reason, "waiting": None, "attempt": None, "cancel_requested_at": None, **(more or {})}
    return _change(part, now, changes, kind, message)
