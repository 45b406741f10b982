import random

import pytest
from matplotlib.image import imread

from edgetrain.common.plotting import DPI, describe_selection, figure_size_in, plot_profile
from edgetrain.common.schemas import ProfileTable, RelationVector
from edgetrain.common.selection import highest_feasible_index
from edgetrain.common.testing.tables import B, random_monotone_table

VECTOR = RelationVector(batch_sizes=B, ratios=[0.4, 0.5, 0.6, 0.7, 0.8, 1.0])


def staircase_like(table: ProfileTable, cap: float) -> ProfileTable:
    """Keep each row's f*_b and the first point over the cap, as staircase profiling leaves a row."""
    power, time = [], []
    for prow, trow in zip(table.peak_power_w, table.time_s):
        j = highest_feasible_index(prow, cap)
        keep = {0} if j is None else {j, j + 1}
        power.append([p if k in keep else None for k, p in enumerate(prow)])
        time.append([t if k in keep else None for k, t in enumerate(trow)])
    return table.model_copy(update={"peak_power_w": power, "time_s": time, "mode": "staircase", "power_cap_w": cap})


def png_shape(path) -> tuple[int, int]:
    height, width = imread(path).shape[:2]
    return width, height


@pytest.mark.parametrize("kind", ["grid", "staircase", "does-not-fit", "infeasible"])
def test_plot_writes_a_png_of_the_expected_size(tmp, kind: str) -> None:
    table = random_monotone_table(random.Random(1), holes=0.1)
    table = table.model_copy(update={"device_type": "jetson-nano", "model": "resnet18", "input_shape": [3, 32, 32], "simulated": True})
    cap, vector = 3.0, VECTOR
    if kind == "staircase":
        table = staircase_like(table, cap)
    elif kind == "does-not-fit":
        table.max_batch_size, vector = 32, None
    elif kind == "infeasible":
        cap = 0.5
    path = tmp / f"{kind}.png"
    plot_profile(table, path, cap, vector)
    width_in, height_in = figure_size_in(table)
    assert path.stat().st_size > 10_000
    assert png_shape(path) == (round(width_in * DPI), round(height_in * DPI))


def test_plot_without_cap_or_vector(tmp) -> None:
    table = random_monotone_table(random.Random(2))
    plot_profile(table, tmp / "plain.png", None, None)
    assert png_shape(tmp / "plain.png") == tuple(round(x * DPI) for x in figure_size_in(table))


def test_selection_note_names_the_vector_and_the_reason() -> None:
    table = random_monotone_table(random.Random(3))
    choice, note = describe_selection(table, None, 3.0)
    assert choice is not None and f"b = {choice.batch_size}" in note and "r_b = 1 for all b" in note
    choice, note = describe_selection(table, VECTOR, 0.5)
    assert choice is None and "power cap 0.50 W" in note and "relation vector given" in note
