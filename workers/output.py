"""Everything edgetrain prints for people: reports, progress, the fleet, lookup tables.

Results go to stdout; progress and notes go to stderr (`note`), so `--json` output and
pipes stay clean. Figures from simulated devices are labelled SIMULATED."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pydantic import BaseModel

from edgetrain.common.jobs import JobStatus, PartState
from edgetrain.common.keys import table_id
from edgetrain.common.reports import JobReport
from edgetrain.common.schemas import DeviceInfo, ProfileTable, Selection

SIMULATED_NOTE = " (SIMULATED device: time, power and energy come from its twin)"


def note(text: str) -> None:
    """A progress message or note for the person at the terminal (stderr)."""
    print(text, file=sys.stderr, flush=True)


def print_json(data: BaseModel | list[BaseModel] | dict[str, Any] | list[Any]) -> None:
    """`data` as indented JSON on stdout (pydantic models in their JSON form)."""
    if isinstance(data, BaseModel):
        print(data.model_dump_json(indent=2))
        return
    if isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    print(json.dumps(data, indent=2, default=str))


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.3g} {unit}"


def _choice(label: str, choice: Selection, estimate_s: float | None) -> str:
    return (
        f"  {label}: b={choice.batch_size:<4} f={choice.frequency_hz / 1e6:7.1f} MHz  "
        f"estimated time to accuracy {_fmt(estimate_s, 's')}"
    )


def format_report(report: JobReport) -> str:
    """A job's result per device; simulated figures are labelled."""
    lines = [f"job {report.job_id}: {report.state.value}"]
    for d in report.devices:
        cap = "none" if d.power_cap_w is None else f"{d.power_cap_w} W"
        lines.append(f"\n{d.device_id} [{d.device_type or '?'}] power cap {cap}{SIMULATED_NOTE if d.simulated else ''}")
        if d.state == PartState.failed:
            lines.append(f"  failed: {d.reason}")
            continue
        if d.selection is None:
            lines.append(f"  {d.state.value}")
            continue
        lines.append(_choice("edgetrain ", d.selection, d.estimated_time_to_accuracy_s))
        if d.baseline1:
            speedup = d.estimated_speedup_vs_baseline1
            lines.append(
                _choice("baseline 1", d.baseline1, d.baseline1_estimated_time_to_accuracy_s)
                + (f"  (estimated speed-up {speedup:.2f}x)" if speedup else "")
            )
        if run := d.achieved:
            lines.append(
                f"  achieved  : accuracy {run.final_accuracy:.3f} ({'reached' if run.reached else 'NOT reached'}) "
                f"after {run.samples_processed} samples; time to accuracy {_fmt(run.device_time_s, 's')}, "
                f"energy {_fmt(run.energy_j, 'J')}, peak power {_fmt(run.peak_power_w, 'W')}"
            )
    return "\n".join(lines)


def format_status(status: JobStatus) -> str:
    """A job's report, then its progress and event log."""
    lines = [format_report(JobReport.from_status(status))]
    for device_id, p in status.progress.items():
        lines.append(f"progress {device_id}: samples {p.samples}, accuracy {p.accuracy:.3f} (target {p.target_accuracy})")
    lines.append("events:\n  " + "\n  ".join(e.line() for e in status.events))
    return "\n".join(lines)


class ProgressPrinter:
    """Prints a line to stderr whenever a device's state or accuracy changes."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, status: JobStatus) -> None:
        """Print what changed since the last status."""
        for device_id, part in status.parts.items():
            progress = status.progress.get(device_id)
            line = part.state.value
            if progress and part.state in (PartState.finetuning, PartState.completed):
                line += f"  samples {progress.samples}  accuracy {progress.accuracy:.3f}"
            if self.seen.get(device_id) != line:
                self.seen[device_id] = line
                note(f"[{time.strftime('%H:%M:%S')}] {device_id}: {line}")


def format_fleet(devices: list[DeviceInfo]) -> str:
    """One line per registered device."""
    if not devices:
        return "no devices registered"
    lines = []
    for d in devices:
        freqs = f"{len(d.frequencies_hz)} frequencies {d.frequencies_hz[0] / 1e6:.0f}-{d.frequencies_hz[-1] / 1e6:.0f} MHz"
        sim = " SIMULATED" if d.simulated else ""
        lines.append(
            f"{d.device_id:<16} {d.device_type:<20} {d.backend:<7}{sim}  {freqs}, "
            f"{d.memory_bytes / 2**30:.1f} GiB, heartbeat {d.heartbeat_at:%H:%M:%S}"
        )
    return "\n".join(lines)


def format_selection(choice: Selection) -> str:
    """One line: the chosen configuration and its estimate."""
    return (
        f"batch size {choice.batch_size}, GPU frequency {choice.frequency_hz} Hz ({choice.frequency_hz / 1e6:.1f} MHz), "
        f"estimated time {choice.estimated_time_s:.3f} s, peak power {_fmt(choice.peak_power_w, 'W')}"
    )


def describe_table(table: ProfileTable) -> str:
    """One line: which table, how it was profiled, how much of it was measured."""
    tid = table_id(table.device_type or "?", table.model or "?", table.input_shape or [])
    mode = f"staircase for cap {table.power_cap_w} W" if table.mode == "staircase" else "grid"
    total = len(table.batch_sizes) * len(table.frequencies_hz)
    origin = "SIMULATED (figures from a twin)" if table.simulated else "measured on the device"
    return (
        f"table {tid}: {mode}, {table.measured_points()} of {total} points measured, "
        f"b_mem = {table.max_batch_size}, N_s = {table.samples} samples, "
        f"created {table.created_at:%Y-%m-%d %H:%M:%S %Z}, {origin}"
    )


def format_table(table: ProfileTable) -> str:
    """Both lookup tables as text grids, '-' for unmeasured points."""
    limit = table.max_batch_size
    header = "b \\ f MHz" + "".join(f"{f / 1e6:>9g}" for f in table.frequencies_hz)
    lines = [describe_table(table)]
    for name, values, fmt in (
        ("peak board power P[b][f] (W)", table.peak_power_w, ".2f"),
        (f"time T[b][f] for N_s = {table.samples} samples (s)", table.time_s, ".4g"),
    ):
        lines += ["", name, header]
        for b, row in zip(table.batch_sizes, values):
            cells = "".join(f"{'-' if v is None else format(v, fmt):>9}" for v in row)
            lines.append(f"{b:>9}{cells}" + ("  does not fit in memory" if limit is not None and b > limit else ""))
    return "\n".join(lines)


def format_data_status(result: dict[str, bool | str]) -> str:
    """`edgetrain data status`: one line per dataset."""
    return "\n".join(f"{k:<14} {'ok' if v is True else v}" for k, v in result.items())


def format_data_fetch(result: dict[str, dict[str, str | float]]) -> str:
    """`edgetrain data fetch`: one line per dataset."""
    return "\n".join(f"{name:<14} {r['status']:<8} {r.get('path') or r.get('error')}" for name, r in result.items())
