"""Buffered (asynchronous) federated jobs as pure functions: the spec's mode checked at the door,
the transitions of works and buffers, the planner's buffered path and FedBuff's server step;
no Redis."""

import random
from datetime import timedelta

import pytest
import torch
from pydantic import ValidationError

from edgetrain.common.federated.events import (
    Accepted,
    BufferClosed,
    Refused,
    RoundAggregated,
    RoundClosed,
    RoundOpened,
    UpdateAccepted,
    UpdateRefused,
    WorkExpired,
    WorkStarted,
    transition,
)
from edgetrain.common.federated.planner import RoundView, plan_round
from edgetrain.common.federated.records import DeviceRound, FederatedRecord, FederatedState, LocalUpdate, Phase, RoundRecord, Work
from edgetrain.common.federated.rounds import Buffered, apply_buffer, buffer_record, buffer_weights, delta, fedavg
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.jobs.effects import Aggregate, SendTrain
from edgetrain.common.schemas import DeviceCap, DeviceInfo, utc_now
from edgetrain.common.tables import Reuse
from edgetrain.common.testing.tables import B, F, random_monotone_table

from .test_federated_events import assignment

NOW = utc_now()
WEIGHTS = "artifact:g.pt#sha256=" + "1" * 64
TABLE = random_monotone_table(random.Random(0), time_noise=False).model_copy(update={"device_type": "twin"})
JOB = {"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
       "target_accuracy": 0.9, "batch_sizes": B, "devices": [{"device_id": d} for d in "abc"], "max_rounds": 5,
       "aggregation": {"mode": "buffered", "buffer_size": 2}}  # fmt: skip
SPEC = FederatedSpec.model_validate(JOB)
RECORD = FederatedRecord(job_id="j1", spec=SPEC, created_at=NOW - timedelta(minutes=5))


def work(number: int, device_id: str, round_number: int = 1, started_s: float = 0.0) -> Work:
    return Work(work=number, round=round_number, weights="init:0", started_s=started_s, deadline_at=NOW + timedelta(seconds=60),
                assignment=assignment(device_id))  # fmt: skip


def update(w: Work, steps: int = 4) -> LocalUpdate:
    trained = DeviceRound(assignment=assignment(w.device_id, steps), device_time_s=0.2, energy_j=1.5, samples=64)
    return LocalUpdate(job_id="j1", device_id=w.device_id, round=w.round, weights=f"artifact:{w.work}.pt#sha256={'0' * 64}",
                       held_samples=100, trained=trained, work=w.work, started_s=w.started_s)  # fmt: skip


def buffered(**fields) -> FederatedState:
    return FederatedState(global_weights="init:0", buffered=True, **fields)


RUNNING = buffered(phase=Phase.training, in_flight=[work(1, "a"), work(2, "b")], works_sent=2, deadline_at=NOW + timedelta(seconds=60))


@pytest.mark.parametrize(
    ("aggregation", "field"),
    [({"mode": "buffered"}, "aggregation.buffer_size"), ({"buffer_size": 2}, "aggregation.buffer_size"),
     ({"mode": "buffered", "buffer_size": 2, "rule": "fednova"}, "aggregation.rule"),
     ({"mode": "buffered", "buffer_size": 2, "drift": "scaffold"}, "aggregation.drift"), ({"drift": "fednova"}, "drift"),
     ({"mode": "buffered", "buffer_size": 0}, "buffer_size"), ({"mode": "async", "buffer_size": 2}, "mode")],
)  # fmt: skip
def test_a_buffered_spec_is_checked_at_the_door_naming_the_field(aggregation: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        FederatedSpec.model_validate(JOB | {"aggregation": aggregation})
    with pytest.raises(ValidationError, match=r"participation\.fraction"):
        FederatedSpec.model_validate(JOB | {"participation": {"fraction": 0.5}})


def test_works_start_in_sequence_from_the_newest_model_one_per_device() -> None:
    change = transition(buffered(), WorkStarted(works=[work(1, "a"), work(2, "b")]), NOW)
    assert (change.state.phase, change.state.works_sent, change.state.deadline_at) == (Phase.training, 2, NOW + timedelta(seconds=60))
    assert change.message.startswith("works 1..2 started from aggregation 0: a b=16")
    refusals = {
        "have work in flight": WorkStarted(works=[work(3, "a")]),
        "do not follow": WorkStarted(works=[work(4, "c")]),
        "newest global model": WorkStarted(works=[work(3, "c", round_number=2)]),
    }
    for words, event in refusals.items():
        with pytest.raises(Refused, match=words):
            transition(change.state, event, NOW)


def test_an_update_joins_the_buffer_once_and_only_from_its_work_in_flight() -> None:
    taken = transition(RUNNING, UpdateAccepted(update=update(work(1, "a", started_s=0.0))), NOW)
    assert taken.state.received == {"a#1": update(work(1, "a")).digest()} and [w.work for w in taken.state.in_flight] == [2]
    assert taken.state.device_clock_s == {"a": 0.2} and taken.device_id == "a"
    expired = transition(RUNNING, WorkExpired(works=[2]), NOW).state
    assert [w.work for w in expired.in_flight] == [1] and expired.empty_rounds == 1
    cases = {
        Accepted.duplicate: (taken.state, update(work(1, "a"))),  # delivered again
        Accepted.late: (expired, update(work(2, "b"))),  # its work expired
        Accepted.not_assigned: (RUNNING, update(work(1, "a"), steps=40)),  # other work than assigned
    }
    for outcome, (state, u) in cases.items():
        with pytest.raises(UpdateRefused) as refused:
            transition(state, UpdateAccepted(update=u), NOW)
        assert refused.value.outcome == outcome
    closed = transition(taken.state, BufferClosed(round=1, size=1), NOW).state  # still a duplicate while its buffer is aggregated
    with pytest.raises(UpdateRefused) as refused:
        transition(closed, UpdateAccepted(update=update(work(1, "a"))), NOW)
    assert refused.value.outcome == Accepted.duplicate


def test_a_dropped_work_moves_its_device_s_clock_on_and_counts_in_the_next_aggregation_s_energy() -> None:
    """What a killed or frozen device spent on a work it never handed in is not known: its clock
    goes on by the device time its table expects of the work (0.1 s here), its next work starts
    there, and the next aggregation counts the work's expected energy (0.8 J) and names it."""
    costly = assignment("b").model_copy(update={"expected_energy_j": 0.8})
    dropped = work(2, "b", started_s=0.5).model_copy(update={"assignment": costly})
    expired = transition(RUNNING.model_copy(update={"in_flight": [work(1, "a"), dropped]}), WorkExpired(works=[2]), NOW).state
    assert expired.device_clock_s == {"b": pytest.approx(0.6)} and expired.dropped == [dropped]
    again = plan_round(view(expired)).event
    assert isinstance(again, WorkStarted) and {w.device_id: w.started_s for w in again.works} == {"b": pytest.approx(0.6), "c": 0.0}
    closed = transition(
        transition(expired, UpdateAccepted(update=update(work(1, "a"))), NOW).state, BufferClosed(round=1, size=1), NOW
    ).state
    record = buffer_record(1, 0.6, [Buffered(update(work(1, "a")).trained, 1, 0.2, 0)], 0.0, dropped=closed.dropped)
    assert (record.works, record.dropped, record.missing, record.energy_j) == ([1], [2], ["b"], pytest.approx(1.5 + 0.8))
    assert (record.elapsed_s, record.device_time_s) == (0.2, 0.2)  # the aggregation still happens at its last update's finish
    meanwhile = transition(transition(closed, WorkStarted(works=[work(3, "c")]), NOW).state, WorkExpired(works=[3]), NOW).state
    done = transition(meanwhile, RoundAggregated(record=record, weights=WEIGHTS), NOW).state
    assert [w.work for w in done.dropped] == [3]  # dropped while the buffer was aggregated: the next aggregation's


def test_a_closed_buffer_is_aggregated_while_the_next_one_fills() -> None:
    state = transition(RUNNING, UpdateAccepted(update=update(work(1, "a"))), NOW).state
    closed = transition(state, BufferClosed(round=1, size=1), NOW)
    assert (closed.state.aggregating, closed.state.received, closed.state.phase) == (state.received, {}, Phase.training)
    with pytest.raises(Refused, match="runs already"):
        transition(closed.state, BufferClosed(round=1, size=1), NOW)
    filling = transition(closed.state, UpdateAccepted(update=update(work(2, "b"))), NOW).state  # the device did not wait
    assert list(filling.received) == ["b#2"] and list(filling.aggregating) == ["a#1"]
    record = buffer_record(1, 0.6, [Buffered(update(work(1, "a")).trained, 1, 0.2, 0)], 0.0)
    with pytest.raises(Refused, match="not being aggregated"):
        transition(filling, RoundAggregated(record=record.model_copy(update={"round": 2}), weights=WEIGHTS), NOW)
    done = transition(filling, RoundAggregated(record=record, weights=WEIGHTS), NOW).state
    assert (done.round, done.global_weights, done.accuracy, done.aggregating, list(done.received)) == (1, WEIGHTS, 0.6, {}, ["b#2"])


def test_a_buffer_closes_with_its_k_oldest_updates_and_the_others_wait_for_the_next() -> None:
    """Three updates in with K = 2 (they came in while aggregation 1 ran): aggregation 2 takes
    the two of the oldest works (by number, not as text), the third waits, and the planner
    closes it into aggregation 3 as soon as K are in again; while a full buffer waits behind
    the aggregation running, no device starts another work."""
    filling = buffered(phase=Phase.training, round=1, received={"a#12": "x", "b#3": "y", "c#5": "z"})
    with pytest.raises(Refused, match="buffer of 4 updates"):
        transition(filling, BufferClosed(round=2, size=4), NOW)
    full = plan_round(view(filling))
    assert full.event == BufferClosed(round=2, size=2)
    closed = transition(filling, full.event, NOW)
    assert (closed.state.aggregating, closed.state.received) == ({"b#3": "y", "c#5": "z"}, {"a#12": "x"})
    assert closed.message == "aggregation 2: buffer closed with 2 updates (b#3, c#5)"
    record = buffer_record(2, 0.6, [Buffered(update(work(3, "b")).trained, 3, 0.2, 0)], 0.0)
    assert isinstance(plan_round(view(closed.state)).event, WorkStarted)  # the devices train on while the server aggregates
    waiting = closed.state.model_copy(update={"received": {**closed.state.received, "b#15": "v"}})
    assert plan_round(view(waiting)).event is None  # until a full buffer waits behind the aggregation running
    done = transition(closed.state, RoundAggregated(record=record, weights=WEIGHTS), NOW).state
    assert done.received == {"a#12": "x"} and isinstance(plan_round(view(done)).event, WorkStarted)
    again = done.model_copy(update={"received": {**done.received, "c#14": "w"}})
    assert plan_round(view(again)).event == BufferClosed(round=3, size=2)


def test_rounds_and_buffers_do_not_mix() -> None:
    for event in (RoundOpened(round=1, assignments=[assignment("a")], deadline_at=NOW), RoundClosed(round=1)):
        with pytest.raises(Refused, match="buffered job"):
            transition(RUNNING, event, NOW)
    rounds = FederatedState(global_weights="init:0", phase=Phase.training, round=1)
    for event in (WorkStarted(works=[work(1, "a")]), WorkExpired(works=[1]), BufferClosed(round=1, size=1)):
        with pytest.raises(Refused, match="only to a buffered job"):
            transition(rounds, event, NOW)


def device(device_id: str) -> DeviceInfo:
    return DeviceInfo(device_id=device_id, device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True)


def view(state: FederatedState, live: str = "abc", caps: dict | None = None) -> RoundView:
    return RoundView(RECORD, state, NOW, {d: device(d) for d in live}, {"twin": Reuse(TABLE)}, caps or {})


def test_the_planner_starts_every_idle_device_closes_full_buffers_and_drops_overdue_works() -> None:
    first = plan_round(view(buffered()))
    assert isinstance(first.event, WorkStarted) and [(w.work, w.device_id, w.round) for w in first.event.works] == [
        (1, "a", 1), (2, "b", 1), (3, "c", 1)]  # fmt: skip
    assert [(e.request.device_id, e.request.work) for e in first.effects if isinstance(e, SendTrain)] == [("a", 1), ("b", 2), ("c", 3)]
    state = buffered(phase=Phase.training, in_flight=first.event.works[2:], works_sent=3, received={"a#1": "d", "b#2": "e"},
                     device_clock_s={"a": 0.3, "b": 0.5})  # fmt: skip
    full = plan_round(view(state))
    assert full.event == BufferClosed(round=1, size=2) and [e.request.round for e in full.effects if isinstance(e, Aggregate)] == [1]
    meanwhile = plan_round(view(state.model_copy(update={"aggregating": state.received, "received": {}})))
    assert isinstance(meanwhile.event, WorkStarted)  # a and b start again at once, from the newest model, on their own clocks
    assert [(w.work, w.device_id, w.round, w.started_s) for w in meanwhile.event.works] == [(4, "a", 1, 0.3), (5, "b", 1, 0.5)]
    overdue = state.model_copy(update={"in_flight": [w.model_copy(update={"deadline_at": NOW}) for w in state.in_flight]})
    assert plan_round(view(overdue)).event == WorkExpired(works=[3])
    assert plan_round(view(buffered(), live="")).event.notice.startswith("no device of the job is heard from")


def test_a_buffered_job_finishes_between_aggregations_at_its_target_or_its_last_one() -> None:
    reached = buffered(phase=Phase.training, round=2, accuracy=0.95)
    assert "reached the target 0.9 in aggregation 2" in plan_round(view(reached)).event.reason
    aggregating = plan_round(view(reached.model_copy(update={"aggregating": {"a#1": "d"}}))).event
    assert isinstance(aggregating, WorkStarted)  # the aggregation running decides; the devices train on meanwhile
    last = plan_round(view(buffered(phase=Phase.training, round=5, accuracy=0.5))).event
    assert last.phase == Phase.failed and "not reached in 5 aggregations" in last.reason


def test_a_cap_dropped_on_one_device_changes_only_its_own_next_work() -> None:
    state = buffered(phase=Phase.training, in_flight=[work(1, "b")], works_sent=3, round=1)
    before = {w.device_id: w.assignment for w in plan_round(view(state)).event.works}
    caps = {"a": DeviceCap(power_cap_w=min(p for row in TABLE.peak_power_w for p in row if p) + 0.01, version=1, set_at=NOW)}
    after = {w.device_id: w.assignment for w in plan_round(view(state, caps=caps)).event.works}
    assert set(after) == {"a", "c"} and after["a"].power_cap_w == caps["a"].power_cap_w and before["a"].power_cap_w is None
    assert (after["a"].batch_size, after["a"].frequency_hz) != (before["a"].batch_size, before["a"].frequency_hz)


def test_fedbuff_s_server_step_is_fedavg_for_fresh_updates_and_shrinks_stale_ones() -> None:
    start = {"w": torch.zeros(3), "n": torch.tensor(4)}
    trained = [{"w": torch.tensor([1.0, 2.0, 3.0]), "n": torch.tensor(9)}, {"w": torch.tensor([3.0, 0.0, 1.0]), "n": torch.tensor(7)}]
    changes = [delta(t, start) for t in trained]
    fresh = apply_buffer(start, list(zip(changes, buffer_weights(SPEC, [100, 300], [0, 0]))))
    assert torch.allclose(fresh["w"], fedavg([(trained[0], 100.0), (trained[1], 300.0)])["w"]) and fresh["n"].item() == 7
    stale = apply_buffer(start, list(zip(changes, buffer_weights(SPEC, [100, 300], [0, 3]))))
    assert torch.allclose(stale["w"], 0.25 * trained[0]["w"] + 0.75 / 2 * trained[1]["w"])  # 1/sqrt(1 + 3) = 1/2
    flat = SPEC.aggregation.model_copy(update={"staleness": "none"})
    assert buffer_weights(SPEC.model_copy(update={"aggregation": flat}), [100, 300], [0, 3]) == [0.25, 0.75]


def test_a_buffered_aggregation_s_device_time_is_its_latest_update_s_finish() -> None:
    trained = update(work(1, "a")).trained
    record = buffer_record(3, 0.7, [Buffered(trained, 4, 1.5, 0), Buffered(trained, 6, 2.25, 2)], 1.0)
    assert (record.elapsed_s, record.device_time_s, record.staleness, record.works, record.energy_j) == (2.25, 1.25, [0, 2], [4, 6], 3.0)
    assert isinstance(record, RoundRecord)
