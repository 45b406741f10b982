"""A federated job's state in a real Redis: an update counts only in its open round, once, for
a device the round assigns; closing a round fixes what it aggregates; the spec is checked
field by field before anything is stored."""

from datetime import timedelta

import pytest

from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import DeviceRound, FederatedRecord, FederatedState, LocalUpdate
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.schemas import utc_now
from edgetrain.common.store.federated import Accepted, Refused
from edgetrain.tasks.client import JobSpecError, validate_federated

JOB = "fed0123456ab"
SPEC = {"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
        "target_accuracy": 0.9, "devices": [{"device_id": "a"}, {"device_id": "b", "power_cap_w": 5.0}]}  # fmt: skip


def assignment(device_id: str) -> Assignment:
    return Assignment(device_id=device_id, device_type="jetson-nano", power_cap_w=None, batch_size=16, frequency_hz=921_600_000,
                      local_steps=4, expected_time_s=0.1, expected_energy_j=None, strategy="equation4")  # fmt: skip


def update(device_id: str, round_number: int) -> LocalUpdate:
    trained = DeviceRound(assignment=assignment(device_id), device_time_s=0.1, energy_j=1.0, samples=64)
    return LocalUpdate(job_id=JOB, device_id=device_id, round=round_number, weights=f"artifact:x-{device_id}.pt#sha256={'0' * 64}",
                       held_samples=100, trained=trained)  # fmt: skip


def open_round(store, round_number: int, devices: list[str]) -> None:
    def decide(state: FederatedState, _) -> FederatedState:
        return state.model_copy(update={"phase": "training", "round": round_number, "assignments": [assignment(d) for d in devices],
                                        "deadline_at": utc_now() + timedelta(seconds=60)})  # fmt: skip

    store.federated.change(JOB, decide)


@pytest.fixture
def job(store):
    store.federated.create(FederatedRecord(job_id=JOB, spec=FederatedSpec.model_validate(SPEC)))
    return store


def test_an_update_counts_once_and_only_in_its_open_round_for_an_assigned_device(job) -> None:
    store = job
    assert store.federated.submit(update("a", 1)) == Accepted.late  # no round open yet
    open_round(store, 1, ["a"])
    assert store.federated.submit(update("b", 1)) == Accepted.not_assigned
    assert store.federated.submit(update("a", 1)) == Accepted.accepted
    assert store.federated.submit(update("a", 1)) == Accepted.duplicate
    assert store.federated.submit(update("a", 2)) == Accepted.late
    assert list(store.federated.updates(JOB, 1)) == ["a"]


def test_closing_a_round_fixes_its_updates_and_refuses_those_that_come_later(job) -> None:
    store = job
    open_round(store, 1, ["a", "b"])
    store.federated.submit(update("a", 1))
    closed = store.federated.close_round(JOB, 1)
    assert closed.phase == "aggregating" and closed.closed_with == ["a"]
    assert store.federated.submit(update("b", 1)) == Accepted.late
    assert list(store.federated.updates(JOB, 1)) == ["a"]
    with pytest.raises(Refused):
        store.federated.close_round(JOB, 1)


def test_a_job_with_a_round_past_its_deadline_is_due_for_the_reaper(job) -> None:
    store = job
    open_round(store, 1, ["a"])
    assert store.federated.due() == []
    store.federated.change(JOB, lambda s, _: s.model_copy(update={"deadline_at": utc_now() - timedelta(seconds=1)}))
    assert store.federated.due() == [JOB]
    store.federated.change(JOB, lambda s, _: s.model_copy(update={"phase": "cancelled"}))
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
    from edgetrain.common.federated.records import RoundRecord
    from edgetrain.common.jobs import EventKind, JobEvent

    store = job
    open_round(store, 1, ["a", "b"])
    store.federated.submit(update("a", 1))
    store.federated.close_round(JOB, 1)
    done = RoundRecord(round=1, accuracy=0.5, device_time_s=0.1, elapsed_s=0.1, energy_j=1.0, devices=[update("a", 1).trained],
                       missing=["b"])  # fmt: skip
    event = JobEvent(kind=EventKind.federated_round, message="round 1 aggregated")
    state = store.federated.aggregated(JOB, done, "artifact:g.pt#sha256=" + "1" * 64, event)
    assert (state.phase, state.accuracy, state.elapsed_s, state.empty_rounds) == ("aggregated", 0.5, 0.1, 0)
    with pytest.raises(Refused):  # a second aggregation of the round changes nothing
        store.federated.aggregated(JOB, done, "artifact:h.pt#sha256=" + "2" * 64, event)
    assert store.federated.rounds(JOB) == [done] and store.federated.state(JOB).global_weights.startswith("artifact:g.pt")
    assert "rounds" not in store.federated.state(JOB).model_dump()


def test_a_finished_federated_job_expires_after_the_retention(redis_server) -> None:
    from edgetrain.common.store import Store

    store = Store.connect(redis_server.url, job_retention_s=3600)
    store.clear()
    store.federated.create(FederatedRecord(job_id=JOB, spec=FederatedSpec.model_validate(SPEC)))
    assert store._redis.ttl(store.keys.federated_state(JOB)) == -1
    store.federated.change(JOB, lambda s, _: s.model_copy(update={"phase": "completed"}))
    assert 3500 < store._redis.ttl(store.keys.federated_state(JOB)) <= 3600
    assert 3500 < store._redis.ttl(store.keys.federated(JOB)) <= 3600
