"""Every step of the job planner (the event it applies and its effects), without Redis or Celery."""

import random
from datetime import timedelta

import pytest

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.effects import AwaitDevice, ClaimAndEstimate, ClaimAndProfile, Note, SendFineTune
from edgetrain.common.jobs.events import Dispatched, Failed, Prepared, Waiting
from edgetrain.common.jobs.planner import PartView, Step, plan
from edgetrain.common.jobs.state import DevicePart, PartState
from edgetrain.common.keys import table_id, vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, JobSpec, RelationVector, utc_now
from edgetrain.common.selection import Energy, Robust, TimeWithinEnergyBudget, ZeusCost, lowest_feasible_cap_w, strategy_for
from edgetrain.common.testing.tables import B, F, brute_force, random_monotone_table

SOFTWARE = {"edgetrain": "1", "torch": "2"}


def spec(cap: float | None = 5.0, **changes) -> JobSpec:
    return JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": cap}], batch_sizes=B, **changes))


def device(**changes) -> DeviceInfo:
    base = dict(device_id="d1", device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True, software=SOFTWARE)
    return DeviceInfo(**(base | changes))


def table(seed: int = 0, **changes):
    t = random_monotone_table(random.Random(seed), time_noise=False)
    return t.model_copy(update={"device_type": "twin", "model": "smallcnn", "input_shape": [1, 28, 28], "produced_by": SOFTWARE} | changes)


def vector(**changes) -> RelationVector:
    base = dict(batch_sizes=B, ratios=[0.3, 0.4, 0.5, 0.7, 0.8, 1.0], samples_mean=[300.0, 400, 500, 700, 800, 1000])
    return RelationVector(**(base | changes))


def view(job: JobSpec | None = None, state: PartState = PartState.pending, **changes) -> PartView:
    job = job or spec()
    target = job.devices[0]
    part = DevicePart(device_id=target.device_id, power_cap_w=target.power_cap_w, state=state)
    base = dict(job_id="j1", spec=job, target=target, part=part, device=device(), table=table(), vector=vector(), token="t1")
    return PartView(**(base | changes))


def failed(step: Step) -> str:
    assert isinstance(step.event, Failed), step
    return step.event.reason


def effects(step: Step, kind: type) -> list:
    return [e for e in step.effects if isinstance(e, kind)]


def dispatched(step: Step) -> Dispatched:
    assert isinstance(step.event, Dispatched), step
    assert step.effects[0] == SendFineTune("t1", step.event.request, step.event.device.control) and step.event.token == "t1"  # its token
    return step.event


def test_a_final_part_changes_nothing_and_a_queued_or_running_one_keeps_its_notice() -> None:
    for state in (PartState.completed, PartState.failed):
        assert plan(view(state=state)) == Step(None)
    for state in (PartState.queued, PartState.finetuning):
        assert plan(view(state=state)) == Step(Waiting(notice=None))


def test_a_device_not_registered_yet_waits_the_job_s_grace_from_the_submission_then_fails_naming_the_registered_ones() -> None:
    submitted = utc_now()
    within = plan(view(spec(device_grace_s=60), device=None, registered=("a", "b"), submitted_at=submitted,
                       now=submitted + timedelta(seconds=59)))  # fmt: skip
    deadline = submitted + timedelta(seconds=60)
    assert isinstance(within.event, Waiting) and within.event.device_missing and within.effects == (AwaitDevice("d1", deadline),), within
    assert within.event.notice == (f"device 'd1' is not registered in the fleet (yet); the part fails at {deadline:%H:%M:%S} UTC "
                                   "unless its worker starts (`edgetrain worker device --device-id ...`)")  # fmt: skip
    after = plan(view(spec(device_grace_s=60), device=None, registered=("a", "b"), submitted_at=submitted, now=deadline))
    assert (
        failed(after) == "unknown device 'd1': not registered in the fleet within the job's grace period of 60 s (registered: ['a', 'b'])"
    )


def test_a_re_queued_part_waits_for_an_unregistered_device_from_its_re_queue() -> None:
    submitted = utc_now() - timedelta(hours=1)
    requeued = DevicePart(device_id="d1", power_cap_w=5.0, state=PartState.pending, requeued_at=submitted + timedelta(minutes=59))
    step = plan(view(spec(device_grace_s=120), device=None, part=requeued, submitted_at=submitted, now=utc_now()))
    assert step.effects == (AwaitDevice("d1", requeued.requeued_at + timedelta(seconds=120)),)


def test_missing_table_and_vector_profile_and_estimate_together() -> None:
    job = spec()
    step = plan(view(job, table=None, vector=None))
    assert isinstance(step.event, Prepared) and step.event.state == PartState.profiling
    (profile,) = effects(step, ClaimAndProfile)
    (estimate,) = effects(step, ClaimAndEstimate)
    assert profile.table_id == table_id("twin", "smallcnn", [1, 28, 28]) and profile.stored_at is None
    assert estimate == ClaimAndEstimate(vector_key(job.estimation_request()), job.estimation_request())
    request = profile.request
    assert (request.device_id, request.model, request.batch_sizes, request.power_cap_w) == ("d1", "smallcnn", B, 5.0)
    assert request.options == job.profiling and request.optimizer == "adam"
    assert effects(step, Note) == []


def test_a_table_without_a_vector_estimates_only() -> None:
    step = plan(view(vector=None))
    assert isinstance(step.event, Prepared) and step.event.state == PartState.estimating
    assert effects(step, ClaimAndProfile) == [] and len(effects(step, ClaimAndEstimate)) == 1


def test_a_vector_without_a_table_profiles_only() -> None:
    step = plan(view(table=None))
    assert isinstance(step.event, Prepared) and step.event.state == PartState.profiling
    assert len(effects(step, ClaimAndProfile)) == 1 and effects(step, ClaimAndEstimate) == []


@pytest.mark.parametrize(
    "stale_table, changes, words",
    [
        (table(produced_by={"edgetrain": "1", "torch": "1.10"}), {}, "made by other software"),
        (table(mode="staircase", power_cap_w=4.0), {}, "staircase table for cap 4.0 W, not 5.0 W"),
        (table(), {"not_before": utc_now() + timedelta(seconds=5)}, "force"),
        (table(control=ControlAxis.POWER_LIMIT_MW), {}, "made on the power_limit_mw axis, the device uses gpu_clock_hz"),
    ],
)
def test_a_stale_table_is_profiled_again_with_the_reason(stale_table, changes, words) -> None:
    step = plan(view(table=stale_table, **changes))
    (profile,) = effects(step, ClaimAndProfile)
    (note,) = effects(step, Note)
    assert not profile.request.merge and profile.stored_at == stale_table.created_at and words in note.message


def test_a_failed_table_or_vector_fails_the_part_with_its_reason() -> None:
    assert failed(plan(view(table=None, table_failure="profiling on d1 failed: boom"))) == "profiling on d1 failed: boom"
    assert failed(plan(view(vector=None, vector_failure="estimation failed"))) == "estimation failed"
    stale = table(produced_by={"edgetrain": "1", "torch": "1.10"})  # a table stored that cannot serve, whose profile failed
    assert failed(plan(view(table=stale, table_failure="profiling on d1 failed: boom"))) == "profiling on d1 failed: boom"
    # a failure does not matter while the resource serves
    dispatched(plan(view(table_failure="old", vector_failure="old")))


@pytest.mark.parametrize("cap", [None, 3.0, 5.0, 8.0])
def test_both_present_fine_tunes_with_the_equation4_argmin(cap) -> None:
    job = spec(cap)
    decision = dispatched(plan(view(job)))
    objective, b, f = brute_force(table(), vector(), cap)
    assert (decision.selection.batch_size, decision.selection.frequency_hz) == (b, f)
    assert decision.selection.estimated_time_s == pytest.approx(objective)
    t = table()
    assert decision.estimated_time_to_accuracy_s == pytest.approx(t.time_s[B.index(b)][F.index(f)] * vector().samples_for(b) / t.samples)
    request = decision.request
    assert (request.job_id, request.device_id, request.batch_size, request.frequency_hz) == ("j1", "d1", b, f)
    assert (request.model, request.weights, request.dataset, request.seed) == (job.model, job.weights, job.dataset, job.seeds[0])
    assert decision.baseline1.batch_size == 128


def test_a_device_dataset_overrides_the_jobs() -> None:
    job = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0, "dataset": {"name": "digits"}}]))
    assert dispatched(plan(view(job))).request.dataset.name == "digits"


def test_a_cap_below_every_configuration_fails_naming_the_lowest_that_works() -> None:
    lowest = lowest_feasible_cap_w(table(), vector())
    assert f"the lowest cap that would work is {lowest:.2f} W" in failed(plan(view(spec(lowest - 0.01))))


def test_nothing_to_select_fails() -> None:
    assert "the proxy never reached the target accuracy at any batch size" in failed(plan(view(vector=vector(ratios=[None] * len(B)))))
    assert "no batch size is both in the lookup table" in failed(
        plan(view(vector=vector(batch_sizes=[256], ratios=[1.0], samples_mean=[100.0])))
    )


def test_baseline1_without_a_configuration_does_not_stop_the_fine_tune() -> None:
    low_cap = sorted(p for row in table().peak_power_w for p in row)[0] + 0.01  # only the smallest point fits
    envelope = [1e3] * len(F)  # a model-agnostic envelope no frequency of which fits the cap
    step = plan(view(spec(low_cap), device=device(power_envelope_w=envelope)))
    assert dispatched(step).baseline1 is None
    (note,) = effects(step, Note)
    assert "below what any configuration needs" in note.message and note.once == "baseline1:j1:d1:t1"


def test_a_missing_device_waits_for_its_grace_period_then_fails_naming_when_it_was_last_seen() -> None:
    seen, ttl = utc_now(), 30.0
    for state in (PartState.pending, PartState.profiling, PartState.finetuning):
        waiting = plan(view(state=state, device=None, last_seen=seen, heartbeat_ttl_s=ttl, now=seen + timedelta(seconds=149)))
        assert (
            isinstance(waiting.event, Waiting) and waiting.event.device_missing and "has not been heard from since" in waiting.event.notice
        )
        gone = plan(view(state=state, device=None, last_seen=seen, heartbeat_ttl_s=ttl, now=seen + timedelta(seconds=150)))
        assert failed(gone) == (
            f"device 'd1' disappeared at {seen:%Y-%m-%d %H:%M:%S} UTC (its last heartbeat; "
            "it did not come back within the job's grace period of 120 s)"
        )
    short = spec(device_grace_s=5)
    failed(plan(view(short, device=None, last_seen=seen, heartbeat_ttl_s=ttl, now=seen + timedelta(seconds=36))))
    assert plan(view(state=PartState.finetuning)) == Step(Waiting(notice=None))  # device live: the task owns the part


def test_a_table_without_rows_for_some_batch_sizes_profiles_those_rows_to_merge() -> None:
    partial = table()
    keep = [0, 1, 2]  # rows 4, 8, 16
    partial = partial.model_copy(update={
        "batch_sizes": [B[i] for i in keep], "time_s": [partial.time_s[i] for i in keep],
        "peak_power_w": [partial.peak_power_w[i] for i in keep], "max_batch_size": 16,
    })  # fmt: skip
    step = plan(view(table=partial))
    assert isinstance(step.event, Prepared) and step.event.state == PartState.profiling and effects(step, Note) == []
    (profile,) = effects(step, ClaimAndProfile)
    assert profile.request.batch_sizes == [32, 64, 128] and profile.request.merge


def fixed_spec(batch_size: int, frequency_hz: int, cap: float | None = None) -> JobSpec:
    target = {"device_id": "d1", "power_cap_w": cap, "configuration": {"batch_size": batch_size, "frequency_hz": frequency_hz}}
    return JobSpec.model_validate(quick_job([target], batch_sizes=B))


@pytest.mark.parametrize("cap", [None, 8.0])
def test_a_fixed_configuration_is_fine_tuned_instead_of_the_equation4_choice(cap) -> None:
    t = table()
    i, j = B.index(32), F.index(200)
    assert cap is None or t.peak_power_w[i][j] <= cap
    decision = dispatched(plan(view(fixed_spec(32, 200, cap))))
    choice = decision.selection
    assert (choice.strategy, choice.batch_size, choice.frequency_hz) == ("fixed", 32, 200)
    assert choice.estimated_time_s == pytest.approx(t.time_s[i][j] * vector().ratio(32))
    assert choice.peak_power_w == t.peak_power_w[i][j]
    assert decision.estimated_time_to_accuracy_s == pytest.approx(t.time_s[i][j] * 700 / t.samples)
    assert (decision.request.batch_size, decision.request.frequency_hz) == (32, 200)
    assert brute_force(t, vector(), cap)[1:] != (32, 200)  # not what equation (4) would choose
    assert decision.baseline1.batch_size == 128


def test_a_fixed_configuration_is_checked_against_the_table_when_planned() -> None:
    t = table()
    over = t.peak_power_w[B.index(128)][F.index(800)]
    holes = table(time_s=[[None] * len(F)] + table().time_s[1:])
    cases = [
        (view(fixed_spec(32, 250)), "250 Hz is not one of the device's frequencies"),
        (view(fixed_spec(128, 800, cap=over - 0.01)), f"a peak power of {over:.2f} W in the lookup table, over the power cap"),
        (view(fixed_spec(128, 800), table=table(max_batch_size=64)), "batch size 128 does not fit in memory (b_mem=64)"),
        (view(fixed_spec(4, 100), table=holes), "this point of the lookup table was not measured"),
        (view(fixed_spec(64, 100), vector=vector(ratios=[0.3, 0.4, 0.5, 0.7, None, 1.0])), "never reached the target accuracy"),
    ]
    for case, words in cases:
        assert words in failed(plan(case)), words


def test_a_fixed_configuration_must_name_one_of_the_jobs_batch_sizes() -> None:
    with pytest.raises(ValueError, match=r"devices.0.configuration.batch_size: 256 is not one of the job's batch_sizes"):
        fixed_spec(256, 200)
    with pytest.raises(ValueError, match="frequency_hz"):
        fixed_spec(32, 0)


@pytest.mark.parametrize(
    ("objective", "strategy"),
    [(None, Robust), ("time", Robust), ("energy", Energy), ({"name": "zeus", "eta": 0.3}, ZeusCost),
     ({"name": "time_within_energy_budget", "energy_budget_j": 50}, TimeWithinEnergyBudget)],
)  # fmt: skip
def test_the_job_objective_chooses_the_strategy(objective, strategy) -> None:
    job = spec(**({} if objective is None else {"objective": objective}))
    chosen = strategy_for(job.objective, vector(), job.devices[0].configuration)
    assert type(chosen) is strategy
    if strategy is ZeusCost:
        assert chosen.eta == 0.3


def test_an_energy_job_is_planned_with_the_energy_argmin_under_its_first_scheduled_cap() -> None:
    energy = [[None if t is None else t * (1 + j / 3) for j, t in enumerate(row)] for row in table().time_s]
    job = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 50.0, "power_cap_schedule": [[0, 6.0]]}],
                                           batch_sizes=B, objective="energy"))  # fmt: skip
    decision = dispatched(plan(view(job, table=table(energy_j=energy))))
    assert decision.selection == Energy(vector()).choose(table(energy_j=energy), 6.0)
    assert decision.selection.peak_power_w <= 6.0


@pytest.mark.parametrize(
    ("objective", "field"),
    [({"name": "time_within_energy_budget"}, "energy_budget_j"), ({"name": "energy", "energy_budget_j": 3}, "energy_budget_j"),
     ("watts", "objective.name"), ({"name": "zeus", "eta": 2}, "objective.eta")],
)  # fmt: skip
def test_bad_objectives_are_refused_naming_the_field(objective, field) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        spec(objective=objective)
