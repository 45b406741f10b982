"""The closed loop on replayed evidence: solo curves of the time-warp model (test loss
2 exp(-p / P0), where the progress p grows by e_b per sample at batch size b), a replayed table
(SIMULATED time and power), and the adaptive control that follows caps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from edgetrain.common.devices.base import Measurement
from edgetrain.common.finetune.adaptive import AdaptiveControl, CapFollower
from edgetrain.common.finetune.belief import PAPER_TRUST
from edgetrain.common.finetune.closed_loop import ClosedLoop, LoopSettings
from edgetrain.common.finetune.exploration import ExplorationPolicy
from edgetrain.common.finetune.learned import (
    DataIdentity,
    FinetuneRecord,
    RecordIdentity,
    Segment,
    learned_vector,
    measuring,
    similar_vector,
)
from edgetrain.common.schemas import DeviceTarget, LearningRatePolicy, ProfileTable, RelationVector
from edgetrain.common.selection import Equation4
from edgetrain.common.testing.devices import ReplayDevice
from edgetrain.common.training import DeviceTotals, train_to_accuracy

# at 200 Hz every batch size is under 4 W; under 3.2 W, b=8 runs at 200 Hz and b=32 at 100 Hz
TABLE = ProfileTable(
    batch_sizes=[8, 32, 128], frequencies_hz=[100, 200], samples=1000,
    time_s=[[2.0, 1.0], [1.3, 1.1], [2.4, 1.2]], peak_power_w=[[2.0, 3.0], [2.5, 3.5], [3.0, 4.0]], max_batch_size=128,
)  # fmt: skip
PRIOR = RelationVector(batch_sizes=[8, 32, 128], ratios=[0.6, 0.8, 1.0], samples_mean=[6000.0, 8000.0, 10000.0],
                       samples_std=[300.0, 400.0, 500.0], key="proxy")  # fmt: skip
TRUTH = {8: 1.0, 32: 1 / 0.7, 128: 1.0}  # e_b on the device's data: b=32 needs 0.7 of b=8's samples
P0, TARGET = 2000.0, 0.99  # the target is reached at p = P0 ln 100
POLICY = LearningRatePolicy()
IDENTITY = RecordIdentity(record_id="job:dev", model="m", weights="init:0", data=DataIdentity(name="d", fraction=1.0),
                          target_accuracy=TARGET, lr=POLICY, eval_every_samples=256, device_type="recorded", seed=0)  # fmt: skip


def loss_at(p: float) -> float:
    return 2.0 * math.exp(-p / P0)


class WarpTrainer:
    """A trainer of the time-warp model: each step adds e_b * b to the progress."""

    def __init__(self, batch_size: int, efficiency: dict[int, float] = TRUTH):
        self.batch_size, self.efficiency = batch_size, efficiency
        self.samples = self.steps = 0
        self.progress = 0.0
        self.test_loss: float | None = None
        self.optimizer = SimpleNamespace(param_groups=[{"lr": 0.0}])

    def step(self) -> None:
        self.progress += self.efficiency[self.batch_size] * self.batch_size
        self.samples += self.batch_size
        self.steps += 1

    def evaluate(self) -> float:
        self.test_loss = loss_at(self.progress)
        return 1 - self.test_loss / 2


def solo_record(b: int, record_id: str, samples: int | None = None, efficiency: float | None = None) -> FinetuneRecord:
    """A fine-tune that ran at `b` from the start: to the target, or stopped after `samples`."""
    e = efficiency or TRUTH[b]
    n_target = P0 * math.log(100) / e
    end = samples or int(n_target) + 256
    curve = [(n, 1 - loss_at(e * n) / 2, loss_at(e * n)) for n in range(0, end + 1, 256)]
    return FinetuneRecord(
        record_id=record_id, model="m", weights="init:0", data=IDENTITY.data, target_accuracy=TARGET, lr=POLICY,
        eval_every_samples=256, device_type="recorded", power_cap_w=None, seed=0,
        segments=[Segment(batch_size=b, frequency_hz=200, start_samples=0, end_samples=end, device_time_s=1.0, curve=curve)],
        reached=samples is None, samples_to_accuracy=None if samples else round(n_target),
    )  # fmt: skip


def control(trainer: WarpTrainer, device: ReplayDevice, strategy, target: DeviceTarget, frequency_hz: int,
            table: ProfileTable = TABLE) -> AdaptiveControl:  # fmt: skip
    """The cap control of a replayed run: `target`'s cap from the start, no cap changes from outside."""
    return AdaptiveControl(device, trainer, POLICY, table, strategy, CapFollower(target, lambda: None, poll_s=0.0),  # type: ignore[arg-type]
                           target.cap_at(0), frequency_hz)  # fmt: skip


def run_loop(records: list[FinetuneRecord], target: DeviceTarget | None = None, settings: LoopSettings | None = None,
             max_samples: int = 20_000, efficiency: dict[int, float] = TRUTH, table: ProfileTable = TABLE,
             trust: float = PAPER_TRUST, prior: RelationVector = PRIOR, device_class: type = None):  # fmt: skip
    """A replayed fine-tune: it starts at equation (4)'s choice on the prior, the loop chooses its
    start on the belief (`first`: what it runs after that), then it trains to the target."""
    target = target or DeviceTarget(device_id="d")
    initial = Equation4(prior).choose(table, target.cap_at(0))
    trainer = WarpTrainer(initial.batch_size, efficiency)
    device = (device_class or ReplayDevice)(table)
    device.set_frequency(initial.frequency_hz)
    adaptive = control(trainer, device, Equation4(prior), target, initial.frequency_hz, table)
    loop = ClosedLoop(adaptive, prior, lambda: records, IDENTITY, settings, trust=trust)
    run = DeviceTotals()
    loop.start(run)
    first = (trainer.batch_size, adaptive.frequency_hz)
    outcome, totals = train_to_accuracy(trainer, TARGET, 256, max_samples, 0, device, totals=run, control=loop)  # type: ignore[arg-type]
    return loop, adaptive, outcome, totals, first


def in_run(adaptive: AdaptiveControl) -> list:
    """The switches after the start."""
    return [s for s in adaptive.switches if s.samples > 0]


def test_the_loop_switches_to_what_the_device_data_shows_is_faster_and_says_why() -> None:
    # an earlier fine-tune on this data ran b=32 to the target; the prior (proxy) says b=8 is fastest
    loop, adaptive, outcome, totals, first = run_loop([solo_record(32, "earlier")])
    assert first == (8, 200)  # one measured batch size: the prior decides the start
    [switch] = in_run(adaptive)
    assert (switch.cause, switch.old_batch_size, switch.new_batch_size, switch.new_frequency_hz) == ("evidence", 8, 32, 200)
    assert "evidence: r_b" in switch.note and "% faster than b=8" in switch.note
    gain = int(switch.note.split("b=32 predicted ")[1].split("%")[0])
    assert 20 <= gain <= 30  # the truth over the 89 % of the run left, one interval for the switch: 8.2 s / 6.6 s = 1.24
    # the first evaluation past 15 % of b=8's expected samples (9 210 here: 1 382), not the dwell's 4 evaluations: an early
    # match of a long run's solo curve ranks small batches too well and larger ones too badly
    assert switch.samples == 6 * 256
    assert loop.belief is not None and loop.belief.measured == {8, 32}
    assert loop.belief.estimates[32].samples == pytest.approx(0.7 * loop.belief.estimates[8].samples, rel=0.02)
    assert outcome.reached
    # the same run without evidence stays at the prior's choice and takes longer on the device
    _, alone, _, totals_alone, _ = run_loop([])
    assert in_run(alone) == [] and totals.elapsed_s < 0.85 * totals_alone.elapsed_s


def test_a_record_kept_while_the_run_trains_is_evidence_from_the_next_evaluation() -> None:
    # no record at set-up: the prior's b=8; another device of the job keeps its b=32 curve after
    # the run's 6th evaluation (at 0, 256, ..., 1280 samples; the loop reads the records once at
    # set-up and at each evaluation)
    reads = 0

    def records() -> list[FinetuneRecord]:
        nonlocal reads
        reads += 1
        return [solo_record(32, "other device")] if reads > 7 else []

    strategy = Equation4(PRIOR)
    first = strategy.choose(TABLE, None)
    trainer, device = WarpTrainer(first.batch_size), ReplayDevice(TABLE)
    device.set_frequency(first.frequency_hz)
    adaptive = control(trainer, device, strategy, DeviceTarget(device_id="d"), first.frequency_hz)
    loop = ClosedLoop(adaptive, PRIOR, records, IDENTITY)
    outcome, _ = train_to_accuracy(trainer, TARGET, 256, 20_000, 0, device, control=loop)  # type: ignore[arg-type]
    [switch] = adaptive.switches
    assert (first.batch_size, switch.cause, switch.new_batch_size) == (8, "evidence", 32)
    assert switch.samples == 6 * 256 and outcome.reached  # the first evaluation after the record was kept
    assert [r.record_id for r in loop.records] == ["other device"]


def test_a_resumed_run_s_curve_starts_where_it_resumed() -> None:
    # an earlier attempt trained 512 samples at b=8 and evaluated at 0, 256 and 512 (its checkpoint)
    trainer, device = WarpTrainer(8), ReplayDevice(TABLE)
    device.set_frequency(200)
    for _ in range(64):
        trainer.step()
    earlier = DeviceTotals(history=[(0, 0.0), (256, 0.06), (512, 0.12)])
    strategy = Equation4(PRIOR)
    adaptive = control(trainer, device, strategy, DeviceTarget(device_id="d"), 200)
    loop = ClosedLoop(adaptive, PRIOR, lambda: [], IDENTITY, seen=len(earlier.history))
    outcome, totals = train_to_accuracy(trainer, TARGET, 256, 20_000, 0, device, totals=earlier, control=loop)  # type: ignore[arg-type]
    [segment] = loop.finish(totals, outcome).segments
    assert segment.start_samples == 512 and segment.curve[0][0] > 512  # the earlier attempt's evaluations are not in it
    assert all(loss is not None for _, _, loss in segment.curve) and outcome.reached


def test_a_second_job_on_the_same_data_starts_at_the_measured_best_and_never_switches() -> None:
    records = [solo_record(8, "one"), solo_record(32, "two")]
    loop, adaptive, outcome, _, first = run_loop(records)
    assert first == (32, 200)
    assert in_run(adaptive) == [] and loop.decisions == [] and outcome.reached
    provenance = loop.provenance()
    assert provenance is not None and provenance.source == "learned"
    assert provenance.measured_batch_sizes == [8, 32] and provenance.records == ["one", "two"]


def test_small_predicted_gains_dwell_and_the_switch_budget_prevent_switching() -> None:
    nearly = {8: 1.0, 32: 1.1 * 1.08, 128: 1.0}  # b=32 8 % faster than b=8 (1.1 s per 1000 samples against 1.0 s)
    loop, adaptive, *_ = run_loop([solo_record(32, "earlier", efficiency=nearly[32])], efficiency=nearly)
    assert (
        in_run(adaptive) == [] and loop.belief is not None and loop.belief.measured == {8, 32}
    )  # seen; about 4 % faster over the rest of the run, under the 10 % hysteresis
    loop, adaptive, *_ = run_loop([solo_record(32, "earlier", efficiency=nearly[32])], efficiency=nearly,
                                  settings=LoopSettings(hysteresis=0.03))  # fmt: skip
    assert [s.new_batch_size for s in in_run(adaptive)] == [32]
    loop, adaptive, *_ = run_loop([solo_record(32, "earlier")], settings=LoopSettings(max_switches=0))
    assert in_run(adaptive) == [] and loop.decisions == []
    loop, adaptive, *_ = run_loop([solo_record(32, "earlier")], settings=LoopSettings(min_dwell_evaluations=12))
    assert [s.samples for s in in_run(adaptive)] == [12 * 256]


def test_evidence_is_the_first_segment_so_a_switch_is_never_undone_by_later_noise() -> None:
    # records that disagree with the running curve: it leaves b=8 once, and its evidence (the solo
    # curve up to the switch and the records) stays fixed after that, however many switches it may make
    records = [solo_record(32, "a", samples=2048, efficiency=1.6), solo_record(128, "b", efficiency=2.0)]
    loop, adaptive, outcome, *_ = run_loop(records, settings=LoopSettings(max_switches=5))
    assert [(s.cause, s.old_batch_size, s.new_batch_size) for s in in_run(adaptive)] == [("evidence", 8, 128)]
    assert loop.switches == 1 and outcome.reached


def test_a_cap_change_after_an_evidence_switch_selects_with_the_belief() -> None:
    target = DeviceTarget(device_id="d", power_cap_schedule=[[0.0, None], [2.0, 3.2]])
    loop, adaptive, outcome, _, _ = run_loop([solo_record(32, "earlier")], target=target)
    causes = [(s.cause, s.new_batch_size, s.new_frequency_hz) for s in in_run(adaptive)]
    assert causes == [("evidence", 32, 200), ("cap", 32, 100)]
    # the prior alone would have moved to b=8 at 200 Hz under 3.2 W
    assert Equation4(PRIOR).choose(TABLE, 3.2).batch_size == 8
    assert outcome.reached


class HotDevice(ReplayDevice):
    """Reads 5 % over the table from the first step: the power guard steps the frequency down."""

    def run_steps(self, step, batch_size, steps):
        m = super().run_steps(step, batch_size, steps)
        return Measurement(m.steps, m.batch_size, m.elapsed_s, m.energy_j, m.peak_power_w * 1.05, m.mean_power_w, True)


def test_the_loop_never_undoes_the_power_guard() -> None:
    # at 3.6 W b=32 runs at 200 Hz (3.5 W in the table); the device reads 3.675 W, so the guard
    # steps down to 100 Hz and stays there; the loop, which sees b=32 as best, leaves the frequency alone
    records = [solo_record(8, "one"), solo_record(32, "two")]
    target = DeviceTarget(device_id="d", power_cap_w=3.6)
    loop, adaptive, outcome, totals, first = run_loop(records, target=target, device_class=HotDevice)
    assert first == (32, 200)
    assert [(s.cause, s.new_frequency_hz) for s in in_run(adaptive)] == [("guard", 100)]
    assert loop.decisions == [] and loop.belief is not None and outcome.reached
    record = loop.finish(totals, outcome)  # one batch size throughout: a solo run, whatever the guard did
    assert [(s.batch_size, s.frequency_hz) for s in record.segments] == [(32, 200)] and record.solo_samples() == (
        32,
        outcome.samples_to_accuracy,
    )


def test_the_record_keeps_every_segment_with_its_curve() -> None:
    loop, adaptive, outcome, totals, _ = run_loop([solo_record(32, "earlier")])
    record = loop.finish(totals, outcome)
    assert [(s.batch_size, s.start_samples) for s in record.segments] == [(8, 0), (32, 1536)]
    assert record.segments[0].curve[0][0] == 0 and record.segments[1].curve[0][0] == 1536
    assert record.segments[-1].end_samples == outcome.samples_processed and record.reached
    assert record.solo_curve() is not None and record.solo_curve()[0] == 8  # type: ignore[index]
    assert record.solo_samples() is None  # it switched: its N is not a solo N_b
    assert sum(s.device_time_s for s in record.segments) == pytest.approx(totals.elapsed_s)
    assert learned_vector([solo_record(32, "earlier"), record], PRIOR) is not None


def test_reselect_switches_for_evidence_only_when_the_configuration_changes_and_waits_while_paused() -> None:
    trainer, device = WarpTrainer(8), ReplayDevice(TABLE)
    device.set_frequency(200)
    target = DeviceTarget(device_id="d", power_cap_w=1.0, power_cap_schedule=[[0.0, None]])
    assert target.cap_at(0) is None  # the schedule's, from the start
    adaptive = control(trainer, device, Equation4(PRIOR), target, 200)
    run = DeviceTotals()
    adaptive.reselect(run, Equation4(PRIOR), "same choice")  # b=8 at 200 Hz already
    assert adaptive.switches == []
    favour_32 = RelationVector(batch_sizes=[8, 32, 128], ratios=[1.0, 0.5, 1.0])
    adaptive.reselect(run, Equation4(favour_32), "the evidence")
    [switch] = adaptive.switches
    assert (switch.cause, switch.new_batch_size, switch.note) == ("evidence", 32, "the evidence") and trainer.batch_size == 32
    adaptive.cap_w, adaptive.paused = 1.0, "cap too low"
    adaptive.reselect(run, Equation4(PRIOR), "while paused")
    assert len(adaptive.switches) == 1 and adaptive.strategy == Equation4(PRIOR)  # adopted for the resume


# b=8 takes 1.8 s per 1000 samples at 200 Hz, b=32 1.4 s, b=128 1.2 s: the prior's b=8 (1.8 x 0.6 = 1.08 s)
# is faster only if it needs 0.6 of b=128's samples, and 50 % slower if it needs as many
SLOW_SMALL = TABLE.model_copy(update={"time_s": [[3.6, 1.8], [2.8, 1.4], [2.4, 1.2]]})


def test_a_first_job_follows_the_proxy_as_far_as_it_earned_on_other_data() -> None:
    # on this data every batch size needs the same samples: the proxy's r_8 = 0.6 is wrong
    flat = {8: 1.0, 32: 1.0, 128: 1.0}
    _, trusting, _, trusted_totals, first = run_loop([], efficiency=flat, table=SLOW_SMALL)
    assert first == (8, 200) and in_run(trusting) == []  # the paper's trust: at worst r_8 = 0.65, 2.5 % faster than b=128
    loop, adaptive, outcome, totals, first = run_loop([], efficiency=flat, table=SLOW_SMALL, trust=0.6)  # far off elsewhere
    assert first == (128, 200) and in_run(adaptive) == [] and outcome.reached
    assert totals.elapsed_s < trusted_totals.elapsed_s / 1.4  # the largest batch is never slower than Baseline 1


def test_a_batch_size_between_two_measured_ones_is_explored_measured_and_kept_when_faster() -> None:
    # b=8 and b=128 ran on this data; the proxy's r_32 = 0.8 makes b=32 slower than b=8, but the data allows
    # as little as b=8 needs: b=32 is explored, its own solo curve measures it, and it is kept (8.4 s against 9 s)
    truth = {8: P0 * math.log(100) / 5000, 32: P0 * math.log(100) / 6000, 128: P0 * math.log(100) / 10000}
    records = [solo_record(8, "one", efficiency=truth[8]), solo_record(128, "two", efficiency=truth[128])]
    settings = LoopSettings(policy=ExplorationPolicy(budget=0.12))  # these runs are short: 20 evaluations to the target
    loop, adaptive, outcome, totals, first = run_loop(records, efficiency=truth, table=SLOW_SMALL, settings=settings)
    assert first == (32, 200) and in_run(adaptive) == [] and outcome.reached
    report = loop.exploration
    assert report is not None and (report.batch_size, report.exploit_batch_size, report.against) == (32, 8, [8, 128])
    assert 0 < report.cost_bound <= 0.12 and report.measured_at_samples is not None and report.measured_at_samples <= 6 * 256
    assert "kept" in report.outcome and "r_b 0.60" in report.outcome, report.outcome  # 6000 / 10000
    assert report.cost is not None and report.cost < 0 and f"it gained {-report.cost:.1%}" in report.line()  # faster than b=8 throughout
    # the same with a smaller budget: b=8 runs, and the run takes longer
    _, plain, _, plain_totals, plain_first = run_loop(records, efficiency=truth, table=SLOW_SMALL)
    assert plain_first == (8, 200) and totals.elapsed_s < plain_totals.elapsed_s


def test_an_explored_batch_size_measured_slower_is_left_for_the_exploit_choice() -> None:
    truth = {8: P0 * math.log(100) / 5000, 32: P0 * math.log(100) / 8000, 128: P0 * math.log(100) / 10000}  # b=32: 11.2 s
    records = [solo_record(8, "one", efficiency=truth[8]), solo_record(128, "two", efficiency=truth[128])]
    loop, adaptive, outcome, *_ = run_loop(records, efficiency=truth, table=SLOW_SMALL,
                                           settings=LoopSettings(policy=ExplorationPolicy(budget=0.12)))  # fmt: skip
    [switch] = in_run(adaptive)
    assert (switch.old_batch_size, switch.new_batch_size) == (32, 8) and switch.samples <= 6 * 256
    report = loop.exploration
    assert report is not None and "left" in report.outcome and outcome.reached
    # what it cost: 1 536 samples at b=32 (2.15 s) against b=8's 1.73 s for the same progress (1 536 / 8 000 of 9 s)
    assert report.cost == pytest.approx((2.1504 - 1536 / 8000 * 9.0) / 9.0, rel=0.05) and f"it cost {report.cost:.1%}" in report.line()


def test_an_exploration_measured_early_runs_on_to_the_samples_planned_before_it_is_compared() -> None:
    # as above, with a window of half the exploit choice's expected samples: the curves match
    # after a few evaluations, yet the run stays at b=32 until the planned samples (an early
    # match ranks small batches too well), and only then leaves it for b=8
    truth = {8: P0 * math.log(100) / 5000, 32: P0 * math.log(100) / 8000, 128: P0 * math.log(100) / 10000}
    records = [solo_record(8, "one", efficiency=truth[8]), solo_record(128, "two", efficiency=truth[128])]
    settings = LoopSettings(policy=ExplorationPolicy(budget=0.5, measure_share=0.5))
    loop, adaptive, outcome, *_ = run_loop(records, efficiency=truth, table=SLOW_SMALL, settings=settings)
    report = loop.exploration
    assert report is not None and report.measure_by_samples is not None and report.measure_by_samples > 6 * 256
    [switch] = in_run(adaptive)
    assert (switch.old_batch_size, switch.new_batch_size) == (32, 8) and switch.samples >= report.measure_by_samples
    assert report.measured_at_samples == switch.samples and "left" in report.outcome and outcome.reached


def test_an_exploration_not_measured_in_the_samples_planned_is_given_up_there() -> None:
    # as above, but b=32 diverges on this data (its test loss grows), so its curve never matches
    # the records': its cost bound counts the 6 evaluations planned, and the loop gives it up at
    # the first evaluation at or past them, not later
    truth = {8: P0 * math.log(100) / 5000, 32: -1.0, 128: P0 * math.log(100) / 10000}
    records = [solo_record(8, "one", efficiency=truth[8]), solo_record(128, "two", efficiency=truth[128])]
    settings = LoopSettings(policy=ExplorationPolicy(budget=0.12))
    loop, adaptive, outcome, totals, first = run_loop(records, efficiency=truth, table=SLOW_SMALL, settings=settings)
    report = loop.exploration
    assert first == (32, 200) and report is not None and report.measure_by_samples == 6 * 256
    [switch] = in_run(adaptive)
    assert (switch.old_batch_size, switch.new_batch_size, switch.samples) == (32, 8, 6 * 256)
    assert report.measured_at_samples is None and report.outcome == "its N_b was not measured in the samples planned"


def test_an_exploration_the_cap_moved_the_run_off_ends_unmeasured() -> None:
    # as in the exploration kept above, but 0.5 s in the cap drops to 2.2 W, where only b=8 (at
    # 100 Hz) runs: b=32 was run for two evaluations, too few to measure it, and the run's b=8
    # (measured by the records) must not be taken for it
    truth = {8: P0 * math.log(100) / 5000, 32: P0 * math.log(100) / 6000, 128: P0 * math.log(100) / 10000}
    records = [solo_record(8, "one", efficiency=truth[8]), solo_record(128, "two", efficiency=truth[128])]
    target = DeviceTarget(device_id="d", power_cap_schedule=[[0.0, None], [0.5, 2.2]])
    settings = LoopSettings(policy=ExplorationPolicy(budget=0.12))
    loop, adaptive, outcome, *_ = run_loop(records, target=target, efficiency=truth, table=SLOW_SMALL, settings=settings)
    report = loop.exploration
    assert report is not None and report.batch_size == 32 and outcome.reached
    assert [(s.cause, s.new_batch_size) for s in in_run(adaptive)][:1] == [("cap", 8)]
    assert report.measured_at_samples is None, report.outcome
    assert report.outcome == "the cap moved the run off it"


def test_a_first_job_starts_from_records_of_similar_data_blended_with_the_prior() -> None:
    # runs on similar data (another fraction) found b=32 needing a third of b=8's samples; the
    # prior says 0.6 / 0.8: blended, b=32 is faster (1.1 s x 0.67 against 1.0 s)
    similar = [solo_record(8, "one"), solo_record(32, "two", efficiency=3.0)]
    blended = similar_vector({"other": similar}, PRIOR)
    assert blended is not None and blended.provenance is not None and blended.provenance.source == "learned"
    *_, first = run_loop([], prior=blended)
    assert first[0] == 32 and Equation4(PRIOR).choose(TABLE, None).batch_size == 8


def test_an_exploration_with_nothing_to_match_against_runs_until_its_own_run_measures_it() -> None:
    # no run on this data yet: b=32 (0.78 s per 1000 samples at 200 Hz, the prior's r_32 = 0.8) is
    # expected 4 % slower than b=8 but may be 8 % faster; its whole worst case fits a 13 % budget, so
    # it is explored with no batch size to match its curve against: it is measured only when its
    # own solo run reaches the target, and must not be ended before (at the truth's r_32 = 0.7 it
    # is 45 % faster than b=8)
    table = TABLE.model_copy(update={"time_s": [[2.0, 1.0], [1.3, 0.78], [2.4, 1.2]]})
    settings = LoopSettings(policy=ExplorationPolicy(budget=0.13))
    loop, adaptive, outcome, totals, first = run_loop([], table=table, settings=settings)
    report = loop.exploration
    assert first == (32, 200) and report is not None and report.measure_by_samples is None, report
    assert [(s.old_batch_size, s.new_batch_size) for s in adaptive.switches] == [(8, 32)]  # the start only
    assert outcome.reached and outcome.batch_size == 32
    loop.finish(totals, outcome)
    report = loop.exploration
    assert report.measured_at_samples == outcome.samples_processed and "kept" in (report.outcome or ""), report.outcome
    _, plain, _, plain_totals, plain_first = run_loop([], table=table)  # the default budget: b=8 throughout
    assert plain_first == (8, 200) and in_run(plain) == [] and totals.elapsed_s < 0.6 * plain_totals.elapsed_s


FOUR = ProfileTable(
    batch_sizes=[8, 32, 64, 128], frequencies_hz=[100, 200], samples=1000,
    time_s=[[3.6, 1.8], [2.8, 1.4], [2.6, 1.3], [2.4, 1.2]], peak_power_w=[[2.0, 3.0], [2.5, 3.5], [2.8, 3.8], [3.0, 4.0]], max_batch_size=128,
)  # fmt: skip
PRIOR4 = RelationVector(
    batch_sizes=[8, 32, 64, 128], ratios=[0.6, 0.8, 0.9, 1.0], samples_mean=[6000.0, 8000.0, 9000.0, 10000.0], key="proxy"
)


TRUTH4 = {b: P0 * math.log(100) / n for b, n in {8: 5000, 32: 6000, 64: 7000, 128: 10000}.items()}
KEPT4 = [solo_record(8, "one", efficiency=TRUTH4[8]), solo_record(128, "two", efficiency=TRUTH4[128])]


def loop_on_four(name: str, live: dict[str, FinetuneRecord], claim=None) -> ClosedLoop:
    """A run `name` (job:device) on FOUR whose data measured b=8 and b=128 (b=32 and b=64 may be faster than b=8), seeing
    the partial records `live` and showing its own there."""
    initial = Equation4(PRIOR4).choose(FOUR, None)
    adaptive = control(WarpTrainer(initial.batch_size, TRUTH4), ReplayDevice(FOUR), Equation4(PRIOR4), DeviceTarget(device_id=name.split(":")[1]),
                       initial.frequency_hz, FOUR)  # fmt: skip
    return ClosedLoop(adaptive, PRIOR4, lambda: KEPT4 + list(live.values()), IDENTITY.model_copy(update={"record_id": name}),
                      LoopSettings(policy=ExplorationPolicy(budget=0.12)), publish=lambda r: live.__setitem__(r.record_id, r),
                      claim=claim)  # fmt: skip


def test_runs_starting_on_the_same_data_at_once_explore_different_batch_sizes() -> None:
    # the first run explores one and shows its start at once (before any evaluation); the run that starts meanwhile sees
    # it and explores the other
    live: dict[str, FinetuneRecord] = {}
    starts = [loop_on_four(name, live).start(DeviceTotals()) for name in ("job-a:nano-1", "job-a:nano-2")]
    assert [c.role for c in starts] == ["explore", "explore"], [c.selection.note for c in starts]
    assert sorted(c.selection.batch_size for c in starts) == [32, 64] and {c.exploit.batch_size for c in starts} == {8}
    first = live["job-a:nano-1"]
    assert first.running and first.segments[0].batch_size == starts[0].selection.batch_size and first.segments[0].curve == []
    assert f"b={starts[0].selection.batch_size} is being measured by job-a:nano-1" in (starts[1].selection.note or "")


def test_runs_that_read_the_records_before_either_showed_its_start_still_explore_different_batch_sizes() -> None:
    # both read the records (as the devices of one job do within milliseconds), then both choose: the second's claim of
    # the batch size the first took is refused, and it chooses again on the records read anew
    live: dict[str, FinetuneRecord] = {}

    def claim(start: FinetuneRecord) -> str | None:
        held = measuring([r for r in live.values() if r.record_id != start.record_id]).get(start.segments[0].batch_size)
        if held is None:
            live[start.record_id] = start
        return held

    loops = [loop_on_four(name, live, claim) for name in ("job-a:nano-1", "job-a:nano-2")]
    starts = [loop.start(DeviceTotals()) for loop in loops]
    assert [c.role for c in starts] == ["explore", "explore"], [c.selection.note for c in starts]
    assert sorted(c.selection.batch_size for c in starts) == [32, 64]
    assert {r.segments[0].batch_size for r in live.values()} == {32, 64}
    assert f"b={starts[0].selection.batch_size} is being measured by job-a:nano-1" in (starts[1].selection.note or "")
