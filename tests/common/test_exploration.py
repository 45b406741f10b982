"""The belief about one data's N_b, the learned trust in a proxy, and the exploration policy,
as pure functions: solo curves in (a stretched test-loss curve per batch size, as solo runs on
one data give), estimates, intervals and choices out."""

import dataclasses
import math

import pytest

from edgetrain.common.finetune.belief import PAPER_TRUST, belief
from edgetrain.common.finetune.exploration import Candidate, ExplorationPolicy, baseline1_per_sample_s, candidates
from edgetrain.common.finetune.learned import DataIdentity, FinetuneRecord, Segment
from edgetrain.common.finetune.trust import PAPER_WEIGHT, ProxyCheck, proxy_check, trust_width
from edgetrain.common.schemas import LearningRatePolicy, ProfileTable, RelationVector

B = [16, 32, 64, 128]
TRUE_N = {16: 6000, 32: 7000, 64: 8000, 128: 10000}  # the target's N_b: r_64 = 0.8
PRIOR = RelationVector(batch_sizes=B, ratios=[0.4, 0.5, 0.9, 1.0], samples_mean=[800.0, 1000.0, 1800.0, 2000.0])  # r_64 0.9: wrong


def solo(b: int, n: int | None = None, seed: int = 0, reached: bool = True) -> FinetuneRecord:
    """A solo run at b on the target: test loss 2 * exp(-3 * samples / N_b), evaluated every 256 samples to N_b."""
    end = TRUE_N[b] if n is None else n
    curve = [(s, 0.0, 2 * math.exp(-3 * s / TRUE_N[b])) for s in range(0, end + 1, 256)]
    return FinetuneRecord(
        record_id=f"r{b}-{seed}", model="m", weights="init:0", data=DataIdentity(name="d", fraction=1.0), target_accuracy=0.9,
        lr=LearningRatePolicy(), eval_every_samples=256, device_type="twin", power_cap_w=None, seed=seed,
        segments=[Segment(batch_size=b, frequency_hz=1, start_samples=0, end_samples=end, device_time_s=1.0, curve=curve)],
        reached=reached and n is None, samples_to_accuracy=TRUE_N[b] if reached and n is None else None,
    )  # fmt: skip


def table(per_sample: dict[int, float]) -> ProfileTable:
    """One frequency, no power limits: T[b] for 1000 samples."""
    return ProfileTable(batch_sizes=B, frequencies_hz=[1000], samples=1000, time_s=[[per_sample[b] * 1000] for b in B],
                        peak_power_w=[[1.0] for _ in B], max_batch_size=128)  # fmt: skip


def test_without_records_the_belief_is_the_prior_within_the_trust_width() -> None:
    view = belief([], PRIOR, trust_width=0.1)
    e64 = view.estimates[64]
    assert (e64.samples, e64.source, view.measured) == (1800.0, "prior", frozenset())
    assert e64.low == pytest.approx(1800 * math.exp(-0.1)) and e64.high == pytest.approx(1800 * math.exp(0.1))
    assert belief([], PRIOR).trust_width == PAPER_TRUST


def test_measured_neighbours_bound_a_batch_size_between_them_and_scale_the_others() -> None:
    view = belief([solo(32), solo(128)], PRIOR, trust_width=0.1)
    assert view.measured == {32, 128}
    assert view.estimates[32].samples == pytest.approx(7000, rel=0.02) and view.estimates[128].samples == pytest.approx(10000, rel=0.02)
    e64 = view.estimates[64]
    assert e64.source == "bounded" and e64.optimistic == pytest.approx(view.estimates[32].low)  # as few as b=32 needs
    assert view.estimates[32].low <= e64.low <= e64.samples <= e64.high <= view.estimates[128].high
    assert view.estimates[16].source == "prior" and view.estimates[16].high <= view.estimates[32].high * 1.2


def reached(b: int, n: int, seed: int = 0) -> FinetuneRecord:
    """A solo run at b that reached the target at `n` samples (seed noise: N_b off the truth)."""
    return solo(b, seed=seed).model_copy(update={"samples_to_accuracy": n, "record_id": f"n{b}-{seed}"})


def test_measured_neighbours_that_seed_noise_put_out_of_order_still_bound_within_an_interval() -> None:
    # N_16 = 11000 and N_128 = 9000 measured: their bounds on b=32 and b=64 would cross (low 10340 over high 9540)
    view = belief([reached(16, 11000), reached(128, 9000)], PRIOR)
    for b in (32, 64):
        e = view.estimates[b]
        assert e.source == "bounded" and e.low <= e.optimistic <= e.samples <= e.high, e
        assert e.samples == pytest.approx(10000, rel=0.07)  # within the pooled neighbours' spread
    assert view.estimates[16].samples == 11000 and view.estimates[128].samples == 9000  # what runs measured stays
    for values in [(11000, 9000, 10000), (5000, 12000, 4000), (9000, 8000, 7000)]:  # (N_16, N_32, N_128), 2 and 3 runs
        records = [reached(16, values[0]), reached(32, values[1]), reached(32, values[1] + 500, seed=1), reached(128, values[2])]
        for e in belief(records, PRIOR).estimates.values():
            assert e.low <= e.optimistic <= e.samples <= e.high, (values, e)


def test_the_proxy_error_on_one_data_and_the_trust_learned_from_several() -> None:
    check = proxy_check([solo(32), solo(128)], PRIOR, "data-1")
    measured_ratio, proxy_ratio = 7000 / 10000, 1000 / 2000
    assert check.error == pytest.approx(abs(math.log(measured_ratio / proxy_ratio)), rel=0.05) and check.pairs == 1
    assert proxy_check([solo(32)], PRIOR) is None  # one batch size says nothing about r_b
    assert trust_width([]) == PAPER_TRUST  # no history: the paper's figure
    far = [ProxyCheck(data=f"d{i}", error=0.4, pairs=1) for i in range(4)]
    near = [ProxyCheck(data=f"d{i}", error=0.02, pairs=1) for i in range(4)]
    assert trust_width(far) > 0.3 and trust_width(near) <= PAPER_TRUST  # a proxy far off elsewhere is trusted less, a good one more
    assert trust_width(far[:1]) < trust_width(far)  # one far check weighs against the paper's PAPER_WEIGHT
    assert PAPER_WEIGHT >= 1


def test_a_candidate_slower_per_sample_than_baseline1_runs_only_where_the_trusted_worst_case_is_safe() -> None:
    per_sample = {16: 0.0020, 32: 0.0015, 64: 0.00115, 128: 0.0010}  # no cap: Baseline 1 runs b=128 at full speed
    tbl, policy = table(per_sample), ExplorationPolicy()
    prior = PRIOR.model_copy(update={"ratios": [0.4, 0.5, 0.6, 1.0], "samples_mean": [800.0, 1000.0, 1200.0, 2000.0]})
    trusted = belief([], prior)  # the paper's trust: r_64 at most 0.6 * e^0.08 = 0.65, so 0.75x Baseline 1 at worst
    found = candidates(tbl, None, trusted, "closed_loop")
    b1 = baseline1_per_sample_s(tbl, None, trusted, None, found)
    assert b1 == pytest.approx(0.0010)
    assert policy.exploit(found, b1).batch_size == 64
    doubted = belief([], prior, trust_width=0.6)  # a proxy far off on other data: r_64 up to 1, 15 % slower than Baseline 1
    assert policy.exploit(candidates(tbl, None, doubted, "closed_loop"), b1).batch_size == 128
    measured = belief([solo(64), solo(128)], prior, trust_width=0.6)  # measured on this data: the trust no longer matters
    assert policy.exploit(candidates(tbl, None, measured, "closed_loop"), b1).batch_size == 64  # 0.00115 * 8000 < 0.001 * 10000


def test_a_batch_size_between_two_measured_ones_is_explored_within_the_budget() -> None:
    per_sample = {16: 0.0020, 32: 0.0015, 64: 0.00110, 128: 0.0010}
    tbl, policy = table(per_sample), ExplorationPolicy(budget=0.06)
    view = belief([solo(32), solo(128)], PRIOR)  # the prior's r_64 = 0.9 says b=64 loses; the data allows as low as r_32 = 0.7
    found = candidates(tbl, None, view, "closed_loop")
    b1 = baseline1_per_sample_s(tbl, None, view, None, found)
    choice = policy.choose(found, b1, view, 256)
    assert choice.role == "explore" and choice.selection.batch_size == 64 and choice.exploit.batch_size == 128
    assert choice.measure_by_samples == 6 * 256 and 0 < choice.cost_bound <= policy.budget
    # the cost: 6 evaluations at b=64, each sample worth at least N_128 / N_64,worst of b=128's, and one interval for the switch
    worst_progress = view.estimates[128].samples / view.estimates[64].high
    expected = (1536 * (0.0011 - 0.0010 * worst_progress) + 256 * 0.0010) / (0.0010 * view.estimates[128].samples)
    assert choice.cost_bound == pytest.approx(expected)
    assert "exploring b=64" in choice.selection.note and "matched against b=[32, 128]" in choice.selection.note
    assert ExplorationPolicy(budget=0.03).choose(found, b1, view, 256).role == "exploit"  # the same cost is over a smaller budget
    assert policy.choose(found, b1, view, 256, explore=False).role == "exploit"


def test_nothing_is_explored_without_a_measured_partner_unless_its_whole_worst_case_fits_the_budget() -> None:
    per_sample = {16: 0.0020, 32: 0.0015, 64: 0.00110, 128: 0.0010}
    tbl, policy = table(per_sample), ExplorationPolicy()
    view = belief([], PRIOR.model_copy(update={"ratios": [0.9, 0.95, 0.95, 1.0], "samples_mean": [1800.0, 1900.0, 1900.0, 2000.0]}))
    found = candidates(tbl, None, view, "closed_loop")
    # b=64 may be 4 % faster at the low end of the trust; with nothing to match its curve against, running it means running it
    # to the end, up to 13 % slower at the high end: over the budget
    choice = policy.choose(found, 0.0010, view, 256)
    assert choice.role == "exploit" and choice.selection.batch_size == 128
    generous = ExplorationPolicy(budget=0.2).choose(found, 0.0010, view, 256)
    assert (
        generous.role == "explore"
        and generous.measure_by_samples is None
        and "no run measured another batch size" in generous.selection.note
    )


def test_an_exploration_is_measured_over_a_share_of_a_long_run_and_over_six_evaluations_of_a_short_one() -> None:
    tbl = table({16: 0.0020, 32: 0.0015, 64: 0.00110, 128: 0.0010})
    x = next(c for c in candidates(tbl, None, belief([solo(32), solo(128)], PRIOR), "closed_loop") if c.batch_size == 128)
    policy = ExplorationPolicy()
    long = Candidate(x.selection, x.per_sample_s, dataclasses.replace(x.estimate, samples=20_000.0))
    assert policy.measure_by(long, 256) == 12 * 256  # 15 % of 20 000 samples, in whole intervals
    short = Candidate(x.selection, x.per_sample_s, dataclasses.replace(x.estimate, samples=2_000.0))
    assert policy.measure_by(short, 256) == 6 * 256
    assert ExplorationPolicy(measure_share=0.0).measure_by(long, 256) == 6 * 256


def test_a_batch_size_another_run_measures_now_is_left_for_the_next_candidate() -> None:
    # b=16 and b=128 measured; b=64 and b=32 may both beat b=128: the first run explores b=64, a run starting meanwhile b=32
    per_sample = {16: 0.0020, 32: 0.00125, 64: 0.0011, 128: 0.0010}
    prior = PRIOR.model_copy(update={"ratios": [0.6, 0.8, 0.9, 1.0], "samples_mean": [1200.0, 1600.0, 1800.0, 2000.0]})
    tbl, policy = table(per_sample), ExplorationPolicy(budget=0.06)

    def choose(*running: tuple[int, str]):
        starts = [solo(b, 0).model_copy(update={"record_id": r, "running": True}) for b, r in running]
        view = belief([solo(16), solo(128), *starts], prior)
        found = candidates(tbl, None, view, "closed_loop")
        return view, policy.choose(found, baseline1_per_sample_s(tbl, None, view, None, found), view, 256)

    view, first = choose()
    assert first.role == "explore" and first.selection.batch_size == 64 and "being measured" not in first.selection.note
    view, second = choose((64, "job-a:nano-1"))
    assert view.measuring == {64: "job-a:nano-1"} and view.estimates[64].source == "bounded"  # a start measures nothing yet
    assert second.role == "explore" and second.selection.batch_size == 32 and second.exploit.batch_size == 128
    assert 0 < second.cost_bound <= policy.budget and "b=64 is being measured by job-a:nano-1" in second.selection.note
    assert "b=64 being measured by job-a:nano-1" in view.line()
    # with both in measurement elsewhere the run exploits; a measured batch size another run trains is no reason to skip anything
    assert choose((64, "a"), (32, "b"))[1].role == "exploit"
    view, third = choose((16, "a"))
    assert view.measuring == {} and third.selection.batch_size == 64
    # a run that ended (its record kept, not running) measures nothing now
    assert choose((64, "a"))[0].measuring and not belief([solo(16), solo(128), solo(64, 0)], prior).measuring
