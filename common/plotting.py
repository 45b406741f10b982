"""Heatmaps of a lookup table: peak power P[b][f] (W) and time T[b][f] for N_s samples (s),
with the power cap's feasible boundary, the memory limit b_mem and the selection of eq. (4).

Rows are batch sizes (smallest at the bottom), columns GPU frequencies (MHz). Unmeasured
cells are grey, measured cells over the cap are hatched, and the step line separates each
row's highest feasible frequency f*_b from the next one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from .schemas import ProfileTable, RelationVector, Selection
from .selection import Equation4, SelectionError, highest_feasible_index

UNMEASURED = "#d9d9d9"
NO_FIT = "#9e9e9e"
BOUNDARY = "#e41a1c"
SELECTED = "#ff00ff"
CELL_WIDTH_IN = 0.62
ROW_HEIGHT_IN = 0.42
DPI = 110


def _fits(table: ProfileTable) -> list[bool]:
    limit = table.max_batch_size if table.max_batch_size is not None else math.inf
    return [b <= limit for b in table.batch_sizes]


def _masked(values: list[list[float | None]], fits: list[bool]) -> np.ma.MaskedArray:
    """The values as an array, masked where unmeasured or where the batch does not fit."""
    data = np.array([[np.nan if v is None or not ok else v for v in row] for row, ok in zip(values, fits)], dtype=float)
    return np.ma.masked_invalid(data)


def _boundary(table: ProfileTable, power_cap_w: float) -> tuple[list[float], list[float]]:
    """A step line at the right edge of f*_b in every row that fits (x, y in cell units)."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (row, fits) in enumerate(zip(table.peak_power_w, _fits(table))):
        if not fits:
            continue
        j = highest_feasible_index(row, power_cap_w)
        x = (-1 if j is None else j) + 0.5
        xs += [x, x]
        ys += [i - 0.5, i + 0.5]
    return xs, ys


def _annotate(ax: Axes, values: np.ma.MaskedArray, image: AxesImage, fmt: str) -> None:
    """Write each measured value in its cell, dark or light to contrast with the colour."""
    for (i, j), v in np.ndenumerate(values.filled(np.nan)):
        if np.isnan(v):
            continue
        r, g, b, _ = image.cmap(image.norm(v))
        colour = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7, color=colour)


def _heatmap(ax: Axes, data: np.ma.MaskedArray, log: bool) -> AxesImage:
    """The coloured cells (grey where masked) and a colour bar; log scale for wide ranges."""
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=UNMEASURED)
    finite = data.compressed()
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    norm = LogNorm(low, high) if log and low > 0 else Normalize(low, high)
    image = ax.imshow(data, origin="lower", aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    bar.ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    return image


def _minor_label(value: float, _position: int) -> str:
    """A log colour bar's minor ticks labelled at 2, 3 and 5 times a power of ten only, so
    that the labels near the bottom of a decade do not run into each other."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:.3g}" if any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (2, 3, 5)) else ""


def _mark_no_fit(ax: Axes, table: ProfileTable) -> None:
    cols = len(table.frequencies_hz)
    for i, fits in enumerate(_fits(table)):
        if not fits:
            ax.add_patch(Rectangle((-0.5, i - 0.5), cols, 1, facecolor=NO_FIT, edgecolor="none", zorder=2))
            ax.text((cols - 1) / 2, i, f"b = {table.batch_sizes[i]}: does not fit in memory (b_mem = {table.max_batch_size})",
                    ha="center", va="center", fontsize=8, color="white", zorder=3)  # fmt: skip


def _mark_cap(ax: Axes, table: ProfileTable, power_cap_w: float) -> None:
    """Hatch the measured cells over the cap and draw the boundary after each row's f*_b."""
    for i, row in enumerate(table.peak_power_w):
        for j, p in enumerate(row):
            if p is not None and p > power_cap_w:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white", linewidth=0, alpha=0.5))
    xs, ys = _boundary(table, power_cap_w)
    ax.plot(xs, ys, color=BOUNDARY, linewidth=2.5, zorder=4, clip_on=False)


def _mark_choice(ax: Axes, table: ProfileTable, choice: Selection) -> None:
    i, j = table.batch_sizes.index(choice.batch_size), table.frequencies_hz.index(choice.frequency_hz)
    ax.add_patch(Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, fill=False, edgecolor=SELECTED, linewidth=2.5, zorder=5))
    ax.plot(j, i + 0.3, marker="*", markersize=12, color=SELECTED, markeredgecolor="white", zorder=6)


def _panel(
    ax: Axes, table: ProfileTable, values: list[list[float | None]], title: str, fmt: str, log: bool, power_cap_w: float | None
) -> None:
    """One heatmap with its annotations, memory limit and cap boundary."""
    data = _masked(values, _fits(table))
    _annotate(ax, data, _heatmap(ax, data, log), fmt)
    _mark_no_fit(ax, table)
    if power_cap_w is not None:
        _mark_cap(ax, table, power_cap_w)
    ax.set_xticks(range(len(table.frequencies_hz)), [f"{f / 1e6:g}" for f in table.frequencies_hz], rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(table.batch_sizes)), [str(b) for b in table.batch_sizes], fontsize=8)
    ax.set_xlabel("GPU frequency (MHz)")
    ax.set_ylabel("batch size b")
    ax.set_title(title, fontsize=10)


def describe_selection(table: ProfileTable, vector: RelationVector | None, power_cap_w: float | None) -> tuple[Selection | None, str]:
    """Eq. (4) for the table (r_b = 1 for all b when `vector` is None), and one line saying
    what was selected, or why nothing was, and with which vector."""
    note = "relation vector given" if vector is not None else "no relation vector: r_b = 1 for all b"
    try:
        choice = Equation4(vector or RelationVector.uniform(table.batch_sizes)).choose(table, power_cap_w)
    except SelectionError as exc:
        return None, f"no selection: {exc}; {note}"
    return choice, (
        f"selected (eq. 4): b = {choice.batch_size}, f = {choice.frequency_hz / 1e6:g} MHz, "
        f"T x r_b = {choice.estimated_time_s:.3g} s, peak {choice.peak_power_w:.2f} W; {note}"
    )


def describe_table(table: ProfileTable) -> str:
    """One line naming the table: device type, model, input, how it was profiled, b_mem, and
    SIMULATED when a twin made it."""
    shape = "x".join(map(str, table.input_shape or [])) or "?"
    mode = f"staircase profile for cap {table.power_cap_w} W" if table.mode == "staircase" else "grid profile"
    total = len(table.batch_sizes) * len(table.frequencies_hz)
    simulated = "  |  SIMULATED (figures from a twin)" if table.simulated else ""
    return (
        f"{table.device_type or '?'}  |  {table.model or '?'}  |  input {shape}  |  {mode}  |  "
        f"{table.measured_points()} of {total} points measured  |  b_mem = {table.max_batch_size}{simulated}"
    )


def cap_text(power_cap_w: float | None) -> str:
    """The cap for a title: '4 W cap' or 'no power cap'."""
    return f"power cap {power_cap_w:g} W" if power_cap_w is not None else "no power cap"


def profile_legend(fig: Figure, table: ProfileTable, power_cap_w: float | None, marks: Sequence[Artist]) -> None:
    """The legend under a profile figure: `marks` (what is marked on the cells), then the
    cells' meanings that apply (unmeasured, cap boundary, over the cap, does not fit)."""
    handles = [*marks, Patch(facecolor=UNMEASURED, label="not measured")]
    if power_cap_w is not None:
        handles += [
            Line2D([], [], color=BOUNDARY, linewidth=2.5, label="cap boundary: f*_b on its left"),
            Patch(facecolor="#555555", hatch="///", edgecolor="white", label="peak power over the cap"),
        ]
    if not all(_fits(table)):
        handles.append(Patch(facecolor=NO_FIT, label=f"does not fit (b > b_mem = {table.max_batch_size})"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)


def figure_size_in(table: ProfileTable) -> tuple[float, float]:
    """(width, height) of the figure (inches): two panels of fixed-size cells, titles, legend."""
    cols, rows = len(table.frequencies_hz), len(table.batch_sizes)
    return max(12.0, 2 * cols * CELL_WIDTH_IN + 3.0), max(4.5, rows * ROW_HEIGHT_IN + 2.6)


def profile_figure(table: ProfileTable, power_cap_w: float | None, title: str) -> tuple[Figure, tuple[Axes, Axes]]:
    """A figure with the peak power (W) and time for N_s samples (s) heatmaps of `table` and
    the cap's feasible boundary, nothing selected yet; room at the bottom for the legend."""
    fig = Figure(figsize=figure_size_in(table), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    fig.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))  # type: ignore[union-attr,call-arg]  # constrained layout
    _panel(left, table, table.peak_power_w, "peak board power P[b][f] (W)", ".2f", False, power_cap_w)
    _panel(right, table, table.time_s, f"time T[b][f] for N_s = {table.samples} samples (s)", ".3g", True, power_cap_w)
    fig.suptitle(title, fontsize=10)
    return fig, (left, right)


def plot_profile(table: ProfileTable, path: str | Path, power_cap_w: float | None, vector: RelationVector | None) -> None:
    """Write a PNG with the peak power (W) and time for N_s samples (s) heatmaps of `table`,
    the cap's feasible boundary and the selection of eq. (4) (r_b = 1 when `vector` is None)."""
    choice, selection_note = describe_selection(table, vector, power_cap_w)
    fig, axes = profile_figure(table, power_cap_w, f"{describe_table(table)}\n{cap_text(power_cap_w)}; {selection_note}")
    if choice is not None:
        for ax in axes:
            _mark_choice(ax, table, choice)
    star = Line2D([], [], marker="*", color=SELECTED, markeredgecolor="white", markersize=12, linestyle="none", label="selected (b, f*_b)")
    profile_legend(fig, table, power_cap_w, [star])
    fig.savefig(path, dpi=DPI)
