"""A federated job's state in a real Redis, changed only by `FederatedStore.apply`: an update
counts only in its open round, once, for a device the round assigns; closing a round fixes
what it aggregates; only updates the state accepted are read for aggregation, whatever else
is written into the round's record; the spec is checked field by field before anything is
stored."""

from datetime import timedelta

import pytest

from edgetrain.common.federated.events import (
    Accepted,
    BufferClosed,
    Cancelled,
    Finished,
    Refused,
    RoundAggregated,
    RoundClosed,
    RoundOpened,
    UpdateAccepted,
    UpdateRefused,
    WorkStarted,
)
from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import DeviceRound, FederatedRecord, LocalUpdate, Phase, RoundRecord, Work
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.jobs.state import EventKind
from edgetrain.common.schemas import utc_now
from edgetrain.common.store.ledger import SentTask
from edgetrain.tasks.client import JobSpecError, validate_federated

JOB = "fed0123456ab"
SPEC = {"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
        "target_accuracy": 0.9, "devices": [{"device_id": "a"}, {"device_id": "b", "power_cap_w": 5.0}]}  # fmt: skip


def assignment(device_id: str) -> Assignment:
    return Assignment(device_id=device_id, device_type="jetson-nano", power_cap_w=None, batch_size=16, frequency_hz=921_600_000,
                      local_steps=4, expected_time_s=0.1, expected_energy_j=None, strategy="equation4")  # fmt: skip


def update(device_id: str, round_number: int, weights: str | None = None, held: int = 100) -> LocalUpdate:
    trained = DeviceRound(assignment=assignment(device_id), device_time_s=0.1, energy_j=1.0, samples=64)
    return LocalUpdate(job_id=JOB, device_id=device_id, round=round_number, weights=weights or f"artifact:x-{device_id}.pt#sha256={'0' * 64}",
                       held_samples=held, trained=trained)  # fmt: skip


def open_round(store, round_number: int, devices: list[str]) -> None:
    store.federated.apply(JOB, RoundOpened(round=round_number, assignments=[assignment(d) for d in devices],
                                           deadline_at=utc_now() + timedelta(seconds=60)))  # fmt: skip


def hand_in(store, u: LocalUpdate) -> Accepted:
    try:
        store.federated.apply(JOB, UpdateAccepted(update=u))
        return Accepted.accepted
    except UpdateRefused as exc:
        return exc.outcome


@pytest.fixture
def job(store):
    record = FederatedRecord(job_id=JOB, spec=FederatedSpec.model_validate(SPEC))
    store.federated.create(record)
    store.federated.start(record)
    return store


def test_a_job_starts_once_with_its_submitted_event(store) -> None:
    record = FederatedRecord(job_id=JOB, spec=FederatedSpec.model_validate(SPEC))
    store.federated.create(record)
    assert store.federated.state(JOB) is None and store.federated.due() == [JOB]  # not started: the reaper advances it
    first = store.federated.start(record)
    assert store.federated.start(record) == first and first.phase == Phase.starting
    assert [e.kind for e in store.federated.events(JOB)] == [EventKind.submitted]
    assert store.federated.due() == []


def test_an_update_counts_once_and_only_in_its_open_round_for_an_assigned_device(job) -> None:
    store = job
    assert hand_in(store, update("a", 1)) == Accepted.late  # no round open yet
    open_round(store, 1, ["a"])
    assert hand_in(store, update("b", 1)) == Accepted.not_assigned
    assert hand_in(store, update("a", 1)) == Accepted.accepted
    assert hand_in(store, update("a", 1, weights=f"artifact:y-a.pt#sha256={'1' * 64}")) == Accepted.duplicate
    assert hand_in(store, update("a", 2)) == Accepted.late
    accepted, ignored = store.federated.updates(JOB, store.federated.state(JOB))
    assert list(accepted) == ["a"] and accepted["a"].weights.startswith("artifact:x-a") and ignored == []


def test_an_update_of_other_work_than_the_round_assigned_is_refused(job) -> None:
    store = job
    open_round(store, 1, ["a"])
    other = update("a", 1)
    other = other.model_copy(
        update={"trained": other.trained.model_copy(update={"assignment": assignment("a").model_copy(update={"local_steps": 400})})}
    )
    assert hand_in(store, other) == Accepted.not_assigned


def test_entries_written_into_a_round_beside_apply_are_never_read_for_aggregation(job) -> None:
    store = job
    open_round(store, 1, ["a", "b"])
    assert hand_in(store, update("a", 1)) == Accepted.accepted
    key = store.keys.federated_round(JOB, 1)
    store._redis.hset(key, "ghost-1", update("ghost-1", 1, held=1_000_000).model_dump_json())  # a device the round never assigned
    store._redis.hset(key, "b", update("b", 1, held=1_000_000).model_dump_json())  # an assigned device, never accepted
    store._redis.hset(key, "a", update("a", 1, weights=f"artifact:forged.pt#sha256={'2' * 64}").model_dump_json())  # replaced
    store._redis.hset(key, "junk", "not an update")
    state = store.federated.apply(JOB, RoundClosed(round=1)).state
    assert state.closed_with == ["a"]  # the state's own record of what it accepted
    accepted, ignored = store.federated.updates(JOB, state)
    assert accepted == {} and ignored == ["a", "b", "ghost-1", "junk"]


def test_closing_a_round_fixes_its_updates_writes_the_aggregation_down_and_refuses_later_updates(job) -> None:
    store = job
    open_round(store, 1, ["a", "b"])
    hand_in(store, update("a", 1))
    aggregation = SentTask(task_id="t" * 32, task="edgetrain.federated_aggregate", queue="server", payload={"job_id": JOB, "round": 1})
    closed = store.federated.apply(JOB, RoundClosed(round=1), [aggregation]).state
    assert closed.phase == Phase.aggregating and closed.closed_with == ["a"]
    assert [t.task_id for t in store.ledger.unseen_since(float("inf"), 10)] == [aggregation.task_id]
    assert hand_in(store, update("b", 1)) == Accepted.late
    assert list(store.federated.updates(JOB, closed)[0]) == ["a"]
    with pytest.raises(Refused):
        store.federated.apply(JOB, RoundClosed(round=1))
    assert store.federated.events(JOB)[-1].message == "round 1 closed with 1 updates; no update from b by the deadline"


def test_a_job_with_a_round_past_its_deadline_or_a_cancel_asked_for_is_due_for_the_reaper(job) -> None:
    store = job
    store.federated.apply(JOB, RoundOpened(round=1, assignments=[assignment("a")], deadline_at=utc_now() - timedelta(seconds=1)))
    assert store.federated.due() == [JOB]
    store.federated.apply(JOB, RoundClosed(round=1))
    assert store.federated.due() == []
    store.federated.request_cancel(JOB)
    assert store.federated.due() == [JOB] and store.federated.cancel_requested_at(JOB) is not None
    store.federated.apply(JOB, Cancelled(reason="cancelled"))
    assert store.federated.due() == [] and store.federated.active() == []


def test_a_malformed_federated_spec_is_refused_naming_every_bad_field() -> None:
    bad = SPEC | {"target_accuracy": 1.5, "model": "nosuchmodel", "devices": [{"device_id": "a"}, {"device_id": "a"}],
                  "partition": {"scheme": "zipf"}, "test_dataset": {"name": "nosuchdata"}}  # fmt: skip
    with pytest.raises(JobSpecError) as caught:
        validate_federated(bad)
    text = str(caught.value)
    for field in ("target_accuracy", "partition.scheme", "model", "test_dataset"):
        assert f"\n  {field}" in text, text
    with pytest.raises(JobSpecError, match="devices: each device may appear once"):
        validate_federated(SPEC | {"devices": [{"device_id": "a"}, {"device_id": "a"}]})
    with pytest.raises(JobSpecError, match="dataset: required when a device names no dataset"):
        validate_federated({k: v for k, v in SPEC.items() if k != "dataset"})


def test_a_round_is_aggregated_once_into_the_rounds_list_and_the_state_stays_small(job) -> None:
    store = job
    open_round(store, 1, ["a", "b"])
    hand_in(store, update("a", 1))
    store.federated.apply(JOB, RoundClosed(round=1))
    done = RoundRecord(round=1, accuracy=0.5, device_time_s=0.1, elapsed_s=0.1, energy_j=1.0, devices=[update("a", 1).trained],
                       missing=["b"])  # fmt: skip
    state = store.federated.apply(JOB, RoundAggregated(record=done, weights="artifact:g.pt#sha256=" + "1" * 64)).state
    assert (state.phase, state.accuracy, state.elapsed_s, state.empty_rounds, state.received) == (Phase.aggregated, 0.5, 0.1, 0, {})
    with pytest.raises(Refused):  # a second aggregation of the round changes nothing
        store.federated.apply(JOB, RoundAggregated(record=done, weights="artifact:h.pt#sha256=" + "2" * 64))
    assert store.federated.rounds(JOB) == [done] and store.federated.state(JOB).global_weights.startswith("artifact:g.pt")
    assert not store._redis.exists(store.keys.federated_round(JOB, 1))  # the round's updates went with it
    assert "rounds" not in store.federated.state(JOB).model_dump()


def test_a_failed_aggregation_fails_the_job_only_while_its_round_is_being_aggregated(job) -> None:
    store = job
    open_round(store, 1, ["a"])
    hand_in(store, update("a", 1))
    store.federated.apply(JOB, RoundClosed(round=1))
    done = RoundRecord(round=1, accuracy=0.5, device_time_s=0.1, elapsed_s=0.1, energy_j=1.0, devices=[update("a", 1).trained])
    store.federated.apply(JOB, RoundAggregated(record=done, weights="artifact:g.pt#sha256=" + "1" * 64))
    with pytest.raises(Refused, match="not being aggregated"):  # another run aggregated it meanwhile
        store.federated.apply(JOB, Finished(phase=Phase.failed, reason="round 1: aggregation failed", aggregating=1))
    assert store.federated.state(JOB).phase == Phase.aggregated


def test_a_finished_federated_job_expires_after_the_retention(redis_server) -> None:
    from edgetrain.common.store import Store

    store = Store.connect(redis_server.url, job_retention_s=3600)
    store.clear()
    record = FederatedRecord(job_id=JOB, spec=FederatedSpec.model_validate(SPEC))
    store.federated.create(record)
    store.federated.start(record)
    assert store._redis.ttl(store.keys.federated_state(JOB)) == -1
    store.federated.apply(JOB, Finished(phase=Phase.completed, reason="reached"))
    assert 3500 < store._redis.ttl(store.keys.federated_state(JOB)) <= 3600
    assert 3500 < store._redis.ttl(store.keys.federated(JOB)) <= 3600
    with pytest.raises(Refused, match="finished"):
        store.federated.apply(JOB, Cancelled(reason="cancelled"))


def test_a_buffered_job_keeps_its_updates_in_one_buffer_and_aggregates_only_those_it_closed_with(store) -> None:
    buffered = FederatedSpec.model_validate(SPEC | {"aggregation": {"mode": "buffered", "buffer_size": 1}})
    store.federated.create(FederatedRecord(job_id=JOB, spec=buffered))
    assert store.federated.start(store.federated.record(JOB)).buffered
    works = [Work(work=n, round=1, weights="init:0", started_s=0.0, deadline_at=utc_now() + timedelta(seconds=60), assignment=assignment(d))
             for n, d in ((1, "a"), (2, "b"))]  # fmt: skip
    store.federated.apply(JOB, WorkStarted(works=works))
    first, second = (update(w.device_id, 1).model_copy(update={"work": w.work}) for w in works)
    assert hand_in(store, first) == Accepted.accepted and hand_in(store, first) == Accepted.duplicate
    aggregating = store.federated.apply(JOB, BufferClosed(round=1, size=1)).state
    assert hand_in(store, second) == Accepted.accepted  # the next buffer fills while aggregation 1 runs
    accepted, ignored = store.federated.updates(JOB, aggregating)  # the state read before b#2 came in
    assert list(accepted) == ["a#1"] and ignored == []  # b#2 is the next aggregation's, not an entry written beside
    key = store.keys.federated_buffer(JOB)
    store._redis.hset(key, "ghost#9", update("ghost", 1, held=1_000_000).model_copy(update={"work": 9}).model_dump_json())
    accepted, ignored = store.federated.updates(JOB, store.federated.state(JOB))
    assert list(accepted) == ["a#1"] and ignored == ["ghost#9"]
    record = RoundRecord(round=1, accuracy=0.5, device_time_s=0.1, elapsed_s=0.1, energy_j=1.0, devices=[first.trained], works=[1])
    store.federated.apply(JOB, RoundAggregated(record=record, weights="artifact:g.pt#sha256=" + "1" * 64))
    assert store._redis.hkeys(key) == ["b#2"] and hand_in(store, first) == Accepted.late  # the entry beside is gone with it
    store.federated.apply(JOB, Cancelled(reason="by hand"))
    assert not store._redis.exists(key)
    assert store.federated.models_to_delete(JOB) == [second.weights]  # the update it did not aggregate; its last global model stays
