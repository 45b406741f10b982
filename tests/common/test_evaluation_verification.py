"""`--verify`, pure: which configurations are fine-tuned, and the figures next to equation (2)."""

import pytest

from edgetrain.common.evaluation import EvaluationRow, MeanStd, MethodResult
from edgetrain.common.evaluation.verification import checks, verification
from edgetrain.common.schemas import ProfileTable, RunReport

MHZ = 1_000_000
TABLE = ProfileTable(
    batch_sizes=[16, 64], frequencies_hz=[100 * MHZ, 200 * MHZ], samples=1000,
    time_s=[[20.0, 10.0], [12.0, 8.0]], peak_power_w=[[2.0, 3.0], [3.0, 4.0]], energy_j=[[50.0, 40.0], [45.0, 36.0]],
    max_batch_size=64, device_type="board", simulated=True,
)  # fmt: skip


def method(b: int | None, f_mhz: int | None, time_s: float | None = None, reached: bool = True) -> MethodResult:
    return MethodResult(
        batch_size=b, frequency_hz=f_mhz and f_mhz * MHZ, reached=reached,
        time_to_accuracy_s=None if time_s is None else MeanStd(mean=time_s, std=0.1), energy_j=None,
    )  # fmt: skip


def row(**methods: MethodResult) -> EvaluationRow:
    """A row where plain equation (4) and the energy objective chose as edgetrain did."""
    methods.setdefault("equation4", methods["edgetrain"])
    methods.setdefault("energy", methods["edgetrain"])
    return EvaluationRow(device_type="board", power_cap_w=3.5, target="t", proxy="p", simulated=True, **methods,
                         speedup_vs_baseline1=None, speedup_vs_baseline2=None, gap_to_oracle_pct=None)  # fmt: skip


def test_each_distinct_reached_configuration_of_a_row_is_checked_once() -> None:
    r = row(baseline1=method(64, 100, 30.0), baseline2=method(64, 100, 30.0), edgetrain=method(16, 200, 20.0, reached=False),
            oracle=method(64, 200, 16.0))  # fmt: skip
    none = row(baseline1=method(None, None, reached=False), baseline2=method(None, None, reached=False),
               edgetrain=method(64, 200, 16.0), oracle=method(64, 200, 16.0))  # fmt: skip
    found = [(c.row.power_cap_w, c.batch_size, c.frequency_hz // MHZ, c.methods) for c in checks([r, none])]
    # edgetrain's b=16 never reaches the target on the target data (censored): not fine-tuned
    assert found == [
        (3.5, 64, 100, ("baseline1", "baseline2")),
        (3.5, 64, 200, ("oracle",)),
        (3.5, 64, 200, ("equation4", "edgetrain", "energy", "oracle")),
    ]


def run(**changes) -> RunReport:
    base = dict(device_id="b-1", device_type="board", simulated=True, batch_size=64, frequency_hz=200 * MHZ, reached=True,
                final_accuracy=0.91, samples_to_accuracy=1900, samples_processed=2048, steps=32, device_time_s=17.0,
                energy_j=75.0, peak_power_w=3.9, wall_s=4.0)  # fmt: skip
    return RunReport(**(base | changes))


def test_the_measured_time_is_the_runs_time_per_sample_at_its_own_n_b_against_equation_2_with_the_same_n_b() -> None:
    [check] = checks([row(baseline1=method(64, 200, 16.0), baseline2=method(64, 200, 16.0), edgetrain=method(64, 200, 16.0),
                          oracle=method(64, 200, 16.0))])  # fmt: skip
    v = verification(check, "b-1", 0, TABLE, run(), server_samples=1900, job_id="j1")
    assert (v.batch_size, v.frequency_hz, v.methods, v.job_id, v.seed) == (
        64,
        200 * MHZ,
        ["baseline1", "baseline2", "equation4", "edgetrain", "energy", "oracle"],
        "j1",
        0,
    )
    assert v.computed_time_s == MeanStd(mean=16.0, std=0.1)  # the row's figure, N_b over seeds
    # eq. (2) with the run's own N_b: 8 s / 1000 samples * 1900; energy 36 J / 1000 * 1900
    assert v.computed_time_for_run_s == pytest.approx(15.2) and v.computed_energy_for_run_j == pytest.approx(68.4)
    # the run: 17 s for 2048 samples (to the evaluation that stopped it), at its N_b of 1900
    assert v.measured_time_s == pytest.approx(17.0 / 2048 * 1900) and v.measured_energy_j == pytest.approx(75.0 / 2048 * 1900)
    assert v.time_error_pct == pytest.approx((17.0 / 2048 / 0.008 - 1) * 100)
    assert v.energy_error_pct == pytest.approx((75.0 / 2048 / 0.036 - 1) * 100)
    assert (v.samples_to_accuracy, v.server_samples_to_accuracy, v.device_time_s, v.reached, v.reason) == (1900, 1900, 17.0, True, None)


def test_a_run_that_misses_the_target_or_never_ran_says_why() -> None:
    [check] = checks([row(baseline1=method(16, 100, 40.0), baseline2=method(16, 100, 40.0), edgetrain=method(16, 100, 40.0),
                          oracle=method(16, 100, 40.0))])  # fmt: skip
    missed = verification(check, "b-1", 0, TABLE, run(reached=False, samples_to_accuracy=None, final_accuracy=0.7), 2000)
    assert not missed.reached and missed.measured_time_s is None and missed.time_error_pct is None
    assert missed.reason == "the fine-tune did not reach the target (accuracy 0.700)" and missed.device_time_s == 17.0
    refused = verification(check, "b-1", 0, TABLE, None, 2000, "j2", "configuration b=16 at 100 MHz: over the power cap")
    assert not refused.reached and refused.device_time_s is None and refused.reason.endswith("over the power cap")
    assert refused.computed_time_s == MeanStd(mean=40.0, std=0.1)


def test_edgetrains_own_run_is_scored_against_the_rows_oracle_and_baseline_1_with_what_it_switched() -> None:
    from edgetrain.common.evaluation.verification import achieved
    from edgetrain.common.schemas import ConfigSwitch, ConfigurationRun

    r = row(baseline1=method(64, 100, 30.0), baseline2=method(64, 100, 30.0), edgetrain=method(64, 200, 16.0), oracle=method(16, 200, 12.0))
    switch = ConfigSwitch(device_time_s=5.0, samples=512, cause="evidence", power_cap_w=3.5, old_batch_size=64,
                          old_frequency_hz=200 * MHZ, new_batch_size=16, new_frequency_hz=200 * MHZ, note="curve below b=16's")  # fmt: skip
    ran = run(configurations=[ConfigurationRun(batch_size=64, frequency_hz=200 * MHZ, samples=512),
                              ConfigurationRun(batch_size=16, frequency_hz=200 * MHZ, samples=1536)], switches=[switch])  # fmt: skip
    a = achieved(r, "b-1", ran, "j2")
    assert a.time_to_accuracy_s == pytest.approx(17.0 / 2048 * 1900)
    assert a.over_oracle_pct == pytest.approx((17.0 / 2048 * 1900 / 12.0 - 1) * 100)
    assert a.speedup_vs_baseline1 == pytest.approx(30.0 / (17.0 / 2048 * 1900))
    assert a.configurations == ["64 @ 200 MHz", "16 @ 200 MHz"] and len(a.switches) == 1 and "evidence" in a.switches[0]
    assert a.evidence == "proxy" and a.reason is None
    missed = achieved(r, "b-1", run(reached=False, samples_to_accuracy=None, final_accuracy=0.7), "j3")
    assert missed.time_to_accuracy_s is None and "did not reach the target (accuracy 0.700)" in missed.reason
    assert achieved(r, "b-1", None, None, "failed: no device").reason == "failed: no device"
