"""Figures of an evaluation (PNG, matplotlib's Agg canvas): time and energy to accuracy per
method and cap (groups per cap, one bar per method, error bars = std over seeds), the proxy
sensitivity matrices as heatmaps, and each method's (b, f) on the device type's profile.
Figures with numbers from simulated devices say SIMULATED."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from edgetrain.common.evaluation import (
    METHODS,
    EvaluationReport,
    EvaluationRow,
    MethodResult,
    SensitivityMatrix,
)
from edgetrain.common.plotting import (
    DPI,
    UNMEASURED,
    cap_text,
    describe_table,
    profile_figure,
    profile_legend,
)
from edgetrain.common.schemas import ProfileTable

LABELS = {"baseline1": "Baseline 1", "baseline2": "Baseline 2", "equation4": "eq. (4) alone", "edgetrain": "edgetrain",
          "energy": "least energy", "oracle": "oracle"}  # fmt: skip
COLOURS = {"baseline1": "#999999", "baseline2": "#56b4e9", "equation4": "#cc79a7", "edgetrain": "#e69f00",
           "energy": "#0072b2", "oracle": "#009e73"}  # Okabe-Ito  # fmt: skip
MARKERS = {"baseline1": "s", "baseline2": "D", "equation4": "v", "edgetrain": "o", "energy": "P", "oracle": "^"}
# each method's marker in a corner of its cell, clear of the value written in the middle
CELL_OFFSETS = {"baseline1": (-0.33, 0.28), "baseline2": (0.33, 0.28), "equation4": (0.0, 0.33), "edgetrain": (-0.33, -0.28),
                "energy": (0.0, -0.33), "oracle": (0.33, -0.28)}  # fmt: skip
SIMULATED_NOTE = "SIMULATED devices: time, power and energy come from twins"
PANEL_HEIGHT_IN = 3.4


def _simulated_suffix(simulated: bool) -> str:
    return f"  |  {SIMULATED_NOTE}" if simulated else ""


def _mhz(frequency_hz: int | None) -> str:
    return "-" if frequency_hz is None else f"{frequency_hz / 1e6:g} MHz"


def _cap_label(power_cap_w: float | None) -> str:
    return "no cap" if power_cap_w is None else f"{power_cap_w:g} W"


def _value(method: MethodResult, field: str) -> tuple[float, float]:
    """(mean, std) of `field` ("time_to_accuracy_s" or "energy_j"), NaN when unknown."""
    spread = getattr(method, field)
    return (spread.mean, spread.std) if method.reached and spread is not None else (math.nan, math.nan)


def _bars(ax: Axes, rows: list[EvaluationRow], field: str, ylabel: str) -> None:
    """One group per cap, one bar per method with its std over seeds; 'not reached' where
    a method has no configuration or its batch size never reaches the target."""
    x = np.arange(len(rows))
    width = 0.8 / len(METHODS)
    top = 0.0
    for k, name in enumerate(METHODS):
        offset = (k - (len(METHODS) - 1) / 2) * width
        means, stds = zip(*(_value(getattr(r, name), field) for r in rows))
        ax.bar(x + offset, means, width, yerr=stds, capsize=3, color=COLOURS[name], edgecolor="black", linewidth=0.5,
               error_kw={"elinewidth": 1}, label=LABELS[name])  # fmt: skip
        top = max([top, *(m + s for m, s in zip(means, stds) if not math.isnan(m))])
        for xi, m in zip(x, means):
            if math.isnan(m):
                ax.text(xi + offset, 0, " not reached", rotation=90, ha="center", va="bottom", fontsize=7, color="#b2182b")
    ax.set_xticks(x, [_cap_label(r.power_cap_w) for r in rows])
    ax.set_xlabel("board power cap")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, (top or 1.0) * 1.3)
    ax.grid(axis="y", alpha=0.3)


def _speedups(ax: Axes, rows: list[EvaluationRow]) -> None:
    """Above each cap's group: edgetrain's speed-up over Baseline 1 and its gap to the oracle."""
    for xi, row in enumerate(rows):
        b1 = "n/a" if row.speedup_vs_baseline1 is None else f"{row.speedup_vs_baseline1:.2f}x"
        gap = "n/a" if row.gap_to_oracle_pct is None else f"{row.gap_to_oracle_pct:+.1f} %"
        ax.text(xi, ax.get_ylim()[1] * 0.97, f"edgetrain vs B1: {b1}\nvs oracle: {gap}", ha="center", va="top", fontsize=8.5)


def plot_time_energy(rows: list[EvaluationRow], path: str | Path, title: str | None = None) -> None:
    """Bars of time (s) and energy (J) to accuracy: a row of panels per (device type,
    target), groups per cap, one bar per method."""
    groups = list(dict.fromkeys((r.device_type, r.target) for r in rows))
    fig = Figure(figsize=(12, 1.4 + PANEL_HEIGHT_IN * len(groups)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (device_type, target), (ax_time, ax_energy) in zip(groups, axes):
        sub = [r for r in rows if (r.device_type, r.target) == (device_type, target)]
        heading = f"{device_type}  |  target {target}, proxy {sub[0].proxy}" + ("  |  SIMULATED" if sub[0].simulated else "")
        _bars(ax_time, sub, "time_to_accuracy_s", "time to accuracy (s)")
        _speedups(ax_time, sub)
        _bars(ax_energy, sub, "energy_j", "energy to accuracy (J)")
        ax_time.set_title(heading, fontsize=10)
        ax_energy.set_title(heading, fontsize=10)
    simulated = any(r.simulated for r in rows)
    fig.suptitle(f"{title or 'time and energy to the target accuracy'}\nmean over seeds, error bars: standard deviation"
                 f"{_simulated_suffix(simulated)}", fontsize=11)  # fmt: skip
    handles = [Patch(facecolor=COLOURS[m], edgecolor="black", linewidth=0.5, label=LABELS[m]) for m in METHODS]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(METHODS), fontsize=9, frameon=False)
    fig.savefig(path, dpi=DPI)


def _sensitivity_panel(ax: Axes, matrix: SensitivityMatrix, norm: Normalize) -> AxesImage:
    """Proxies (rows) by targets (columns), Baseline 1 in a row of its own at the bottom."""
    n = len(matrix.datasets)
    values = [*matrix.edgetrain_over_oracle_pct, matrix.baseline1_over_oracle_pct]
    data = np.ma.masked_invalid(np.array([[math.nan if v is None else v for v in line] for line in values], dtype=float))
    cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad=UNMEASURED)
    image = ax.imshow(data, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for (i, j), v in np.ndenumerate(data.filled(np.nan)):
        text = "not\nreached" if np.isnan(v) else f"{v:.1f} %"
        r, g, b, _ = cmap(norm(0 if np.isnan(v) else v))
        colour = "black" if np.isnan(v) or 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
        ax.text(j, i, text, ha="center", va="center", fontsize=11, color=colour)
    ax.axhline(n - 0.5, color="white", linewidth=4)
    ax.set_xticks(range(n), matrix.datasets, rotation=20, ha="right", fontsize=10)
    ax.set_yticks(range(n + 1), [f"edgetrain, proxy {d}" for d in matrix.datasets] + ["Baseline 1 (no proxy)"], fontsize=10)
    ax.set_xlabel("target dataset")
    simulated = "  |  SIMULATED" if matrix.simulated else ""
    ax.set_title(f"{matrix.device_type}, {cap_text(matrix.power_cap_w)}{simulated}", fontsize=11)
    return image


def plot_sensitivity(matrices: list[SensitivityMatrix], path: str | Path, title: str | None = None) -> None:
    """Heatmaps of % time over the oracle, one per (device type, cap), on one colour scale
    that spans edgetrain's values (at least 10 %); larger values (often Baseline 1's) take
    the darkest colour, and every cell is written out."""
    n = max(len(m.datasets) for m in matrices)
    columns = min(len(matrices), 3)
    lines = math.ceil(len(matrices) / columns)
    fig = Figure(figsize=(columns * (1.1 * n + 3.2) + 1.0, lines * (0.5 * (n + 1) + 2.0) + 1.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(lines, columns, squeeze=False).ravel()
    finite = [v for m in matrices for line in m.edgetrain_over_oracle_pct for v in line if v is not None]
    norm = Normalize(0.0, max([*finite, 10.0]), clip=True)
    images = [_sensitivity_panel(ax, matrix, norm) for ax, matrix in zip(axes, matrices)]
    for ax in axes[len(matrices) :]:
        ax.set_visible(False)
    fig.colorbar(images[0], ax=list(axes[: len(matrices)]), label="% time to accuracy over the oracle", shrink=0.8, extend="max")
    simulated = any(m.simulated for m in matrices)
    fig.suptitle(f"{title or 'proxy sensitivity'}\n% more time to the target than the oracle (grey: not reached)"
                 f"{_simulated_suffix(simulated)}", fontsize=12)  # fmt: skip
    fig.savefig(path, dpi=DPI)


def plot_choices(table: ProfileTable, row: EvaluationRow, path: str | Path) -> None:
    """The device type's profile heatmaps under the row's cap, each method's (b, f) marked."""
    chosen = {m: getattr(row, m) for m in METHODS}
    title = (f"{describe_table(table)}\n{cap_text(row.power_cap_w)}; target {row.target}, proxy {row.proxy}; "
             + ", ".join(f"{LABELS[m]} b={c.batch_size} {_mhz(c.frequency_hz)}" for m, c in chosen.items() if c.batch_size))  # fmt: skip
    fig, axes = profile_figure(table, row.power_cap_w, title)
    handles = []
    for name, method in chosen.items():
        style: dict[str, Any] = {
            "marker": MARKERS[name],
            "color": COLOURS[name],
            "markeredgecolor": "black",
            "markersize": 7,
            "linestyle": "none",
        }
        label = LABELS[name] if method.reached else f"{LABELS[name]} ({'not reached' if method.batch_size else 'none under the cap'})"
        handles.append(Line2D([], [], label=label, **style))
        if method.batch_size is None or method.frequency_hz is None:
            continue
        i, j = table.batch_sizes.index(method.batch_size), table.frequencies_hz.index(method.frequency_hz)
        dx, dy = CELL_OFFSETS[name]
        for ax in axes:
            ax.plot(j + dx, i + dy, zorder=6, **style)
    profile_legend(fig, table, row.power_cap_w, handles)
    fig.savefig(path, dpi=DPI)


def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-")


def write_figures(report: EvaluationReport, tables: dict[str, ProfileTable], folder: str | Path, title: str | None = None) -> list[Path]:
    """Every figure of a report in `folder`: time-energy.png, sensitivity.png and one profile
    per row (`tables` maps device type to its lookup table); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "time-energy.png"]
    plot_time_energy(report.rows, written[0], title)
    if report.sensitivity:
        written.append(folder / "sensitivity.png")
        plot_sensitivity(report.sensitivity, written[-1], title)
    for row in report.rows:
        path = folder / f"profile-{_slug(row.device_type, _cap_label(row.power_cap_w), row.target)}.png"
        plot_choices(tables[row.device_type], row, path)
        written.append(path)
    return written
