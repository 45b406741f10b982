"""A federated job's transitions: typed events in, one pure function deciding the change.

The control worker's round planner (common/federated/planner.py), the device training a round
and the server aggregating it report what happens as events; `transition(state, event, now)`
returns the state after the event with a line for the job's log, or raises `Refused` saying
why the event does not apply. `FederatedStore.apply` runs it inside one Redis transaction
with what follows from the change (an accepted update stored, the aggregation written in the
ledger of sent tasks, a round appended); nothing else writes a federated job's state.

    starting | aggregated
        --RoundOpened-->      training       the next round: its devices, (b, f) and local work
    training
        --UpdateAccepted-->   training       an update of a device the round assigns, as assigned, once
        --RoundClosed-->      aggregating    every update is in, or the round's deadline passed
    aggregating
        --RoundAggregated-->  aggregated     the new global model and its accuracy
    buffered (aggregation.mode buffered: no rounds; `round` counts the aggregations)
    starting | training
        --WorkStarted-->      training       idle devices' next work, each from the newest global model
    training
        --UpdateAccepted-->   training       a work in flight hands in its update, as assigned, once: into the buffer
        --WorkExpired-->      training       works past their deadline are dropped (their devices start again, their
                                             clocks on by the time the tables expect of the works)
        --BufferClosed-->     training       the buffer goes to the server; a new one fills meanwhile
        --RoundAggregated-->  training       the new global model and its accuracy (round + 1)
    any phase but a final one
        --Waiting-->          same phase     a notice for status (None clears it)
        --Finished-->         completed | failed
        --Cancelled-->        cancelled
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field

from ..jobs.state import EventField, EventKind, Refused
from ..schemas import Strict
from .plan import Assignment
from .records import FINAL, FederatedState, LocalUpdate, Phase, RoundRecord, Work, work_of


class Accepted(str, Enum):
    """What became of a device's update."""

    accepted = "accepted"
    late = "late"  # its round closed (or the job finished): discarded
    duplicate = "duplicate"  # the device's update of that round is already in
    not_assigned = "not_assigned"  # the round does not assign the device, or not that work (a forged or stale task)


class UpdateRefused(Refused):
    """An update the round does not take; `outcome` says why (late, duplicate, not assigned)."""

    def __init__(self, outcome: Accepted, message: str):
        super().__init__(message)
        self.outcome = outcome


class _Event(Strict):
    pass


class Waiting(_Event):
    """The job waits; `notice` says on what (None clears it)."""

    kind: Literal["waiting"] = "waiting"
    notice: str | None


class RoundOpened(_Event):
    """Round `round` opens with these assignments, until `deadline_at`."""

    kind: Literal["round_opened"] = "round_opened"
    round: int = Field(ge=1)
    assignments: list[Assignment] = Field(min_length=1)
    deadline_at: datetime


class UpdateAccepted(_Event):
    """A device handed in its update of the open round."""

    kind: Literal["update"] = "update"
    update: LocalUpdate


class RoundClosed(_Event):
    """The open round `round` closes with the updates accepted so far."""

    kind: Literal["round_closed"] = "round_closed"
    round: int = Field(ge=1)


class RoundAggregated(_Event):
    """The closed round is aggregated: the new global model (`weights`) and its round record;
    with drift correction, the server's new control variate and the devices' that changed."""

    kind: Literal["round_aggregated"] = "round_aggregated"
    record: RoundRecord
    weights: str
    control: str | None = None
    drift: dict[str, str] = Field(default_factory=dict)


class WorkStarted(_Event):
    """Buffered: these devices (none with a work in flight) start these works."""

    kind: Literal["work_started"] = "work_started"
    works: list[Work] = Field(min_length=1)


class WorkExpired(_Event):
    """Buffered: these works in flight passed their deadline without an update."""

    kind: Literal["work_expired"] = "work_expired"
    works: list[int] = Field(min_length=1)


class BufferClosed(_Event):
    """Buffered: the buffer's `size` oldest updates (by work) go to the server as aggregation
    `round`; the others wait for the next."""

    kind: Literal["buffer_closed"] = "buffer_closed"
    round: int = Field(ge=1)
    size: int = Field(ge=1, description="the updates aggregated (the job's buffer_size)")


class Finished(_Event):
    """The job ends: it reached its target, or cannot go on (`reason` says which)."""

    kind: Literal["finished"] = "finished"
    phase: Literal[Phase.completed, Phase.failed]
    reason: str
    aggregating: int | None = Field(None, description="applies only while this round is being aggregated (its aggregation failed)")


class Cancelled(_Event):
    """An operator stopped the job: no round opens or aggregates after this."""

    kind: Literal["cancelled"] = "cancelled"
    reason: str


FederatedEvent = Annotated[
    Waiting
    | RoundOpened
    | UpdateAccepted
    | RoundClosed
    | RoundAggregated
    | WorkStarted
    | WorkExpired
    | BufferClosed
    | Finished
    | Cancelled,
    Field(discriminator="kind"),
]


class Change(Strict):
    """What an event does: the state after it, and the line it adds to the job's log (if any),
    with its typed fields."""

    state: FederatedState
    kind: EventKind | None = None
    message: str | None = None
    device_id: str | None = None
    fields: dict[str, EventField] = Field(default_factory=dict)


def transition(state: FederatedState, event: FederatedEvent, now: datetime) -> Change:
    """The state after `event` (see the module docstring); Refused when it does not apply."""
    if state.phase in FINAL:
        if isinstance(event, UpdateAccepted):
            raise UpdateRefused(Accepted.late, f"the job has finished ({state.phase.value})")
        raise Refused(f"the job has finished ({state.phase.value}): {type(event).__name__} does not apply")
    return _RULES[type(event)](state, event, now)


def _waiting(state: FederatedState, event: Waiting, now: datetime) -> Change:
    return _change(state, now, {"notice": event.notice})


def _finished(state: FederatedState, event: Finished, now: datetime) -> Change:
    if event.aggregating is not None and being_aggregated(state) != event.aggregating:
        raise Refused(f"round {event.aggregating} is not being aggregated (round {state.round}, {state.phase.value})")
    kind = EventKind.completed if event.phase == Phase.completed else EventKind.failed
    return _change(state, now, _ended(event.phase, event.reason), kind, event.reason)


def _cancelled(state: FederatedState, event: Cancelled, now: datetime) -> Change:
    return _change(state, now, _ended(Phase.cancelled, event.reason), EventKind.cancelled, event.reason)


def being_aggregated(state: FederatedState) -> int | None:
    """The round (buffered: the aggregation) the server aggregates now, if any."""
    if state.buffered:
        return state.round + 1 if state.aggregating else None
    return state.round if state.phase == Phase.aggregating else None


def _opened(state: FederatedState, event: RoundOpened, now: datetime) -> Change:
    if state.buffered:
        raise Refused("a buffered job opens no rounds")
    _expect(state, event, Phase.starting, Phase.aggregated)
    if event.round != state.round + 1:
        raise Refused(f"round {event.round} does not follow round {state.round}")
    changes = {"phase": Phase.training, "round": event.round, "assignments": event.assignments, "deadline_at": event.deadline_at,
               "received": {}, "closed_with": [], "notice": None}  # fmt: skip
    return _change(state, now, changes, EventKind.federated_round, opened_message(event.round, event.assignments),
                   {"round": event.round, "devices": len(event.assignments)})  # fmt: skip


def _closed(state: FederatedState, event: RoundClosed, now: datetime) -> Change:
    if state.buffered:
        raise Refused("a buffered job closes no rounds")
    _expect(state, event, Phase.training)
    if event.round != state.round:
        raise Refused(f"round {event.round} is not open (round {state.round})")
    closed_with = sorted(state.received)
    late = sorted({a.device_id for a in state.assignments} - set(closed_with))
    note = f"; no update from {', '.join(late)} by the deadline" if late else ""
    changes = {"phase": Phase.aggregating, "closed_with": closed_with, "deadline_at": None}
    message = f"round {event.round} closed with {len(closed_with)} updates{note}"
    return _change(state, now, changes, EventKind.federated_round, message, {"round": event.round, "updates": len(closed_with)})


def _aggregated(state: FederatedState, event: RoundAggregated, now: datetime) -> Change:
    if state.buffered:
        return _buffer_aggregated(state, event, now)
    _expect(state, event, Phase.aggregating)
    done = event.record
    if done.round != state.round:
        raise Refused(f"round {done.round} is not the round being aggregated ({state.round})")
    changes = {
        "phase": Phase.aggregated, "global_weights": event.weights, "accuracy": done.accuracy, "elapsed_s": done.elapsed_s,
        "empty_rounds": 0 if done.devices else state.empty_rounds + 1, "assignments": [], "received": {}, "closed_with": [],
        "control": event.control or state.control, "drift": {**state.drift, **event.drift},
    }  # fmt: skip
    message = f"round {done.round} aggregated {len(done.devices)} updates: global accuracy {done.accuracy:.4f}"
    fields = {"round": done.round, "updates": len(done.devices), "accuracy": done.accuracy}
    return _change(state, now, changes, EventKind.federated_round, message, fields)


def _update(state: FederatedState, event: UpdateAccepted, now: datetime) -> Change:
    return _buffered_update(state, event.update, now) if state.buffered else _accepted(state, event.update, now)


def _accepted(state: FederatedState, update: LocalUpdate, now: datetime) -> Change:
    """An update joins the open round: only its own round, a device the round assigns, the work
    it assigned, and once."""
    if state.phase != Phase.training or update.round != state.round:
        raise UpdateRefused(Accepted.late, f"round {update.round} is not open (round {state.round}, {state.phase.value})")
    assigned = state.assigned(update.device_id)
    if assigned is None or assigned != update.trained.assignment:
        raise UpdateRefused(Accepted.not_assigned, f"round {update.round} does not assign {update.device_id} this work")
    if update.device_id in state.received:
        raise UpdateRefused(Accepted.duplicate, f"the update of {update.device_id} in round {update.round} is in already")
    t = update.trained
    sim = " (SIMULATED)" if t.simulated else ""
    message = f"round {update.round}: update in, {t.samples} samples, {t.device_time_s:.2f} s, {t.energy_j:.1f} J{sim}"
    fields = {"round": update.round, "samples": t.samples}
    change = _change(state, now, {"received": {**state.received, update.device_id: update.digest()}}, EventKind.federated_update, message,
                     fields)  # fmt: skip
    return change.model_copy(update={"device_id": update.device_id})


def _work_started(state: FederatedState, event: WorkStarted, now: datetime) -> Change:
    _expect_buffered(state, event)
    _expect(state, event, Phase.starting, Phase.training)
    busy = {w.device_id for w in state.in_flight}
    if clash := sorted(busy & {w.device_id for w in event.works}):
        raise Refused(f"{', '.join(clash)} have work in flight already")
    numbers = [w.work for w in event.works]
    if numbers != list(range(state.works_sent + 1, state.works_sent + 1 + len(numbers))):
        raise Refused(f"works {numbers} do not follow work {state.works_sent}")
    if wrong := [w.work for w in event.works if w.round != state.round + 1]:
        raise Refused(f"works {wrong} do not start from the newest global model (aggregation {state.round})")
    in_flight = [*state.in_flight, *event.works]
    changes = {"phase": Phase.training, "in_flight": in_flight, "works_sent": numbers[-1], "notice": None,
               "deadline_at": min(w.deadline_at for w in in_flight)}  # fmt: skip
    message = f"works {numbers[0]}..{numbers[-1]} started from aggregation {state.round}: " + work_line([w.assignment for w in event.works])
    return _change(state, now, changes, EventKind.federated_round, message, {"round": state.round, "devices": len(event.works)})


def _work_expired(state: FederatedState, event: WorkExpired, now: datetime) -> Change:
    _expect_buffered(state, event)
    _expect(state, event, Phase.training)
    gone = [w for w in state.in_flight if w.work in event.works]
    if len(gone) != len(set(event.works)):
        raise Refused(f"works {sorted(set(event.works) - {w.work for w in gone})} are not in flight")
    left = [w for w in state.in_flight if w.work not in event.works]
    clocks = {**state.device_clock_s, **{w.device_id: _clock_after_drop(w) for w in gone}}
    changes = {"in_flight": left, "deadline_at": min((w.deadline_at for w in left), default=None), "empty_rounds": state.empty_rounds + 1,
               "device_clock_s": clocks, "dropped": [*state.dropped, *gone]}  # fmt: skip
    each = ", ".join(f"{w.work} ({w.device_id})" for w in gone)
    message = f"no update by the deadline of works {each}: dropped, counted at the device time and energy their tables expect"
    return _change(state, now, changes, EventKind.federated_round, message, {"round": state.round, "devices": len(gone)})


def _clock_after_drop(work: Work) -> float:
    """A dropped work's device's clock after it (device s since the job started): what its device
    spent on it is not known (killed mid-work, frozen, or its update late), so it counts the
    device time its table expects of the work."""
    return work.started_s + work.assignment.expected_time_s


def _buffer_closed(state: FederatedState, event: BufferClosed, now: datetime) -> Change:
    _expect_buffered(state, event)
    _expect(state, event, Phase.training)
    if state.aggregating:
        raise Refused(f"aggregation {state.round + 1} runs already")
    if event.round != state.round + 1 or len(state.received) < event.size:
        raise Refused(f"aggregation {event.round} does not follow aggregation {state.round} with a buffer of {event.size} updates")
    taken = sorted(state.received, key=work_of)[: event.size]
    left = {k: d for k, d in state.received.items() if k not in taken}
    changes = {"aggregating": {k: state.received[k] for k in taken}, "received": left}
    message = f"aggregation {event.round}: buffer closed with {len(taken)} updates ({', '.join(taken)})"
    return _change(state, now, changes, EventKind.federated_round, message, {"round": event.round, "updates": len(taken)})


def _buffer_aggregated(state: FederatedState, event: RoundAggregated, now: datetime) -> Change:
    done = event.record
    if being_aggregated(state) != done.round:
        raise Refused(f"aggregation {done.round} is not being aggregated (aggregation {state.round} done)")
    changes = {"round": done.round, "global_weights": event.weights, "accuracy": done.accuracy, "elapsed_s": done.elapsed_s,
               "aggregating": {}, "dropped": [w for w in state.dropped if w.work not in done.dropped]}  # fmt: skip
    message = f"aggregation {done.round} of {len(done.devices)} updates: global accuracy {done.accuracy:.4f}"
    return _change(state, now, changes, EventKind.federated_round, message,
                   {"round": done.round, "updates": len(done.devices), "accuracy": done.accuracy})  # fmt: skip


def _buffered_update(state: FederatedState, update: LocalUpdate, now: datetime) -> Change:
    """An update joins the buffer: only from a work in flight, as that work assigned, once."""
    work = state.work(update.work) if update.work is not None and state.phase == Phase.training else None
    if work is None:
        if update.key in state.received or update.key in state.aggregating:
            raise UpdateRefused(Accepted.duplicate, f"the update of work {update.work} ({update.device_id}) is in already")
        raise UpdateRefused(Accepted.late, f"work {update.work} of {update.device_id} is not in flight (done, expired or never sent)")
    if (work.device_id, work.round, work.started_s, work.assignment) != (update.device_id, update.round, update.started_s,
                                                                       update.trained.assignment):  # fmt: skip
        raise UpdateRefused(Accepted.not_assigned, f"work {work.work} does not assign {update.device_id} this work")
    left = [w for w in state.in_flight if w.work != work.work]
    t = update.trained
    changes = {"in_flight": left, "deadline_at": min((w.deadline_at for w in left), default=None), "empty_rounds": 0,
               "received": {**state.received, update.key: update.digest()},
               "device_clock_s": {**state.device_clock_s, update.device_id: update.finished_s}}  # fmt: skip
    sim = " (SIMULATED)" if t.simulated else ""
    message = f"work {work.work}: update in, {t.samples} samples, {t.device_time_s:.2f} s, {t.energy_j:.1f} J{sim}"
    change = _change(state, now, changes, EventKind.federated_update, message, {"round": update.round, "samples": t.samples})
    return change.model_copy(update={"device_id": update.device_id})


def _expect_buffered(state: FederatedState, event: _Event) -> None:
    if not state.buffered:
        raise Refused(f"{type(event).__name__} applies only to a buffered job")


def work_line(plan: list[Assignment]) -> str:
    """Each device's (b, f) and local steps, in words."""
    return ", ".join(f"{a.device_id} b={a.batch_size} f={a.frequency_hz / 1e6:g} MHz x{a.local_steps}" for a in plan)


def opened_message(round_number: int, plan: list[Assignment]) -> str:
    """The log line of an opened round: each device's (b, f) and local steps."""
    return f"round {round_number} opened: {work_line(plan)}"


def _ended(phase: Phase, reason: str) -> dict[str, object]:
    return {"phase": phase, "reason": reason, "assignments": [], "received": {}, "deadline_at": None, "notice": None, "in_flight": [],
            "aggregating": {}}  # fmt: skip


def _expect(state: FederatedState, event: _Event, *phases: Phase) -> None:
    if state.phase not in phases:
        allowed = ", ".join(p.value for p in phases)
        raise Refused(f"the job is {state.phase.value}: {type(event).__name__} applies only when it is {allowed}")


def _change(state: FederatedState, now: datetime, changes: Mapping[str, object], kind: EventKind | None = None,
            message: str | None = None, fields: Mapping[str, EventField] | None = None) -> Change:  # fmt: skip
    """The state with `changes` (validated) and the log line with its fields; the state itself
    when nothing changes."""
    updated = FederatedState.model_validate({**state.model_dump(), **changes, "updated_at": state.updated_at})
    if updated == state:
        return Change(state=state)
    return Change(state=updated.model_copy(update={"updated_at": now}), kind=kind if message else None, message=message,
                  fields=dict(fields or {}) if message else {})  # fmt: skip


_RULES: dict[type, Callable[[FederatedState, Any, datetime], Change]] = {
    Waiting: _waiting, Finished: _finished, Cancelled: _cancelled, RoundOpened: _opened, UpdateAccepted: _update, RoundClosed: _closed,
    RoundAggregated: _aggregated, WorkStarted: _work_started, WorkExpired: _work_expired, BufferClosed: _buffer_closed,
}  # fmt: skip
