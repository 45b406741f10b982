"""The figure of a federated evaluation (PNG, matplotlib's Agg canvas): the global model's
accuracy after each round against the device time since the start (SIMULATED, left) and
against the round (middle), and the worst device's accuracy on its held-out data against the
round (right), one line per method and seed (dotted: with the relation vector; dash-dotted:
FedNova; dashed: buffered; long dashes: within a fleet power budget), the target as a dashed line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from edgetrain.common.federated.evaluation import LABELS, FederatedEvaluation
from edgetrain.common.federated.simulate import ASYNC, BUDGET, FEDNOVA, SCAFFOLD, VECTOR
from edgetrain.common.federated.spec import DEADLINE
from edgetrain.common.plotting import DPI

from .evaluation_plots import COLOURS, SIMULATED_NOTE

COLOURS_BY_METHOD = {**COLOURS, f"baseline1{DEADLINE}": "#56b4e9"}


STYLES: dict[str, Any] = {VECTOR: ":", FEDNOVA: "-.", ASYNC: "--", BUDGET: (0, (8, 3)), SCAFFOLD: (0, (3, 1, 1, 1, 1, 1))}


def _style(method: str) -> dict[str, Any]:
    """A method's colour and line style (dotted with the relation vector, dash-dotted with
    FedNova, dashed when buffered, long dashes within a fleet power budget, dash-dot-dot with
    drift correction)."""
    suffix = next((s for s in STYLES if method.endswith(s)), "")
    return {"color": COLOURS_BY_METHOD[method.removesuffix(suffix)], "linestyle": STYLES.get(suffix, "-")}


def plot_accuracy(evaluation: FederatedEvaluation, path: str | Path) -> None:
    """Global accuracy over device time (s) and over rounds, and the worst device's held-out
    accuracy over rounds, per method (colour and line style) and seed (a line each)."""
    fig = Figure(figsize=(17, 5), layout="constrained")
    FigureCanvasAgg(fig)
    by_time, by_round, worst = fig.subplots(1, 3, sharey=True)
    for run in evaluation.runs:
        accuracy = [run.initial_accuracy, *(r.accuracy for r in run.rounds)]
        style = {**_style(run.method), "linewidth": 1.2, "alpha": 0.8, "marker": "o", "markersize": 2.5}
        by_time.plot([0.0, *(r.elapsed_s for r in run.rounds)], accuracy, **style)
        by_round.plot(range(len(accuracy)), accuracy, **style)
        fair = [(r.round, f.worst) for r in run.rounds if (f := r.fairness())]
        worst.plot([r for r, _ in fair], [w for _, w in fair], **style)
    target = evaluation.spec.job.target_accuracy
    for ax, xlabel in ((by_time, "device time since the start (s, SIMULATED; a round lasts as long as its slowest device)"),
                       (by_round, "round"), (worst, "round")):  # fmt: skip
        ax.axhline(target, color="black", linestyle="--", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_time.set_ylabel("global accuracy (test split)")
    worst.set_title("worst device: the global model on its held-out data", fontsize=10)
    handles = [Line2D([], [], label=LABELS[s.method], **_style(s.method)) for s in evaluation.summary]
    handles.append(Line2D([], [], color="black", linestyle="--", label=f"target {target:g}"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9, frameon=False)
    seeds = evaluation.spec.seeds
    fig.suptitle(f"{evaluation.name or 'federated evaluation'}\nglobal accuracy after each round, one line per method and seed "
                 f"({len(seeds)} seeds)  |  {SIMULATED_NOTE}", fontsize=11)  # fmt: skip
    fig.savefig(path, dpi=DPI)
