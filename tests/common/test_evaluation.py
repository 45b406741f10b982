import json
import random

import pytest

from edgetrain.common.evaluation import (
    METHODS,
    DeviceProfile,
    EvaluationReport,
    SensitivityMatrix,
    evaluate,
    evaluation_row,
    robustness,
    sensitivity_matrix,
)
from edgetrain.common.schemas import ProfileTable, RelationVector
from edgetrain.common.selection import Robust
from edgetrain.common.testing.tables import B, F, random_monotone_table

MHZ = 1_000_000
# A hand-made lookup table for N_s = 1000 samples: T (s), peak P (W), E (J).
TABLE = ProfileTable(
    batch_sizes=[16, 32, 64],
    frequencies_hz=[100 * MHZ, 200 * MHZ, 300 * MHZ],
    samples=1000,
    time_s=[[30.0, 20.0, 15.0], [24.0, 16.0, 12.0], [20.0, 13.0, 10.0]],
    peak_power_w=[[2.0, 3.0, 4.0], [2.5, 3.5, 4.5], [3.0, 4.0, 5.0]],
    energy_j=[[60.0, 50.0, 45.0], [55.0, 45.0, 40.0], [50.0, 42.0, 38.0]],
    max_batch_size=64,
    device_type="board",
    simulated=True,
)
ENVELOPE_W = [3.2, 4.2, 5.2]  # model-agnostic full-load power: above every row of the table


def vector(means: list[float | None], stds: list[float | None] | None = None) -> RelationVector:
    """A relation vector with N_b (mean, std over seeds) per batch size of TABLE."""
    reference = [m for m in means if m is not None][-1]
    return RelationVector(
        batch_sizes=TABLE.batch_sizes,
        ratios=[None if m is None else m / reference for m in means],
        samples_mean=means,
        samples_std=stds or [None if m is None else 0.0 for m in means],
        censored=[m is None for m in means],
    )


PROXY = vector([400.0, 600.0, 1000.0], [20.0, 30.0, 50.0])  # r = 0.4, 0.6, 1
TARGET = vector([2000.0, 1000.0, 1300.0], [100.0, 50.0, 130.0])
DEVICE = DeviceProfile(device_type="board", table=TABLE, power_envelope_w=ENVELOPE_W, power_caps_w=[4.0, None, 3.1])


def times(row) -> dict[str, tuple]:
    """Per method: (b, f in MHz, time mean, time std, energy mean, energy std, reached)."""
    out = {}
    for name in METHODS:
        m = getattr(row, name)
        t, e = m.time_to_accuracy_s, m.energy_j
        out[name] = (m.batch_size, m.frequency_hz and m.frequency_hz // MHZ, t and round(t.mean, 9), t and round(t.std, 9),
                     e and round(e.mean, 9), e and round(e.std, 9), m.reached)  # fmt: skip
    return out


def test_every_column_on_a_hand_made_table_under_a_cap() -> None:
    row, notes = evaluation_row(DEVICE, 4.0, ("proxy", PROXY), ("target", TARGET))
    # Baselines run at 100 MHz (envelope 3.2 W <= 4 W < 4.2 W). f*_b under 4 W: b=16 300 MHz,
    # b=32 200 MHz, b=64 200 MHz. Time = T / 1000 * N_b(target), energy = E / 1000 * N_b.
    assert times(row) == {
        # the largest batch, 64, at 100 MHz: 20 s * 1.3, 50 J * 1.3
        "baseline1": (64, 100, 26.0, 2.6, 65.0, 6.5, True),
        # at 100 MHz, T * r: 30 * 0.4 = 12 < 24 * 0.6 = 14.4 < 20 * 1: b=16; 30 s * 2.0
        "baseline2": (16, 100, 60.0, 3.0, 120.0, 6.0, True),
        # T[b][f*_b] * r: 15 * 0.4 = 6 < 16 * 0.6 = 9.6 < 13 * 1: b=16 at 300 MHz; 15 s * 2.0
        "equation4": (16, 300, 30.0, 1.5, 90.0, 4.5, True),
        "edgetrain": (16, 300, 30.0, 1.5, 90.0, 4.5, True),
        "energy": (16, 300, 30.0, 1.5, 90.0, 4.5, True),  # E[b][f] * r_b is least there too
        # T[b][f*_b] * N_b(target): 15 * 2000 = 30000, 16 * 1000 = 16000, 13 * 1300 = 16900: b=32
        "oracle": (32, 200, 16.0, 0.8, 45.0, 2.25, True),
    }
    assert (row.device_type, row.power_cap_w, row.target, row.proxy, row.simulated) == ("board", 4.0, "target", "proxy", True)
    assert row.speedup_vs_baseline1 == pytest.approx(26.0 / 30.0)
    assert row.speedup_vs_baseline2 == pytest.approx(2.0)
    assert row.gap_to_oracle_pct == pytest.approx(87.5)
    assert notes == []


def test_every_column_without_a_cap() -> None:
    row, _ = evaluation_row(DEVICE, None, ("proxy", PROXY), ("target", TARGET))
    assert times(row) == {
        "baseline1": (64, 300, 13.0, 1.3, 49.4, 4.94, True),
        "baseline2": (16, 300, 30.0, 1.5, 90.0, 4.5, True),  # 15 * 0.4 = 6 < 12 * 0.6 = 7.2 < 10
        "equation4": (16, 300, 30.0, 1.5, 90.0, 4.5, True),
        "edgetrain": (16, 300, 30.0, 1.5, 90.0, 4.5, True),
        "energy": (16, 300, 30.0, 1.5, 90.0, 4.5, True),  # E[b][f] * r_b is least there too
        "oracle": (32, 300, 12.0, 0.6, 40.0, 2.0, True),  # 15 * 2000, 12 * 1000, 10 * 1300
    }
    assert row.speedup_vs_baseline1 == pytest.approx(13.0 / 30.0)
    assert row.speedup_vs_baseline2 == 1.0 and row.gap_to_oracle_pct == pytest.approx(150.0)


def test_cap_below_baseline_envelope_leaves_baselines_without_configuration() -> None:
    row, notes = evaluation_row(DEVICE, 3.1, ("proxy", PROXY), ("target", TARGET))
    t = times(row)
    assert t["baseline1"] == t["baseline2"] == (None, None, None, None, None, None, False)
    # f*_b under 3.1 W: 200, 100, 100 MHz; eq. 4: 20 * 0.4 = 8 < 24 * 0.6 < 20 * 1
    assert t["edgetrain"] == (16, 200, 40.0, 2.0, 100.0, 5.0, True)
    assert t["oracle"] == (32, 100, 24.0, 1.2, 55.0, 2.75, True)  # 20 * 2000, 24 * 1000, 20 * 1300
    assert row.speedup_vs_baseline1 is None and row.speedup_vs_baseline2 is None
    assert row.gap_to_oracle_pct == pytest.approx(40.0 / 24.0 * 100 - 100)
    assert len(notes) == 2 and all("power cap 3.10 W is below" in n for n in notes)
    assert notes[0].startswith("board, cap 3.1 W, target: baseline1 has no configuration")


def test_a_batch_size_censored_on_the_target_is_not_reached() -> None:
    censored_16 = vector([None, 1000.0, 1300.0], [None, 50.0, 130.0])
    row, notes = evaluation_row(DEVICE, 4.0, ("proxy", PROXY), ("target", censored_16))
    assert times(row)["edgetrain"] == (16, 300, None, None, None, None, False)
    assert times(row)["oracle"] == (32, 200, 16.0, 0.8, 45.0, 2.25, True)  # never a censored size
    assert row.gap_to_oracle_pct is None and row.speedup_vs_baseline1 is None
    assert any("edgetrain chose b=16, which never reaches target's target (censored)" in n for n in notes)


def test_a_baseline_over_the_cap_in_the_table_is_noted() -> None:
    low_envelope = DEVICE.model_copy(update={"power_envelope_w": [2.5, 3.5, 4.5]})
    row, notes = evaluation_row(low_envelope, 3.6, ("proxy", PROXY), ("target", TARGET))
    assert (row.baseline1.batch_size, row.baseline1.frequency_hz) == (64, 200 * MHZ)  # 3.5 W <= 3.6 W in the envelope
    assert any("baseline1 runs b=64 at 200 MHz, which peaks at 4.00 W in the table, over the cap" in n for n in notes)


def test_no_energy_in_the_table_gives_times_only() -> None:
    device = DEVICE.model_copy(update={"table": TABLE.model_copy(update={"energy_j": None})})
    row, _ = evaluation_row(device, 4.0, ("proxy", PROXY), ("target", TARGET))
    assert row.edgetrain.reached and row.edgetrain.energy_j is None and row.edgetrain.time_to_accuracy_s.mean == 30.0


def test_sensitivity_matrix_on_hand_made_vectors() -> None:
    matrix = sensitivity_matrix(DEVICE, 4.0, {"P": PROXY, "T": TARGET})
    assert matrix.datasets == ["P", "T"]
    # target P: the oracle is b=16 at 300 MHz (15 * 400 = 6000 < 16 * 600 < 13 * 1000): 6 s.
    #   T's vector chooses b=32 at 200 MHz: 16 / 1000 * 600 = 9.6 s, 60 % over. Baseline 1: 20 s.
    # target T: the oracle takes 16 s; P's vector chooses b=16 at 300 MHz: 30 s, 87.5 % over.
    #   Baseline 1: 26 s, 62.5 % over.
    assert matrix.equation4_over_oracle_pct == [[0.0, pytest.approx(87.5)], [pytest.approx(60.0), 0.0]]
    # edgetrain with T's vector keeps b=64 at 200 MHz: b=32's estimated gain, 1 - 16 * 1000 / 1300 / 13
    # = 5.3 %, is within T's uncertainty, hypot(50 / 1000, 130 / 1300) = 11 %. On P that takes
    # 13 s, 117 % over; on T 16.9 s, 5.6 % over. P's gains (b=16: 54 %) are beyond its 7 %.
    assert matrix.edgetrain_over_oracle_pct == [[0.0, pytest.approx(87.5)], [pytest.approx(13 / 6 * 100 - 100), pytest.approx(5.625)]]
    assert matrix.baseline1_over_oracle_pct == [pytest.approx(20 / 6 * 100 - 100), pytest.approx(62.5)]
    assert (matrix.device_type, matrix.power_cap_w, matrix.simulated) == ("board", 4.0, True)


def test_sensitivity_is_none_where_nothing_is_reached() -> None:
    all_censored_but_64 = vector([None, None, 1300.0])
    matrix = sensitivity_matrix(DEVICE, 4.0, {"P": PROXY, "X": all_censored_but_64})
    # on X only b=64 reaches the target: P's choice (b=16) does not, X's own choice does
    assert matrix.edgetrain_over_oracle_pct[0] == matrix.equation4_over_oracle_pct[0] == [0.0, None]
    assert matrix.edgetrain_over_oracle_pct[1][1] == matrix.equation4_over_oracle_pct[1][1] == 0.0


def test_report_has_a_row_per_device_cap_and_target_and_a_matrix_per_device_and_cap() -> None:
    report = evaluate([DEVICE], {"proxy": PROXY, "target": TARGET}, "proxy", ["target", "proxy"])
    assert [(r.power_cap_w, r.target) for r in report.rows] == [
        (4.0, "target"), (4.0, "proxy"), (None, "target"), (None, "proxy"), (3.1, "target"), (3.1, "proxy")
    ]  # fmt: skip
    assert [(m.power_cap_w, m.datasets) for m in report.sensitivity] == [(c, ["proxy", "target"]) for c in (4.0, None, 3.1)]
    proxy_on_itself = report.rows[1]
    assert proxy_on_itself.edgetrain == proxy_on_itself.oracle and proxy_on_itself.gap_to_oracle_pct == 0.0
    assert len(report.notes) == 4 and all("cap 3.1 W" in n for n in report.notes)  # both baselines, both targets
    with pytest.raises(ValueError, match="no relation vector for 'other'"):
        evaluate([DEVICE], {"proxy": PROXY}, "proxy", ["other"])
    with pytest.raises(ValueError, match="records no N_b"):
        evaluate([DEVICE], {"proxy": PROXY, "t": RelationVector(batch_sizes=[16, 32, 64], ratios=[1.0, 1.0, 1.0])}, "proxy", ["t"])


def test_json_document_has_exactly_the_documented_keys() -> None:
    report = evaluate([DEVICE], {"proxy": PROXY, "target": TARGET}, "proxy", ["target"])
    document = json.loads(report.model_dump_json())
    row = document["rows"][0]
    assert set(row) == {"device_type", "power_cap_w", "target", "proxy", "simulated", "speedup_vs_baseline1",
                        "speedup_vs_baseline2", "gap_to_oracle_pct", *METHODS}  # fmt: skip
    for name in METHODS:
        assert set(row[name]) == {"batch_size", "frequency_hz", "time_to_accuracy_s", "energy_j", "reached"}
        assert set(row[name]["time_to_accuracy_s"]) == set(row[name]["energy_j"]) == {"mean", "std"}
    assert EvaluationReport.model_validate(document) == report


def random_vector(rng: random.Random, censor: bool) -> RelationVector:
    means = [rng.uniform(500, 5000) for _ in B]
    if censor:
        means[rng.randrange(len(B) - 1)] = None
    reference = means[-1]
    return RelationVector(batch_sizes=B, ratios=[None if m is None else m / reference for m in means], samples_mean=means,
                          samples_std=[None if m is None else rng.uniform(0, 200) for m in means])  # fmt: skip


@pytest.mark.parametrize("seed", range(30))
def test_oracle_is_never_slower_than_any_method_on_computed_times(seed: int) -> None:
    rng = random.Random(seed)
    table = random_monotone_table(rng, time_noise=False)  # time falls with frequency
    table = table.model_copy(update={"max_batch_size": rng.choice([None, 32, 64])})
    envelope = [max(row[j] for row in table.peak_power_w) for j in range(len(F))]  # bounds every row
    device = DeviceProfile(device_type="d", table=table, power_envelope_w=envelope, power_caps_w=[None, 3.0, 4.0, 6.0, 10.0])
    report = evaluate([device], {"p": random_vector(rng, seed % 2 == 0), "t": random_vector(rng, seed % 3 == 0)}, "p", ["t"])
    reached = 0
    for row in report.rows:
        if not row.oracle.reached:
            assert not any(getattr(row, m).reached for m in METHODS)
            continue
        for name in METHODS:
            method = getattr(row, name)
            if method.reached:
                reached += 1
                assert row.oracle.time_to_accuracy_s.mean <= method.time_to_accuracy_s.mean * (1 + 1e-12)
        assert row.gap_to_oracle_pct is None or row.gap_to_oracle_pct >= -1e-9
    assert reached > 0
    for matrix in report.sensitivity:
        assert all(v is None or v >= -1e-9 for line in matrix.edgetrain_over_oracle_pct for v in line)
        assert all(v is None or v >= -1e-9 for v in matrix.baseline1_over_oracle_pct)


@pytest.mark.parametrize("seed", range(10))
def test_equation4_equals_the_oracle_and_edgetrain_is_within_the_uncertainty_when_proxy_and_target_are_the_same(seed: int) -> None:
    rng = random.Random(100 + seed)
    table = random_monotone_table(rng, holes=0.1 if seed % 2 else 0.0)
    same = random_vector(rng, seed % 3 == 0)
    device = DeviceProfile(device_type="d", table=table, power_envelope_w=None, power_caps_w=[None, 3.0, 5.0, 8.0])
    report = evaluate([device], {"data": same}, "data", ["data"])
    for row in report.rows:
        assert row.equation4 == row.oracle
        if row.edgetrain != row.oracle:  # kept the largest batch: the oracle's gain is within the uncertainty
            assert row.edgetrain.batch_size > row.oracle.batch_size
            noise = Robust(same).uncertainty(row.oracle.batch_size, row.edgetrain.batch_size)
            assert 0 < row.gap_to_oracle_pct <= noise * 100 + 1e-9
        assert (row.gap_to_oracle_pct is None) == (not row.oracle.reached)
    assert all(m.equation4_over_oracle_pct in ([[0.0]], [[None]]) for m in report.sensitivity)


def test_robust_edgetrain_keeps_the_largest_batch_where_the_proxy_gain_is_within_noise() -> None:
    # without a cap T[b][f*_b] * r_b is 15 * 0.647 = 9.7 for b=16 against 10 for b=64: a 3 % gain,
    # within the 5 % margin (the spread over seeds is 1 %)
    close = vector([647.0, 900.0, 1000.0], [6.0, 9.0, 10.0])
    row, _ = evaluation_row(DEVICE, None, ("close", close), ("target", TARGET))
    assert (row.equation4.batch_size, row.edgetrain.batch_size) == (16, 64)
    assert row.edgetrain == row.baseline1  # b=64 at 300 MHz, as Baseline 1 without a cap
    assert row.speedup_vs_baseline1 == pytest.approx(1.0)


def test_robustness_summary_against_baseline1() -> None:
    matrix = SensitivityMatrix(
        device_type="board", power_cap_w=None, simulated=True, datasets=["a", "b"],
        # % over the oracle; Baseline 1 is 20 % over on a and 10 % over on b
        edgetrain_over_oracle_pct=[[0.0, 10.0], [20.0, 0.0]],
        equation4_over_oracle_pct=[[0.0, 21.0], [14.0, 0.0]],
        baseline1_over_oracle_pct=[20.0, 10.0],
    )  # fmt: skip
    r = robustness([matrix])
    assert r.cells == 4
    assert r.edgetrain_worst == pytest.approx(1.0)  # proxy b on target a and proxy a on target b: as Baseline 1
    assert r.equation4_worst == pytest.approx(1.1)  # proxy a on target b: 121 / 110
    assert r.edgetrain_over == [] and r.equation4_over == ["board, no cap, proxy a -> b: 1.10x Baseline 1's time"]
    # equation (4) is faster than Baseline 1 in three cells; on a->a and b->b edgetrain keeps it all,
    # on b->a it keeps 1.2/1.2 over 1.2/1.14: 95 %
    assert r.speedup_cells == 3 and r.kept_least == pytest.approx(114 / 120)
    assert r.kept_below_90pct == []
    worse = robustness([matrix.model_copy(update={"edgetrain_over_oracle_pct": [[15.0, 10.0], [20.0, 0.0]]})])
    assert worse.kept_below_90pct == ["board, no cap, proxy a -> a: keeps 87% (1.04x vs 1.20x)"]
