"""An evaluation as text: Markdown tables in the layout of the paper's results table (one
column per method: Baseline 1, Baseline 2, equation (4) alone, edgetrain, the energy
objective, oracle), readable in a terminal and
pasted as is into documentation. Figures from simulated devices are marked SIMULATED."""

from __future__ import annotations

import math

from edgetrain.common.evaluation import (
    METHODS,
    Achieved,
    EvaluationRow,
    EvaluationRun,
    MeanStd,
    Robustness,
    SensitivityMatrix,
    Verification,
)

HEADS = {"baseline1": "Baseline 1", "baseline2": "Baseline 2", "equation4": "eq. (4) alone", "edgetrain": "edgetrain",
         "energy": "least energy", "oracle": "oracle"}  # fmt: skip


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def spread_cell(value: MeanStd | None) -> str:
    """A figure over seeds in a cell: "mean ± std", or "not reached"."""
    return "not reached" if value is None else f"{_num(value.mean)} ± {_num(value.std, 2)}"


def cap_cell(power_cap_w: float | None) -> str:
    """A power cap in a cell: "5 W" or "none"."""
    return "none" if power_cap_w is None else f"{power_cap_w:g} W"


def mhz_cell(frequency_hz: int | None) -> str:
    """A frequency in MHz in a cell, "-" when there is none."""
    return "-" if frequency_hz is None else f"{frequency_hz / 1e6:g}"


def times_cell(value: float | None) -> str:
    """A ratio in a cell: "1.50x", "-" when there is none."""
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _device(row: EvaluationRow) -> str:
    return f"{row.device_type} (SIMULATED)" if row.simulated else row.device_type


def markdown_table(head: list[str], lines: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the header, the rule, one line per row of cells."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(line) + " |" for line in lines)]


def _row_key(row: EvaluationRow) -> list[str]:
    return [_device(row), row.target, cap_cell(row.power_cap_w)]


def results_tables(rows: list[EvaluationRow]) -> list[str]:
    """Time and energy to accuracy per method (mean ± std over seeds), with the speed-ups and
    the gap to the oracle, then each method's configuration."""
    key = ["device", "target", "cap"]
    heads = [HEADS[m] for m in METHODS]
    lines = ["Time to accuracy (device s, mean ± std over seeds; eq. (2) with the target's N_b):", ""]
    lines += markdown_table(
        key + heads + ["edgetrain vs B1", "vs B2", "over oracle"],
        [_row_key(r) + [spread_cell(getattr(r, m).time_to_accuracy_s if getattr(r, m).reached else None) for m in METHODS]
         + [times_cell(r.speedup_vs_baseline1), times_cell(r.speedup_vs_baseline2), _pct(r.gap_to_oracle_pct)] for r in rows],
    )  # fmt: skip
    lines += ["", "Energy to accuracy (board J, mean ± std over seeds):", ""]
    lines += markdown_table(
        key + heads,
        [_row_key(r) + [spread_cell(getattr(r, m).energy_j if getattr(r, m).reached else None) for m in METHODS] for r in rows],
    )
    lines += ["", "Configurations (batch size @ GPU MHz; '-': none under the cap):", ""]
    lines += markdown_table(
        key + heads,
        [_row_key(r) + [f"{getattr(r, m).batch_size or '-'} @ {mhz_cell(getattr(r, m).frequency_hz)}" for m in METHODS] for r in rows],
    )
    return lines


def sensitivity_tables(matrices: list[SensitivityMatrix]) -> list[str]:
    """Per (device type, cap): % time over the oracle of edgetrain and of plain equation (4)
    with each proxy (rows) on each target (columns), and Baseline 1's (no proxy)."""
    lines: list[str] = []
    for m in matrices:
        simulated = " (SIMULATED)" if m.simulated else ""
        heading = f"{m.device_type}{simulated}, cap {cap_cell(m.power_cap_w)}: % time over the oracle (rows: proxy; columns: target)"
        lines += ["", heading, ""]
        body = [[f"edgetrain, proxy {d}", *map(_pct, line)] for d, line in zip(m.datasets, m.edgetrain_over_oracle_pct)]
        body += [[f"eq. (4) alone, proxy {d}", *map(_pct, line)] for d, line in zip(m.datasets, m.equation4_over_oracle_pct)]
        body.append(["Baseline 1 (no proxy)", *map(_pct, m.baseline1_over_oracle_pct)])
        lines += markdown_table(["", *m.datasets], body)
    return lines


def robustness_lines(r: Robustness) -> list[str]:
    """edgetrain and plain equation (4) against Baseline 1 over every cell of the matrices."""
    lines = [
        f"Against Baseline 1 over {r.cells} cells (device type, cap, proxy, target): edgetrain is at worst "
        f"{times_cell(r.edgetrain_worst)} Baseline 1's time ({len(r.edgetrain_over)} cells over 1.05x), plain "
        f"equation (4) {times_cell(r.equation4_worst)} ({len(r.equation4_over)} cells over 1.05x). Where equation (4) "
        f"is faster than Baseline 1 ({r.speedup_cells} cells), edgetrain keeps at least "
        f"{'-' if r.kept_least is None else f'{r.kept_least:.0%}'} of its speed-up "
        f"({len(r.kept_below_90pct)} cells below 90 %).",
    ]  # fmt: skip
    lines += [f"- edgetrain over 1.05x: {c}" for c in r.edgetrain_over]
    lines += [f"- equation (4) over 1.05x: {c}" for c in r.equation4_over]
    lines += [f"- below 90 % of equation (4)'s speed-up: {c}" for c in r.kept_below_90pct]
    return lines


def vector_table(run: EvaluationRun) -> list[str]:
    """N_b per batch size and dataset (mean ± std over seeds) and each vector's resolution."""
    labels = list(run.vectors)
    sizes = run.spec.batch_sizes
    body = []
    for b in sizes:
        cells = []
        for label in labels:
            v = run.vectors[label]
            mean, std = v.samples_for(b), v.samples_std_for(b)
            cells.append("censored" if mean is None else f"{mean:.0f} ± {std or 0:.0f}")
        body.append([str(b), *cells])
    body.append(["resolution", *(f"{run.vectors[label].resolution_samples} samples" for label in labels)])
    return ["N_b, samples to the target accuracy (mean ± std over seeds; interpolated between evaluations):", "",
            *markdown_table(["b", *labels], body)]  # fmt: skip


def _verified_line(v: Verification) -> list[str]:
    computed = "-" if v.computed_time_s is None else _num(v.computed_time_s.mean)
    return [
        f"{v.device_type}{' (SIMULATED)' if v.simulated else ''}", v.target, cap_cell(v.power_cap_w), ", ".join(v.methods),
        f"{v.batch_size} @ {mhz_cell(v.frequency_hz)}", computed, _num(v.computed_time_for_run_s), _num(v.measured_time_s),
        _pct(v.time_error_pct), f"{v.samples_to_accuracy if v.samples_to_accuracy is not None else '-'} "
        f"/ {v.server_samples_to_accuracy if v.server_samples_to_accuracy is not None else '-'}",
        f"{v.samples_processed or '-'}", _num(v.device_time_s), v.reason or "",
    ]  # fmt: skip


def verification_table(verified: list[Verification]) -> list[str]:
    """The `--verify` fine-tunes next to the computed figures."""
    head = ["device", "target", "cap", "methods", "b @ MHz", "computed s (mean N_b)", "computed s (run's N_b)",
            "measured s (run's N_b)", "measured vs computed", "N_b device / server", "samples run", "device s to stop", "note"]  # fmt: skip
    return [
        "Verification: each configuration fine-tuned on the device to the target (seed "
        f"{verified[0].seed}); measured = device time per sample of the fine-tune x its own N_b, "
        "computed = T[b][f] / N_s x N_b:", "", *markdown_table(head, [_verified_line(v) for v in verified]),
    ]  # fmt: skip


def _achieved_line(a: Achieved) -> list[str]:
    return [
        f"{a.device_type}{' (SIMULATED)' if a.simulated else ''}", a.target, cap_cell(a.power_cap_w), a.evidence or "-",
        " -> ".join(a.configurations) or "-", str(len(a.switches)), _num(a.time_to_accuracy_s), _num(a.oracle_time_s),
        _pct(a.over_oracle_pct), _num(a.baseline1_time_s),
        "-" if a.speedup_vs_baseline1 is None else f"{a.speedup_vs_baseline1:.2f}x", a.reason or "",
    ]  # fmt: skip


def achieved_table(ran: list[Achieved]) -> list[str]:
    """edgetrain's own fine-tunes (`--verify`) next to the row's computed oracle and Baseline 1."""
    head = ["device", "target", "cap", "started from", "b @ MHz that ran", "switches", "achieved s (run's N_b)", "oracle s (computed)",
            "over oracle", "Baseline 1 s (computed)", "vs Baseline 1", "note"]  # fmt: skip
    lines = ["edgetrain run through the device workers as a user's job (the proxy's vector as the prior, the closed loop, "
             "what earlier fine-tunes on the data left): achieved = device time per sample x its own N_b:", "",
             *markdown_table(head, [_achieved_line(a) for a in ran])]  # fmt: skip
    switched = [f"- {a.device_type}, {cap_cell(a.power_cap_w)}, {a.target}: {s}" for a in ran for s in a.switches]
    return lines + (["", "Switches:", *switched] if switched else [])


def format_run(run: EvaluationRun) -> str:
    """One evaluation: title, what it was computed from, every table, the notes."""
    d = run.dispatched
    lines = [f"## {run.name or 'evaluation'}", ""]
    if any(r.simulated for r in run.rows):
        lines += ["Device figures are SIMULATED (twins): time, power and energy come from the twins' models; "
                  "accuracy and N_b come from real training.", ""]  # fmt: skip
    pretrained = f" (pre-trained, test accuracy {run.pretrain_test_accuracy:.3f})" if run.pretrain_test_accuracy is not None else ""
    lines += [
        f"Weights: {run.weights}{pretrained}. Wall time {run.wall_s:.0f} s; dispatched: pre-training {d.pretrain}, "
        f"estimations {d.estimations}, profiles {d.profiles}, fine-tunes {d.finetunes}.", "",
    ]  # fmt: skip
    lines += results_tables(run.rows)
    lines += ["", "Proxy sensitivity:"] + sensitivity_tables(run.sensitivity)
    if run.robustness:
        lines += ["", *robustness_lines(run.robustness)]
    lines += ["", *vector_table(run)]
    if run.achieved:
        lines += ["", *achieved_table(run.achieved)]
    if run.verification:
        lines += ["", *verification_table(run.verification)]
    if run.notes:
        lines += ["", "Notes:", *(f"- {n}" for n in run.notes)]
    return "\n".join(lines)
