"""The federated transition as a pure function: which event applies in which phase, what it
changes, and the log line it adds; no Redis."""

from datetime import timedelta

import pytest

from edgetrain.common.federated.events import (
    Accepted,
    Cancelled,
    Finished,
    Refused,
    RoundAggregated,
    RoundClosed,
    RoundOpened,
    UpdateAccepted,
    UpdateRefused,
    Waiting,
    transition,
)
from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import DeviceRound, FederatedState, LocalUpdate, Phase, RoundRecord
from edgetrain.common.jobs.state import EventKind
from edgetrain.common.schemas import utc_now

NOW = utc_now()
WEIGHTS = "artifact:g.pt#sha256=" + "1" * 64


def assignment(device_id: str, steps: int = 4) -> Assignment:
    return Assignment(device_id=device_id, device_type="jetson-nano", power_cap_w=None, batch_size=16, frequency_hz=921_600_000,
                      local_steps=steps, expected_time_s=0.1, expected_energy_j=None, strategy="equation4")  # fmt: skip


def update(device_id: str, round_number: int = 1, steps: int = 4) -> LocalUpdate:
    trained = DeviceRound(assignment=assignment(device_id, steps), device_time_s=0.2, energy_j=1.5, samples=64)
    return LocalUpdate(job_id="j", device_id=device_id, round=round_number, weights=f"artifact:{device_id}.pt#sha256={'0' * 64}",
                       held_samples=100, trained=trained)  # fmt: skip


def at(phase: Phase, round_number: int = 1, **fields) -> FederatedState:
    return FederatedState(phase=phase, round=round_number, global_weights="init:0", **fields)


OPEN = at(Phase.training, assignments=[assignment("a"), assignment("b")], deadline_at=NOW + timedelta(seconds=60))
RECORD = RoundRecord(round=1, accuracy=0.7, device_time_s=0.2, elapsed_s=0.5, energy_j=1.5, devices=[update("a").trained], missing=["b"])
EVENTS = {
    "open": RoundOpened(round=2, assignments=[assignment("a")], deadline_at=NOW),
    "update": UpdateAccepted(update=update("a")),
    "close": RoundClosed(round=1),
    "aggregate": RoundAggregated(record=RECORD, weights=WEIGHTS),
}
APPLIES = {
    "open": {Phase.starting, Phase.aggregated},
    "update": {Phase.training},
    "close": {Phase.training},
    "aggregate": {Phase.aggregating},
}


@pytest.mark.parametrize("name", sorted(EVENTS))
@pytest.mark.parametrize("phase", list(Phase))
def test_each_round_event_applies_in_its_phase_only(name: str, phase: Phase) -> None:
    state = OPEN.model_copy(update={"phase": phase})
    if phase in APPLIES[name]:
        assert transition(state, EVENTS[name], NOW).state != state
    else:
        with pytest.raises(Refused):
            transition(state, EVENTS[name], NOW)


def test_a_round_opens_only_after_the_one_before_it() -> None:
    with pytest.raises(Refused, match="does not follow"):
        transition(at(Phase.aggregated, 1), RoundOpened(round=3, assignments=[assignment("a")], deadline_at=NOW), NOW)
    change = transition(at(Phase.starting, 0, notice="waiting"), RoundOpened(round=1, assignments=[assignment("a")], deadline_at=NOW), NOW)
    assert (change.state.phase, change.state.round, change.state.notice, change.state.deadline_at) == (Phase.training, 1, None, NOW)
    assert change.kind == EventKind.federated_round and change.message == "round 1 opened: a b=16 f=921.6 MHz x4"
    assert change.fields == {"round": 1, "devices": 1}


def test_an_update_is_accepted_once_as_assigned_and_its_digest_kept() -> None:
    change = transition(OPEN, UpdateAccepted(update=update("a")), NOW)
    assert change.state.received == {"a": update("a").digest()} and change.device_id == "a"
    assert change.message == "round 1: update in, 64 samples, 0.20 s, 1.5 J (SIMULATED)"
    refusals = {
        Accepted.duplicate: (change.state, update("a")),
        Accepted.not_assigned: (OPEN, update("ghost")),
        Accepted.late: (OPEN, update("a", round_number=2)),
    }
    for outcome, (state, u) in refusals.items():
        with pytest.raises(UpdateRefused) as refused:
            transition(state, UpdateAccepted(update=u), NOW)
        assert refused.value.outcome == outcome
    with pytest.raises(UpdateRefused) as refused:  # the device, but other work than it was assigned
        transition(OPEN, UpdateAccepted(update=update("a", steps=40)), NOW)
    assert refused.value.outcome == Accepted.not_assigned


def test_closing_fixes_the_accepted_updates_and_aggregating_resets_the_round() -> None:
    taken = transition(OPEN, UpdateAccepted(update=update("a")), NOW).state
    closed = transition(taken, RoundClosed(round=1), NOW)
    assert (closed.state.phase, closed.state.closed_with, closed.state.deadline_at) == (Phase.aggregating, ["a"], None)
    assert closed.message == "round 1 closed with 1 updates; no update from b by the deadline"
    with pytest.raises(Refused, match="not open"):
        transition(taken, RoundClosed(round=2), NOW)
    done = transition(closed.state, RoundAggregated(record=RECORD, weights=WEIGHTS), NOW).state
    assert (done.phase, done.global_weights, done.accuracy, done.elapsed_s) == (Phase.aggregated, WEIGHTS, 0.7, 0.5)
    assert (done.assignments, done.received, done.closed_with, done.empty_rounds) == ([], {}, [], 0)
    empty = RECORD.model_copy(update={"devices": []})
    assert transition(closed.state, RoundAggregated(record=empty, weights=WEIGHTS), NOW).state.empty_rounds == 1


def test_finishing_and_cancelling_end_the_job_and_nothing_applies_after() -> None:
    for event, phase in (
        (Finished(phase=Phase.completed, reason="reached"), Phase.completed),
        (Cancelled(reason="by hand"), Phase.cancelled),
    ):
        change = transition(OPEN, event, NOW)
        assert (change.state.phase, change.state.reason, change.state.assignments) == (phase, change.message, [])
        for later in (*EVENTS.values(), Waiting(notice="x"), Cancelled(reason="again")):
            with pytest.raises(Refused, match="has finished"):
                transition(change.state, later, NOW)


def test_waiting_changes_only_the_notice_and_logs_nothing() -> None:
    change = transition(at(Phase.starting, 0), Waiting(notice="no device is heard from"), NOW)
    assert change.state.notice == "no device is heard from" and change.message is None
    same = transition(change.state, Waiting(notice="no device is heard from"), NOW)
    assert same.state == change.state  # nothing to write
