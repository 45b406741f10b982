"""The round planner as a pure function: a view of a federated job in, the event to apply and
its effects out; no Redis, no Celery."""

import random
from datetime import timedelta

from edgetrain.common.federated.events import Cancelled, Finished, RoundClosed, RoundOpened, Waiting
from edgetrain.common.federated.planner import EMPTY_ROUNDS, RoundView, plan_round
from edgetrain.common.federated.records import FederatedRecord, FederatedState, Phase
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.jobs.effects import Aggregate, ClaimAndProfile, SendTrain
from edgetrain.common.schemas import DeviceCap, DeviceInfo, utc_now
from edgetrain.common.tables import NoTable, Profile, Reuse
from edgetrain.common.testing.tables import B, F, random_monotone_table

NOW = utc_now()
TABLE = random_monotone_table(random.Random(0), time_noise=False).model_copy(update={"device_type": "twin"})
SPEC = FederatedSpec.model_validate({
    "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"}, "target_accuracy": 0.9,
    "batch_sizes": B, "devices": [{"device_id": "a", "power_cap_w": 4.0}, {"device_id": "b", "power_cap_schedule": [[2, 3.0]]}],
    "max_rounds": 5,
})  # fmt: skip
RECORD = FederatedRecord(job_id="j1", spec=SPEC, created_at=NOW - timedelta(minutes=5))


def device(device_id: str, device_type: str = "twin") -> DeviceInfo:
    return DeviceInfo(device_id=device_id, device_type=device_type, backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True)


def view(state: FederatedState | None = None, live: tuple[str, ...] = ("a", "b"), tables=None, **more) -> RoundView:
    state = state or FederatedState(global_weights="init:0")
    return RoundView(RECORD, state, NOW, {d: device(d) for d in live}, tables or {"twin": Reuse(TABLE)}, more.pop("caps", {}), **more)


def test_the_first_round_opens_with_each_device_s_work_under_its_cap_and_sends_it() -> None:
    step = plan_round(view())
    assert isinstance(step.event, RoundOpened) and step.event.round == 1
    assert step.event.deadline_at == NOW + timedelta(seconds=SPEC.participation.deadline_s)
    caps = {a.device_id: a.power_cap_w for a in step.event.assignments}
    assert caps == {"a": 4.0, "b": None}
    sent = [e.request for e in step.effects if isinstance(e, SendTrain)]
    assert [(r.device_id, r.round, r.batch_size, r.frequency_hz, r.local_steps) for r in sent] == [
        (a.device_id, 1, a.batch_size, a.frequency_hz, a.local_steps) for a in step.event.assignments
    ]


def test_a_cap_set_on_a_device_after_the_job_was_submitted_holds_over_the_spec_s_schedule() -> None:
    after = FederatedState(phase=Phase.aggregated, round=1, global_weights="init:0", accuracy=0.2)
    scheduled = {a.device_id: a.power_cap_w for a in plan_round(view(after)).event.assignments}
    assert scheduled == {"a": 4.0, "b": 3.0}  # b's schedule: 3 W from round 2
    caps = {
        "a": DeviceCap(power_cap_w=2.5, version=1, set_at=NOW),
        "b": DeviceCap(power_cap_w=9.0, version=1, set_at=NOW - timedelta(hours=1)),
    }
    set_on_devices = {a.device_id: a.power_cap_w for a in plan_round(view(after, caps=caps)).event.assignments}
    assert set_on_devices == {"a": 2.5, "b": 3.0}  # b's cap was set before the job: the spec holds


def test_an_open_round_closes_once_every_update_is_in_or_its_deadline_passed() -> None:
    opened = plan_round(view()).event
    state = FederatedState(phase=Phase.training, round=1, global_weights="init:0", assignments=opened.assignments,
                           deadline_at=opened.deadline_at, received={"a": "d"})  # fmt: skip
    assert plan_round(view(state)).event is None
    every = plan_round(view(state.model_copy(update={"received": {"a": "d", "b": "e"}})))
    overdue = plan_round(view(state.model_copy(update={"deadline_at": NOW - timedelta(seconds=1)})))
    for step in (every, overdue):
        assert step.event == RoundClosed(round=1)
        assert [e.request.round for e in step.effects if isinstance(e, Aggregate)] == [1]


def test_nothing_is_planned_while_a_round_is_aggregated_or_after_the_job_ended() -> None:
    for phase in (Phase.aggregating, Phase.completed, Phase.failed, Phase.cancelled):
        step = plan_round(view(FederatedState(phase=phase, round=1, global_weights="init:0")))
        assert step.event is None and step.effects == ()


def test_the_job_finishes_at_its_target_after_empty_rounds_or_at_its_last_round() -> None:
    base = FederatedState(phase=Phase.aggregated, round=2, global_weights="init:0")
    cases = {
        "reached the target": base.model_copy(update={"accuracy": 0.93}),
        f"in {EMPTY_ROUNDS} rounds in a row": base.model_copy(update={"empty_rounds": EMPTY_ROUNDS}),
        "not reached in 5 rounds": base.model_copy(update={"round": 5, "accuracy": 0.5}),
    }
    for words, state in cases.items():
        event = plan_round(view(state)).event
        assert isinstance(event, Finished) and words in event.reason, event
        assert event.phase == (Phase.completed if "reached the target" in words else Phase.failed)


def test_a_cancel_asked_for_ends_the_job_from_any_phase_but_a_final_one() -> None:
    for phase in (Phase.starting, Phase.training, Phase.aggregating, Phase.aggregated):
        event = plan_round(view(FederatedState(phase=phase, round=1, global_weights="init:0"), cancel_requested_at=NOW)).event
        assert isinstance(event, Cancelled)


def test_without_devices_or_tables_the_job_waits_and_one_device_per_type_profiles() -> None:
    assert plan_round(view(live=())).event == Waiting(notice="no device of the job is heard from: the next round starts when one is")
    step = plan_round(view(tables={"twin": Profile(rows=[16, 32], merge=True, why=None, stored_at=NOW)}))
    assert step.event == Waiting(notice="waiting for the lookup tables of twin")
    (profile,) = step.effects
    assert isinstance(profile, ClaimAndProfile) and profile.stored_at == NOW
    assert (profile.request.device_id, profile.request.batch_sizes, profile.request.merge, profile.request.owner) == (
        "a",
        [16, 32],
        True,
        "j1",
    )


def test_a_table_that_failed_for_the_job_fails_it_instead_of_profiling_again() -> None:
    event = plan_round(view(tables={"twin": NoTable("profiling failed: the board overheated")})).event
    assert isinstance(event, Finished) and event.phase == Phase.failed
    assert event.reason == "no lookup table: twin: profiling failed: the board overheated"


def test_a_cap_no_configuration_meets_fails_the_job_naming_the_device() -> None:
    low = SPEC.model_copy(update={"devices": [SPEC.devices[0].model_copy(update={"power_cap_w": 0.1}), SPEC.devices[1]]})
    event = plan_round(RoundView(RECORD.model_copy(update={"spec": low}), FederatedState(global_weights="init:0"), NOW,
                                 {d: device(d) for d in "ab"}, {"twin": Reuse(TABLE)}, {})).event  # fmt: skip
    assert isinstance(event, Finished) and event.reason.startswith("round 1: device a:"), event
