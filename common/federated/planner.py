"""The round planner: what a federated job does next, as a pure function.

`plan_round(view) -> Step`, with no Redis and no Celery: tasks/federated.py reads the store into
a `RoundView`, calls `plan_round`, applies the step's event (common/federated/events.py decides
whether it applies) and, when it applied, carries out its effects (common/jobs/effects.py).

- A cancel asked for: `Cancelled`.
- A round open: once every assigned update is in, or its deadline passed, `RoundClosed` with
  the round's aggregation (an effect kept in the ledger of sent tasks); else nothing.
- A round being aggregated: nothing (the aggregation moves the job on).
- A buffered job (aggregation.mode buffered): `_buffered`, works instead of rounds.
- Before round 1 or after an aggregated round: `Finished` when the global model reached the
  target, when `EMPTY_ROUNDS` rounds in a row closed without an update, or after
  `max_rounds`; else `Waiting` while no device of the job is heard from or a lookup table is
  missing (profiled by one device of its type: `ClaimAndProfile`); `Finished` (failed) when a
  table cannot be had or a cap leaves a device no configuration; else `RoundOpened` with each
  participant's (b, f*_b) and local work, and a `SendTrain` per participant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..jobs.effects import Aggregate, ClaimAndProfile, Effect, SendTrain
from ..keys import table_id
from ..models import get_model
from ..payloads import profile_request
from ..schemas import DeviceCap, DeviceInfo, ProfileTable, ProfilingOptions
from ..tables import NoTable, Profile, Reuse, TableNeed
from .events import BufferClosed, Cancelled, FederatedEvent, Finished, RoundClosed, RoundOpened, Waiting, WorkExpired, WorkStarted
from .plan import Assignment, DeviceInRound, assign, participants
from .records import FINAL, AggregateRequest, FederatedRecord, FederatedState, Phase, TrainRequest, Work

EMPTY_ROUNDS = 3  # rounds in a row without an update after which a job fails


@dataclass(frozen=True)
class RoundView:
    """What the planner sees of a federated job: as submitted, where it is, the time of the
    decision, the job's devices heard from (`live`, by id), what the lookup table of each of
    their types needs (`tables`, by device type: common/tables.py), the caps set on the job's
    devices with `edgetrain cap` (by id), and when an operator asked to cancel it."""

    record: FederatedRecord
    state: FederatedState
    now: datetime
    live: dict[str, DeviceInfo]
    tables: dict[str, TableNeed]
    device_caps: dict[str, DeviceCap]
    cancel_requested_at: datetime | None = None


@dataclass(frozen=True)
class Step:
    """The event to apply (None: nothing changes) and what to do once it applied."""

    event: FederatedEvent | None
    effects: tuple[Effect, ...] = ()


def plan_round(view: RoundView) -> Step:
    """The job's next step (see the module docstring)."""
    state, job_id = view.state, view.record.job_id
    if state.phase in FINAL:
        return Step(None)
    if view.cancel_requested_at is not None:
        return Step(Cancelled(reason=f"cancelled at {view.cancel_requested_at:%Y-%m-%d %H:%M:%S} UTC"))
    if state.buffered:
        return _buffered(view)
    if state.phase == Phase.aggregating:
        return Step(None)
    if state.phase == Phase.training:
        missing = {a.device_id for a in state.assignments} - set(state.received)
        overdue = state.deadline_at is not None and view.now >= state.deadline_at
        if missing and not overdue:
            return Step(None)
        return Step(RoundClosed(round=state.round), (Aggregate(AggregateRequest(job_id=job_id, round=state.round)),))
    return _next_round(view)


def _next_round(view: RoundView) -> Step:
    """After round `state.round` (0: none yet): finish the job, wait, or open the next round."""
    if (finish := _finish(view)) is not None:
        return finish
    if not view.live:
        return Step(Waiting(notice="no device of the job is heard from: the next round starts when one is"))
    tables = _tables(view)
    return tables if isinstance(tables, Step) else _open(view, tables)


def _finish(view: RoundView) -> Step | None:
    """`Finished` when the global model reached the target, after `EMPTY_ROUNDS` rounds in a row
    without an update (buffered: as many deadlines passed in a row without one), or after
    `max_rounds` rounds (buffered: aggregations); else None."""
    state, spec = view.state, view.record.spec
    rounds = "aggregations" if state.buffered else "rounds"
    accuracy = f"{state.accuracy:.4f}" if state.accuracy is not None else "none"
    if state.accuracy is not None and state.accuracy >= spec.target_accuracy:
        reason = f"global accuracy {accuracy} reached the target {spec.target_accuracy} in {rounds.removesuffix('s')} {state.round}"
        return Step(Finished(phase=Phase.completed, reason=reason))
    if state.empty_rounds >= EMPTY_ROUNDS:
        times = "works' deadlines passed" if state.buffered else "rounds"
        reason = f"no device handed in an update in {EMPTY_ROUNDS} {times} in a row (the events say why)"
        return Step(Finished(phase=Phase.failed, reason=reason))
    if state.round >= spec.max_rounds:
        reason = f"the target {spec.target_accuracy} was not reached in {spec.max_rounds} {rounds} (global accuracy {accuracy})"
        return Step(Finished(phase=Phase.failed, reason=reason))
    return None


def _tables(view: RoundView) -> dict[str, ProfileTable] | Step:
    """The lookup table of every live device's type, or the step that gets them: `Finished`
    (failed) when one cannot be had, `Waiting` with a profile of each one missing."""
    needs = {t: view.tables[t] for t in sorted({d.device_type for d in view.live.values()})}
    if failed := {t: n.reason for t, n in needs.items() if isinstance(n, NoTable)}:
        why = "; ".join(f"{t}: {reason}" for t, reason in failed.items())
        return Step(Finished(phase=Phase.failed, reason=f"no lookup table: {why}"))
    if profiles := {t: n for t, n in needs.items() if isinstance(n, Profile)}:
        return Step(Waiting(notice=f"waiting for the lookup tables of {', '.join(profiles)}"), _profiles(view, profiles))
    return {t: n.table for t, n in needs.items() if isinstance(n, Reuse)}


def _profiles(view: RoundView, needs: dict[str, Profile]) -> tuple[Effect, ...]:
    """One device of each type profiles its type's table (a claim shared with jobs)."""
    spec, effects = view.record.spec, []
    for device_type, need in needs.items():
        device = min((d for d in view.live.values() if d.device_type == device_type), key=lambda d: d.device_id)
        request = profile_request(device, view.record.job_id, spec.model, need.rows, ProfilingOptions(), None)
        request = request.model_copy(update={"merge": need.merge})
        effects.append(ClaimAndProfile(table_id=_table_id(view, device_type), request=request, stored_at=need.stored_at))
    return tuple(effects)


def _table_id(view: RoundView, device_type: str) -> str:
    model = view.record.spec.model
    return table_id(device_type, model, get_model(model).input_shape)


def _open(view: RoundView, tables: dict[str, ProfileTable]) -> Step:
    """Round `state.round + 1`: its participants, each one's (b, f*_b) under its cap and local work."""
    state, spec = view.state, view.record.spec
    r = state.round + 1
    taking_part = participants([d.device_id for d in spec.devices if d.device_id in view.live], spec.participation.fraction, spec.seed, r)
    try:
        plan = _assign(view, taking_part, tables, r)
    except ValueError as exc:
        return Step(Finished(phase=Phase.failed, reason=f"round {r}: {exc}"))
    opened = RoundOpened(round=r, assignments=plan, deadline_at=view.now + timedelta(seconds=spec.participation.deadline_s))
    return Step(opened, tuple(_send(view, a, r) for a in plan))


def _assign(view: RoundView, device_ids: list[str], tables: dict[str, ProfileTable], r: int) -> list[Assignment]:
    """Each device's (b, f*_b) under its cap in round `r` and local work, balanced over them."""
    devices = [view.live[d] for d in device_ids]
    return assign([DeviceInRound(d.device_id, d.device_type, cap_in(view, d.device_id, r), tables[d.device_type], d.power_envelope_w)
                   for d in devices], view.record.spec.local)  # fmt: skip


def _send(view: RoundView, a: Assignment, r: int, work: int | None = None) -> SendTrain:
    request = TrainRequest(job_id=view.record.job_id, round=r, device_id=a.device_id, batch_size=a.batch_size,
                           frequency_hz=a.frequency_hz, local_steps=a.local_steps, work=work)  # fmt: skip
    return SendTrain(request, view.live[a.device_id].control.describe(a.frequency_hz))


def _buffered(view: RoundView) -> Step:
    """A buffered job's next step: finish it (checked between aggregations); drop the works past
    their deadline; hand the K oldest updates of a full buffer to the server (`BufferClosed` with
    its aggregation, kept in the ledger; once it is done, the next K at once if they are in);
    else, unless the next buffer is full already (then the devices wait for the aggregation
    running, so the server is never more than a buffer behind), start every idle live device's
    next work from the newest global model (its work chosen with every live device's, under
    its cap at the next aggregation)."""
    state, spec, job_id = view.state, view.record.spec, view.record.job_id
    if not state.aggregating and (finish := _finish(view)) is not None:
        return finish
    if expired := [w.work for w in state.in_flight if view.now >= w.deadline_at]:
        return Step(WorkExpired(works=expired))
    r = state.round + 1
    k = spec.aggregation.buffer_size or 1
    if not state.aggregating and len(state.received) >= k:
        return Step(BufferClosed(round=r, size=k), (Aggregate(AggregateRequest(job_id=job_id, round=r)),))
    if len(state.received) >= k:  # the next buffer is full while the server aggregates: no more work to wait behind it
        return Step(None)
    busy = {w.device_id for w in state.in_flight}
    idle = [d.device_id for d in spec.devices if d.device_id in view.live and d.device_id not in busy]
    if not view.live and not busy:
        return Step(Waiting(notice="no device of the job is heard from: work starts when one is"))
    if not idle or state.round + (1 if state.aggregating else 0) >= spec.max_rounds:
        return Step(None)
    tables = _tables(view)
    if isinstance(tables, Step):
        return tables
    try:
        plan = [a for a in _assign(view, [d.device_id for d in spec.devices if d.device_id in view.live], tables, r) if a.device_id in idle]
    except ValueError as exc:
        return Step(Finished(phase=Phase.failed, reason=f"aggregation {r}: {exc}"))
    deadline_at = view.now + timedelta(seconds=spec.participation.deadline_s)
    works = [Work(work=state.works_sent + i, round=r, weights=state.global_weights, started_s=state.device_clock_s.get(a.device_id, 0.0),
                  deadline_at=deadline_at, assignment=a) for i, a in enumerate(plan, 1)]  # fmt: skip
    return Step(WorkStarted(works=works), tuple(_send(view, w.assignment, r, w.work) for w in works))


def cap_in(view: RoundView, device_id: str, round_number: int) -> float | None:
    """A device's cap (W) in round `round_number`: one set on the device (`edgetrain cap`)
    since the job was submitted, else the spec's for that round."""
    set_on_device = view.device_caps.get(device_id)
    if set_on_device is not None and set_on_device.set_at > view.record.created_at:
        return set_on_device.power_cap_w
    return next(d for d in view.record.spec.devices if d.device_id == device_id).cap_in(round_number)
