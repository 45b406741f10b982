import random
from datetime import timedelta

import pytest

from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile, software_versions, staircase
from edgetrain.common.schemas import DeviceInfo, LearningRatePolicy, ProfileTable, ProfilingOptions, RelationVector, utc_now
from edgetrain.common.selection import Equation4, InfeasibleCapError
from edgetrain.common.tables import reuse_problem
from edgetrain.common.testing.devices import RecordedDevice
from edgetrain.common.testing.tables import B, F, random_monotone_table

SMALL = get_model("smallcnn")
LR = LearningRatePolicy()


def fstar(table: ProfileTable, b: int, cap: float):
    row = table.peak_power_w[table.batch_sizes.index(b)]
    return max((j for j, p in enumerate(row) if p is not None and p <= cap), default=None)


def selection_or_none(table, vector, cap):
    try:
        s = Equation4(vector).choose(table, cap)
        return s.batch_size, s.frequency_hz
    except InfeasibleCapError:
        return None


@pytest.mark.parametrize("seed", range(8))
def test_staircase_and_grid_select_the_same_on_random_monotone_tables(seed: int) -> None:
    rng = random.Random(seed)
    truth = random_monotone_table(rng)
    vector = RelationVector(batch_sizes=B, ratios=[rng.uniform(0.3, 2.0) for _ in B[:-1]] + [1.0])
    options = ProfilingOptions(samples=truth.samples, warmup_batches=0, measure_batches=1)
    grid = profile(RecordedDevice(truth), SMALL, B, options, LR)
    assert grid.points_measured == len(B) * len(F)
    for cap in sorted(rng.uniform(2.0, 8.0) for _ in range(6)):
        stairs = profile(RecordedDevice(truth), SMALL, B, options.model_copy(update={"mode": "staircase"}), LR, cap)
        stuck = sum(1 for b in B[:-1] if fstar(stairs, b, cap) == fstar(stairs, b * 2, cap) or fstar(stairs, b, cap) is None)
        assert stairs.mode == "staircase" and stairs.points_measured <= len(B) + len(F) + stuck + 1
        assert selection_or_none(stairs, vector, cap) == selection_or_none(grid, vector, cap)


def test_staircase_visits_at_most_b_plus_f_points_on_monotone_data() -> None:
    power = {(b, f): b * 0.01 + f * 0.002 for b in B for f in F}
    visited = staircase(lambda b, f: power[(b, f)], B, F, power_cap_w=1.5)
    assert len(visited) <= len(B) + len(F)
    assert visited[0] == (128, F[0])  # largest batch, lowest frequency first
    assert len(set(visited)) == len(visited)


def profile_twin(mode: str, cap: float | None, seed: int, batch_sizes=(4, 16, 64)) -> ProfileTable:
    device = SimulatedDevice(load_twin("jetson-nano"), seed=seed)
    options = ProfilingOptions(mode=mode, measure_batches=2)
    return profile(device, SMALL, list(batch_sizes), options, LR, cap)


def test_staircase_and_grid_agree_on_a_noisy_twin() -> None:
    vector = RelationVector(batch_sizes=[4, 16, 64], ratios=[0.4, 0.5, 1.0])
    grid = profile_twin("grid", None, seed=11)
    values = sorted({p for row in grid.peak_power_w for p in row})
    gaps = [(b - a, (a + b) / 2) for a, b in zip(values, values[1:]) if b - a >= 0.15]
    caps = [mid for _, mid in gaps][:4]
    assert caps, "the twin's power levels should leave room for caps between them"
    for cap in caps:
        stairs = profile_twin("staircase", cap, seed=12)
        for row_g, row_s in zip(grid.peak_power_w, stairs.peak_power_w):
            feasible_g = max((j for j, p in enumerate(row_g) if p <= cap), default=None)
            feasible_s = max((j for j, p in enumerate(row_s) if p is not None and p <= cap), default=None)
            assert feasible_g == feasible_s  # the same f*_b per batch size
        chosen_g, chosen_s = Equation4(vector).choose(grid, cap), Equation4(vector).choose(stairs, cap)
        objectives = sorted(
            grid.time_s[i][j] * vector.ratios[i]
            for i, row in enumerate(grid.peak_power_w)
            for j in [max((j for j, p in enumerate(row) if p <= cap), default=None)]
            if j is not None
        )
        if len(objectives) < 2 or objectives[1] > 1.05 * objectives[0]:  # a clear winner
            assert (chosen_s.batch_size, chosen_s.frequency_hz) == (chosen_g.batch_size, chosen_g.frequency_hz)


def test_memory_limit_is_found_and_stored() -> None:
    spec = load_twin("jetson-nano").model_copy(update={"memory_bytes": load_twin("jetson-nano").reserved_memory_bytes + 40_000_000})
    device = SimulatedDevice(spec)
    table = profile(device, SMALL, [4, 16, 64, 128], ProfilingOptions(measure_batches=1, warmup_batches=0), LR)
    assert table.max_batch_size == 64  # 2 x 128 x 0.18 MB of activations does not fit in 40 MB
    assert all(p is None for p in table.peak_power_w[-1]) and all(p is not None for p in table.peak_power_w[-2])
    vector = RelationVector(batch_sizes=[4, 16, 64, 128], ratios=[9.0, 9.0, 9.0, 0.001])
    assert Equation4(vector).choose(table, None).batch_size != 128


def test_tables_record_what_produced_them_and_stale_ones_are_refused() -> None:
    table = profile_twin("grid", None, seed=1, batch_sizes=(4,))
    assert table.produced_by == software_versions() | SimulatedDevice(load_twin("jetson-nano")).software
    assert table.produced_by["torch"] and table.produced_by["twin_spec"]
    info = DeviceInfo(
        device_id="n",
        device_type="jetson-nano",
        backend="sim",
        frequencies_hz=[1],
        memory_bytes=1,
        simulated=True,
        software=software_versions(),
    )
    assert reuse_problem(table, info, None) is None
    newer = info.model_copy(update={"software": software_versions() | {"torch": "99.0"}})
    assert "torch" in reuse_problem(table, newer, None)
    assert "force" in reuse_problem(table, info, None, not_before=utc_now() + timedelta(seconds=1))
    stairs = table.model_copy(update={"mode": "staircase", "power_cap_w": 4.0})
    assert reuse_problem(stairs, info, 4.0) is None and "staircase" in reuse_problem(stairs, info, 5.0)


class HostTimedTwin(SimulatedDevice):
    """The same twin, as if the host's work were what it measures."""

    simulated = False


def test_a_twins_table_runs_real_steps_once_per_batch_size_and_its_figures_are_those_of_every_step_run(monkeypatch) -> None:
    from edgetrain.common.training import Trainer

    ran: list[int] = []
    step = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self: (ran.append(self.batch_size), step(self))[1])
    options = ProfilingOptions(warmup_batches=1, measure_batches=2)
    twin = profile(SimulatedDevice(load_twin("jetson-nano"), seed=3), SMALL, [4, 16], options, LR)
    assert sorted(ran) == [4] * 3 + [16] * 3  # one point of each batch size: its warm-up and measured steps
    ran.clear()
    every_step = profile(HostTimedTwin(load_twin("jetson-nano"), seed=3), SMALL, [4, 16], options, LR)
    assert len(ran) == 3 * every_step.points_measured == 3 * 2 * 12
    assert (twin.time_s, twin.peak_power_w, twin.energy_j) == (every_step.time_s, every_step.peak_power_w, every_step.energy_j)
