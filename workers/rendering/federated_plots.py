"""The figure of a federated evaluation (PNG, matplotlib's Agg canvas): the global model's
accuracy after each round against the device time since the start (SIMULATED, left) and
against the round (right), one line per method and seed (dotted: with the relation vector),
the target as a dashed line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from edgetrain.common.federated.evaluation import LABELS, FederatedEvaluation
from edgetrain.common.federated.simulate import VECTOR
from edgetrain.common.plotting import DPI

from .evaluation_plots import COLOURS, SIMULATED_NOTE


def _style(method: str) -> dict[str, Any]:
    """A method's colour and line style (dotted with the relation vector)."""
    return {"color": COLOURS[method.removesuffix(VECTOR)], "linestyle": ":" if method.endswith(VECTOR) else "-"}


def plot_accuracy(evaluation: FederatedEvaluation, path: str | Path) -> None:
    """Global accuracy over device time (s) and over rounds, per method (colour; dotted with
    the relation vector) and seed (a line each)."""
    fig = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(fig)
    by_time, by_round = fig.subplots(1, 2, sharey=True)
    for run in evaluation.runs:
        accuracy = [run.initial_accuracy, *(r.accuracy for r in run.rounds)]
        style = {**_style(run.method), "linewidth": 1.2, "alpha": 0.8, "marker": "o", "markersize": 2.5}
        by_time.plot([0.0, *(r.elapsed_s for r in run.rounds)], accuracy, **style)
        by_round.plot(range(len(accuracy)), accuracy, **style)
    target = evaluation.spec.job.target_accuracy
    for ax, xlabel in ((by_time, "device time since the start (s, SIMULATED; a round lasts as long as its slowest device)"),
                       (by_round, "round")):  # fmt: skip
        ax.axhline(target, color="black", linestyle="--", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_time.set_ylabel("global accuracy (test split)")
    handles = [Line2D([], [], label=LABELS[s.method], **_style(s.method)) for s in evaluation.summary]
    handles.append(Line2D([], [], color="black", linestyle="--", label=f"target {target:g}"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9, frameon=False)
    seeds = evaluation.spec.seeds
    fig.suptitle(f"{evaluation.name or 'federated evaluation'}\nglobal accuracy after each round, one line per method and seed "
                 f"({len(seeds)} seeds)  |  {SIMULATED_NOTE}", fontsize=11)  # fmt: skip
    fig.savefig(path, dpi=DPI)
