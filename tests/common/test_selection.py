import json
import random
import subprocess
import sys

import pytest

from edgetrain.common.schemas import ProfileTable, RelationVector
from edgetrain.common.selection import (
    Baseline1,
    Baseline2,
    Energy,
    Equation4,
    InfeasibleCapError,
    Oracle,
    Robust,
    SelectionError,
    TimeWithinEnergyBudget,
    ZeusCost,
    highest_feasible_index,
    lowest_feasible_cap_w,
)
from edgetrain.common.testing.tables import B, F, brute_force, random_monotone_table


@pytest.mark.parametrize("seed", range(40))
def test_binary_search_selection_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    table = random_monotone_table(rng, holes=0.15 if seed % 2 else 0.0)
    ratios = [rng.uniform(0.3, 2.0) for _ in B[:-1]] + [1.0]
    if seed % 3 == 0:
        ratios[1] = None  # censored
    vector = RelationVector(batch_sizes=B, ratios=ratios)
    if seed % 4 == 0:
        table.max_batch_size = 32
    for cap in [None, 2.1, 2.5, 3.0, 4.0, 6.0, 10.0, 50.0]:
        expected = brute_force(table, vector, cap)
        if expected is None:
            with pytest.raises(InfeasibleCapError):
                Equation4(vector).choose(table, cap)
            continue
        got = Equation4(vector).choose(table, cap)
        assert (got.batch_size, got.frequency_hz) == expected[1:]
        assert got.estimated_time_s == pytest.approx(expected[0])


def test_highest_feasible_index_skips_unmeasured_points() -> None:
    row = [None, 2.0, None, 3.0, 4.0, None]
    assert highest_feasible_index(row, 3.5) == 3
    assert highest_feasible_index(row, 1.0) is None
    assert highest_feasible_index(row, None) == 4
    assert highest_feasible_index([None, None], 5.0) is None


def test_infeasible_cap_names_the_lowest_cap_that_works() -> None:
    table = random_monotone_table(random.Random(1))
    vector = RelationVector(batch_sizes=B, ratios=[1.0] * len(B))
    lowest = lowest_feasible_cap_w(table)
    with pytest.raises(InfeasibleCapError) as err:
        Equation4(vector).choose(table, lowest - 0.01)
    assert err.value.lowest_cap_w == pytest.approx(lowest)
    assert f"{lowest:.2f} W" in str(err.value)
    assert Equation4(vector).choose(table, lowest).peak_power_w == pytest.approx(lowest)


def test_memory_limit_and_censored_sizes_are_never_selected() -> None:
    table = random_monotone_table(random.Random(2))
    table.max_batch_size = 16
    vector = RelationVector(batch_sizes=B, ratios=[None, 5.0, 5.0, 0.01, 0.01, 0.01])
    assert Equation4(vector).choose(table, None).batch_size in (8, 16)
    vector_all_censored = RelationVector(batch_sizes=B, ratios=[None, None, None, 1.0, 1.0, 1.0])
    with pytest.raises(SelectionError, match="memory limit"):
        Equation4(vector_all_censored).choose(table, None)


def test_a_proxy_that_never_reached_the_target_is_named_as_the_reason() -> None:
    table = random_monotone_table(random.Random(2))
    never = RelationVector(batch_sizes=B, ratios=[None] * len(B))
    for strategy in (Equation4(never), Robust(never)):
        with pytest.raises(SelectionError, match="the proxy never reached the target accuracy at any batch size"):
            strategy.choose(table, 5.0)


def test_baseline1_takes_largest_fitting_batch_at_envelope_frequency() -> None:
    table = random_monotone_table(random.Random(3))
    table.max_batch_size = 64
    vector = RelationVector(batch_sizes=B, ratios=[1.0] * len(B))
    envelope = [2.0 + 0.5 * j for j in range(len(F))]
    choice = Baseline1(vector, envelope).choose(table, 3.6)
    assert choice.batch_size == 64
    assert choice.frequency_hz == F[3]  # 2.0 + 1.5 = 3.5 <= 3.6 < 4.0
    with pytest.raises(InfeasibleCapError):
        Baseline1(vector, envelope).choose(table, 1.0)


def test_profile_table_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError, match="time_s must have 2 rows"):
        ProfileTable(batch_sizes=[4, 8], frequencies_hz=[1, 2], samples=10, time_s=[[1, 2]], peak_power_w=[[1, 2], [1, 2]])


def _write(tmp, name, data) -> str:
    path = tmp / name
    path.write_text(json.dumps(data))
    return str(path)


def test_select_cli_interchange_format_and_infeasible_exit(tmp) -> None:
    profile = {
        "batch_sizes": [4, 8, 16],
        "frequencies_hz": [100000000, 200000000, 300000000],
        "samples": 1000,
        "time_s": [[9.0, 6.0, 4.0], [6.0, 4.0, 3.0], [5.0, 3.5, None]],
        "peak_power_w": [[2.0, 2.5, 3.0], [2.4, 3.0, 3.6], [2.8, 3.5, None]],
    }
    vector = {"batch_sizes": [4, 8, 16], "ratios": [0.5, 0.8, 1.0]}
    args = [sys.executable, "-m", "edgetrain.workers.cli", "select", "--profile", _write(tmp, "p.json", profile),
            "--vector", _write(tmp, "v.json", vector)]  # fmt: skip
    out = subprocess.run(args + ["--power-cap-w", "3.0", "--json"], capture_output=True, text=True, check=True)
    choice = json.loads(out.stdout)
    # b=4: f=300 (3.0 W) -> 4.0*0.5 = 2.0; b=8: f=200 -> 4*0.8 = 3.2; b=16: f=100 -> 5.0
    assert (choice["batch_size"], choice["frequency_hz"], choice["estimated_time_s"]) == (4, 300000000, 2.0)
    bad = subprocess.run(args + ["--power-cap-w", "1.5"], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "lowest cap that would work is 2.00 W" in bad.stderr


def test_baseline2_tunes_the_batch_size_at_baseline1s_frequency() -> None:
    table = random_monotone_table(random.Random(4))
    vector = RelationVector(batch_sizes=B, ratios=[0.3, 0.5, 0.6, 0.8, 0.9, 1.0])
    envelope = [2.0 + 0.5 * j for j in range(len(F))]
    j = 3  # 2.0 + 1.5 = 3.5 <= 3.6 < 4.0
    expected = min(B, key=lambda b: table.time_s[B.index(b)][j] * vector.ratio(b))
    choice = Baseline2(vector, envelope).choose(table, 3.6)
    assert (choice.strategy, choice.batch_size, choice.frequency_hz) == ("baseline2", expected, F[j])
    assert choice.estimated_time_s == pytest.approx(table.time_s[B.index(expected)][j] * vector.ratio(expected))


@pytest.mark.parametrize("seed", range(10))
def test_oracle_is_equation4_with_the_target_vector_and_never_slower_than_the_others(seed: int) -> None:
    rng = random.Random(seed)
    table = random_monotone_table(rng, time_noise=False)  # time falls with f, as on a real device
    proxy = RelationVector(batch_sizes=B, ratios=[rng.uniform(0.3, 2.0) for _ in B[:-1]] + [1.0])
    target = RelationVector(batch_sizes=B, ratios=[rng.uniform(0.3, 2.0) for _ in B[:-1]] + [1.0])
    envelope = [max(row[j] for row in table.peak_power_w) for j in range(len(F))]
    for cap in [None, 3.0, 5.0, 8.0]:
        try:
            oracle = Oracle(target).choose(table, cap)
        except InfeasibleCapError:
            continue
        assert (oracle.batch_size, oracle.frequency_hz) == brute_force(table, target, cap)[1:]
        assert oracle.strategy == "oracle"
        for strategy in (Equation4(proxy), Baseline1(proxy, envelope), Baseline2(proxy, envelope)):
            try:
                other = strategy.choose(table, cap)
            except InfeasibleCapError:
                continue
            i, j = B.index(other.batch_size), F.index(other.frequency_hz)
            assert oracle.estimated_time_s <= table.time_s[i][j] * target.ratio(other.batch_size) + 1e-12


def _two_row_table(time_small_s: float, time_large_s: float, max_batch_size: int | None = None) -> ProfileTable:
    """b=16 and b=64 (and b=128, when memory allows it) at two frequencies; every point under a 10 W cap."""
    return ProfileTable(
        batch_sizes=[16, 64, 128], frequencies_hz=[100, 200], samples=1000, max_batch_size=max_batch_size,
        time_s=[[2 * time_small_s, time_small_s], [2 * time_large_s, time_large_s], [2 * time_large_s, time_large_s]],
        peak_power_w=[[3.0, 4.0], [4.0, 5.0], [4.5, 5.5]],
    )  # fmt: skip


def _vector(samples: list[float], std: list[float]) -> RelationVector:
    return RelationVector(batch_sizes=[16, 64, 128], ratios=[n / samples[-1] for n in samples], samples_mean=samples,
                          samples_std=std, reference_batch_size=128)  # fmt: skip


def test_robust_takes_a_gain_beyond_the_uncertainty_and_says_so() -> None:
    table = _two_row_table(time_small_s=1.0, time_large_s=1.0)
    vector = _vector([500, 900, 1000], [10, 10, 10])  # b=16 needs half the samples: 50 % faster
    choice = Robust(vector).choose(table, None)
    assert (choice.batch_size, choice.frequency_hz) == (16, 200)
    assert choice == Equation4(vector).choose(table, None).model_copy(update={"strategy": "edgetrain", "note": choice.note})
    assert choice.note == "chose b=16: gain 50% over b=128 beyond uncertainty 5%"


def test_robust_keeps_the_largest_batch_when_the_gain_is_within_the_margin() -> None:
    table = _two_row_table(time_small_s=1.0, time_large_s=1.0)
    vector = _vector([970, 990, 1000], [1, 1, 1])  # a 3 % gain, under the 5 % margin
    assert Equation4(vector).choose(table, None).batch_size == 16
    choice = Robust(vector).choose(table, None)
    assert (choice.batch_size, choice.frequency_hz) == (128, 200)
    assert choice.note == "kept b=128: b=16's gain 3% within uncertainty 5%"


def test_robust_uncertainty_grows_with_the_spread_over_seeds() -> None:
    table = _two_row_table(time_small_s=1.0, time_large_s=1.0)
    steady = _vector([800, 900, 1000], [8, 9, 10])  # 20 % gain, 1 % relative spread
    noisy = _vector([800, 900, 1000], [240, 90, 100])  # the same gain, 30 % and 10 % spread: 32 % combined
    assert Robust(steady).choose(table, None).batch_size == 16
    assert Robust(noisy).uncertainty(16, 128) == pytest.approx((0.3**2 + 0.1**2) ** 0.5)
    kept = Robust(noisy).choose(table, None)
    assert kept.batch_size == 128 and kept.note is not None and "within uncertainty 32%" in kept.note


def test_robust_reference_is_the_largest_batch_that_fits_and_meets_the_cap() -> None:
    vector = _vector([970, 990, 1000], [1, 1, 1])
    assert Robust(vector).choose(_two_row_table(1.0, 1.0, max_batch_size=64), None).batch_size == 64
    under_cap = Robust(vector).choose(_two_row_table(1.0, 1.0), 5.2)  # b=128 runs only at 100 Hz, twice as slow
    assert (under_cap.batch_size, under_cap.frequency_hz) == (16, 200)


def _largest_feasible(table: ProfileTable, vector: RelationVector, cap: float | None) -> tuple[int, int, float]:
    """The largest batch size with a measured point under the cap: (b, f at its highest such point, T * r_b)."""
    for i in reversed(range(len(table.batch_sizes))):
        under = [j for j, p in enumerate(table.peak_power_w[i]) if p is not None and (cap is None or p <= cap)]
        time_s = table.time_s[i][max(under)] if under else None
        if time_s is not None:
            b = table.batch_sizes[i]
            return b, table.frequencies_hz[max(under)], time_s * vector.ratio(b)  # type: ignore[operator]
    raise AssertionError("nothing feasible")


@pytest.mark.parametrize("seed", range(20))
def test_robust_chooses_equation4_only_beyond_the_uncertainty_else_the_largest_batch(seed: int) -> None:
    rng = random.Random(seed)
    table = random_monotone_table(rng, holes=0.1)
    samples = [rng.uniform(300, 2000) for _ in B]
    vector = RelationVector(batch_sizes=B, ratios=[n / samples[-1] for n in samples], samples_mean=samples,
                            samples_std=[n * rng.uniform(0, 0.2) for n in samples])  # fmt: skip
    robust = Robust(vector)
    for cap in [None, 3.0, 4.0, 6.0]:
        try:
            plain = Equation4(vector).choose(table, cap)
        except InfeasibleCapError:
            continue
        got = robust.choose(table, cap)
        b_ref, f_ref, estimate_ref = _largest_feasible(table, vector, cap)
        pessimistic = plain.estimated_time_s * (1 + robust.uncertainty(plain.batch_size, b_ref))
        if (got.batch_size, got.frequency_hz) == (b_ref, f_ref):
            assert plain.batch_size == b_ref or pessimistic >= estimate_ref
        else:
            assert (got.batch_size, got.frequency_hz) == (plain.batch_size, plain.frequency_hz)
            assert pessimistic < estimate_ref


# --------------------------------------------------------------------------- other objectives

# b=32 at 300 Hz is the fastest under 5 W, b=32 at 100 Hz the least energy: not the same f.
OBJECTIVE_TABLE = ProfileTable(
    batch_sizes=[8, 32], frequencies_hz=[100, 200, 300], samples=1000,
    time_s=[[3.0, 2.0, 1.5], [2.5, 1.2, 1.0]], peak_power_w=[[2.0, 3.0, 4.0], [3.0, 4.0, 5.0]],
    energy_j=[[5.0, 5.5, 6.0], [4.0, 4.4, 5.0]], max_batch_size=32,
)  # fmt: skip
OBJECTIVE_VECTOR = RelationVector(batch_sizes=[8, 32], ratios=[1.5, 1.0], samples_mean=[1500.0, 1000.0])


def picked(strategy, cap: float | None) -> tuple[int, int]:
    choice = strategy.choose(OBJECTIVE_TABLE, cap)
    return choice.batch_size, choice.frequency_hz


def test_energy_objective_picks_the_energy_argmin_not_the_highest_frequency_under_the_cap() -> None:
    assert picked(Equation4(OBJECTIVE_VECTOR), 5.0) == (32, 300)
    assert picked(Energy(OBJECTIVE_VECTOR), 5.0) == (32, 100)
    assert Energy(OBJECTIVE_VECTOR).choose(OBJECTIVE_TABLE, 5.0).estimated_energy_j == 4.0
    assert picked(Energy(OBJECTIVE_VECTOR), 2.5) == (8, 100)  # the only point under 2.5 W
    with pytest.raises(InfeasibleCapError):
        Energy(OBJECTIVE_VECTOR).choose(OBJECTIVE_TABLE, 1.0)


@pytest.mark.parametrize("seed", range(20))
def test_energy_objective_matches_a_brute_force_argmin_on_random_tables(seed: int) -> None:
    rng = random.Random(seed)
    table = random_monotone_table(rng, holes=0.1)
    energy = [[None if t is None else t * rng.uniform(1, 4) for t in row] for row in table.time_s]
    table = table.model_copy(update={"energy_j": energy})
    vector = RelationVector(batch_sizes=table.batch_sizes, ratios=[rng.uniform(0.5, 3) for _ in table.batch_sizes])
    cap = rng.uniform(3, 12)
    points = [
        (e * vector.ratio(b), b, f)
        for i, b in enumerate(table.batch_sizes)
        for j, (f, e, p) in enumerate(zip(table.frequencies_hz, energy[i], table.peak_power_w[i]))
        if e is not None and p is not None and p <= cap
    ]
    if not points:
        with pytest.raises(InfeasibleCapError):
            Energy(vector).choose(table, cap)
        return
    best = min(points)
    choice = Energy(vector).choose(table, cap)
    assert choice.estimated_energy_j == pytest.approx(best[0]) and (choice.batch_size, choice.frequency_hz) == best[1:]


def test_zeus_cost_runs_from_the_fastest_to_the_least_energy_with_eta() -> None:
    assert picked(ZeusCost(OBJECTIVE_VECTOR, eta=0.0), 5.0) == picked(Equation4(OBJECTIVE_VECTOR), 5.0)
    assert picked(ZeusCost(OBJECTIVE_VECTOR, eta=1.0), 5.0) == picked(Energy(OBJECTIVE_VECTOR), 5.0)
    # eta = 0.5, max power 5 W: b=32 costs 0.5 * (4.0 + 12.5), (4.4 + 6), (5.0 + 5): 300 Hz wins
    assert picked(ZeusCost(OBJECTIVE_VECTOR, eta=0.5), 5.0) == (32, 300)
    assert picked(ZeusCost(OBJECTIVE_VECTOR, eta=0.9), 5.0) == (32, 200)  # 0.9 * 4.4 + 0.1 * 6 is the least


def test_fastest_within_an_energy_budget_and_a_budget_nothing_meets() -> None:
    # energy to accuracy E * N_b / N_s: b=32 at 300/200/100 Hz takes 5.0/4.4/4.0 J
    assert picked(TimeWithinEnergyBudget(OBJECTIVE_VECTOR, 10.0), 5.0) == (32, 300)
    assert picked(TimeWithinEnergyBudget(OBJECTIVE_VECTOR, 4.5), 5.0) == (32, 200)
    with pytest.raises(SelectionError, match=r"objective.energy_budget_j: .* within 3 J; the least estimated energy is 4 J"):
        TimeWithinEnergyBudget(OBJECTIVE_VECTOR, 3.0).choose(OBJECTIVE_TABLE, 5.0)


def test_energy_objectives_need_the_table_energy() -> None:
    with pytest.raises(SelectionError, match="objective 'energy' needs the energy"):
        Energy(OBJECTIVE_VECTOR).choose(OBJECTIVE_TABLE.model_copy(update={"energy_j": None}), 5.0)
