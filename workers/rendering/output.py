"""Everything edgetrain prints for people: reports, progress, the fleet, lookup tables.

Results go to stdout; progress and notes go to stderr (`note`), so `--json` output and
pipes stay clean. Figures from simulated devices are labelled SIMULATED."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.federated.records import FederatedStatus
from edgetrain.common.jobs.reports import DeviceReport, JobReport
from edgetrain.common.jobs.state import JobStatus, JobSummary, PartState
from edgetrain.common.keys import table_id
from edgetrain.common.schemas import DeviceCap, DeviceInfo, ProfileTable, RelationVector, Selection
from edgetrain.common.store import LiveWorker

from .federated_output import federated_job_line
from .progress import part_line

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


def _choice(label: str, choice: Selection, estimate_s: float | None, control: ControlAxis) -> str:
    return (
        f"  {label}: b={choice.batch_size:<4} {control.describe(choice.frequency_hz):>12}  "
        f"estimated time to accuracy {_fmt(estimate_s, 's')}"
    )


BASELINE1_NOTE = ("baseline 1: what runs without edgetrain: the largest batch that fits in memory, at the highest frequency "
                  "whose full-load power (the board's, whatever the model) meets the cap")  # fmt: skip


def _watts(cap_w: float | None) -> str:
    return "none" if cap_w is None else f"{cap_w:g} W"


def _caps(d: DeviceReport) -> str:
    """The job's cap for the device, then each other cap in force while it fine-tuned (an
    `edgetrain cap`, a schedule's step) and from when (device s)."""
    in_force, changes = d.power_cap_w, []
    for switch in d.achieved.switches if d.achieved else []:
        if switch.power_cap_w != in_force:
            in_force = switch.power_cap_w
            changes.append(f"{_watts(in_force)} from {switch.device_time_s:.1f} s")
    return _watts(d.power_cap_w) + (f", then {', '.join(changes)}" if changes else "")


def _over(d: DeviceReport) -> str:
    """The verdict on the run's power against the cap in force when it was read."""
    run = d.achieved
    if not d.over_cap or run is None:
        return ""
    if run.guard.over_cap_w is not None:
        return (f"; a reading of {run.guard.peak_over_cap_w:.3g} W was ABOVE the {run.guard.over_cap_w:g} W cap in force then "
                f"({_fmt(run.guard.over_cap_s, 's')} over it)")  # fmt: skip
    return f" ABOVE the {_watts(d.power_cap_w)} cap"


def _headline(d: DeviceReport, control: ControlAxis) -> list[str]:
    """The configuration the fine-tune runs and its estimate; the plan beside it, and why the
    device chose otherwise, when it did."""
    assert d.selection is not None
    if d.started is None:
        return [_choice("edgetrain ", d.selection, d.estimated_time_to_accuracy_s, control)] + (
            [f"              {d.selection.note}"] if d.selection.note else []
        )
    started = d.started
    plan = d.selection
    return [
        _choice("edgetrain ", started.selection, started.estimated_time_to_accuracy_s, control) + f"  ({started.vector})",
        f"              chosen on the device at its first step: {started.selection.note or 'no reason given'}",
        f"              planned b={plan.batch_size} {control.describe(plan.frequency_hz)}, estimated time to accuracy "
        f"{_fmt(d.estimated_time_to_accuracy_s, 's')} with the proxy's r_b",
    ]


def _achieved(d: DeviceReport, target_accuracy: float) -> list[str]:
    run = d.achieved
    assert run is not None
    clock = "the twin's clock" if run.simulated else "measured on the device"
    over = _over(d)
    lines = [
        f"  achieved  : accuracy {run.final_accuracy:.3f} "
        f"({'reached' if run.reached else f'target {target_accuracy:g} not reached'}) after {run.samples_processed} samples",
        f"              device time {_fmt(run.device_time_s, 's')} ({clock}), energy {_fmt(run.energy_j, 'J')}, "
        f"peak power {_fmt(run.peak_power_w, 'W')}{over}; wall time on the worker {run.wall_s:.0f} s",
    ]
    if run.attempts > 1:
        lines.append(f"              {run.attempts} attempts: the lost ones cost {_fmt(run.lost_device_time_s, 's')} "
                     f"and {_fmt(run.lost_energy_j, 'J')} more")  # fmt: skip
    guard = run.guard
    if guard.step_downs or guard.over_cap_s:
        lines.append(f"              power guard: {guard.step_downs} step-down(s), {guard.step_ups} back up; "
                     f"{_fmt(guard.over_cap_s, 's')} over the cap, highest reading {_fmt(guard.peak_power_w, 'W')}")  # fmt: skip
    if run.paused_s:
        lines.append(f"              paused {_fmt(run.paused_s, 's')} at idle clocks: no configuration met the cap")
    if run.learned is not None:
        lines.append(f"  learned   : {run.learned.summary}")
    if run.exploration is not None:
        lines.append(f"  explored  : {run.exploration.line()}")
        lines.append(f"              {run.exploration.note}")
    if run.switches:
        lines.append("  switches  : (device time, cause, cap: old -> new)")
        lines += [f"              {switch.line()}" for switch in run.switches]
    return lines


def format_report(report: JobReport) -> str:
    """A job's result per device; simulated figures are labelled, device time (the device's
    or the twin's clock) apart from the wall time the worker took."""
    lines = [f"job {report.job_id}: {report.state.value}"]
    for d in report.devices:
        lines.append(f"\n{d.device_id} [{d.device_type or '?'}] power cap {_caps(d)}{SIMULATED_NOTE if d.simulated else ''}")
        if d.state in (PartState.failed, PartState.cancelled):
            lines.append(f"  {d.state.value}: {d.reason}")
            continue
        if d.selection is None:
            lines.append(f"  {d.state.value}")
            continue
        control = d.control or ControlAxis.GPU_CLOCK_HZ
        lines += _headline(d, control)
        base, base_s = (d.started.baseline1, d.started.baseline1_estimated_time_to_accuracy_s) if d.started else (
            d.baseline1, d.baseline1_estimated_time_to_accuracy_s)  # fmt: skip
        if base:
            speedup = d.estimated_speedup_vs_baseline1
            lines.append(_choice("baseline 1", base, base_s, control) + (f"  (estimated speed-up {speedup:.2f}x)" if speedup else ""))
        if d.state == PartState.queued:
            behind = f" behind job {d.behind} (fine-tuning there now)" if d.behind else ""
            lines.append(f"  queued on the device{behind}")
        if d.achieved:
            lines += _achieved(d, report.spec.target_accuracy)
    if any(d.baseline1 for d in report.devices):
        lines += ["", BASELINE1_NOTE]
    return "\n".join(lines)


def format_status(status: JobStatus) -> str:
    """A job's report, then what each device does now, notes on stalled queues, the events."""
    lines = [format_report(JobReport.from_status(status)), "", status.counts_line()]
    if status.shown:
        lines.append(f"shown: {status.shown}")
    if not status.finished:
        lines += ["", "now:"] + [f"  {d}: {part_line(status, d)}" for d in status.parts]
    if estimation := status.preparation.estimation:
        lines += ["", f"relation vector {estimation.vector_key}: {estimation.line()}"]
        lines += [f"  {run.line(estimation.target_accuracy)}" for run in estimation.runs]
    lines += [f"note: {n}" for n in status.notes]
    lines.append("events:\n  " + "\n  ".join(e.line() for e in status.events))
    return "\n".join(lines)


def format_jobs(jobs: list[JobSummary], federated: list[FederatedStatus], limit: int) -> str:
    """One line per job, federated or not, newest first (at most `limit`); a job with a device
    that did not reach the target says so, one with failed parts names one and why."""
    lines = [(j.created_at, _job_line(j)) for j in jobs] + [(f.record.created_at, federated_job_line(f)) for f in federated]
    return "\n".join(line for _, line in sorted(lines, key=lambda at_line: at_line[0], reverse=True)[:limit]) or "no jobs"


def _job_line(j: JobSummary) -> str:
    line = f"{j.job_id}  {j.state.value:<10} {j.model:<18} {j.devices:>4} device(s)  submitted {j.created_at:%Y-%m-%d %H:%M:%S}"
    if j.not_reached:
        line += f"  target not reached on {j.not_reached} of {j.devices}"
    if j.failed:
        line += f"  {j.failed} of {j.devices} failed, e.g. {j.failure}" if j.failed > 1 else f"  failed: {j.failure}"
    return line


def format_fleet(devices: list[DeviceInfo], workers: list[LiveWorker], caps: dict[str, DeviceCap]) -> str:
    """The registered devices, with the cap set on each by `edgetrain cap` (`caps`), then the
    live workers (role, node, queues, host, last heartbeat)."""
    lines = [f"devices ({len(devices)} registered):"] if devices else ["no devices registered"]
    for d in devices:
        freqs = f"{len(d.frequencies_hz)} frequencies {d.frequencies_hz[0] / 1e6:.0f}-{d.frequencies_hz[-1] / 1e6:.0f} MHz"
        sim = " SIMULATED" if d.simulated else ""
        cap = caps.get(d.device_id)
        set_cap = f"; cap {_watts(cap.power_cap_w)} set {cap.set_at:%Y-%m-%d %H:%M:%S} UTC (`edgetrain cap`)" if cap else ""
        lines.append(
            f"  {d.device_id:<16} {d.device_type:<20} {d.backend:<7}{sim}  {freqs}, "
            f"{d.memory_bytes / 2**30:.1f} GiB, heartbeat {d.heartbeat_at:%H:%M:%S}{set_cap}"
        )
    lines.append(f"workers ({len(workers)} live):" if workers else "no live workers")
    lines += [f"  {w.role:<8} {w.node:<32} queues {','.join(w.queues):<20} host {w.hostname} pid {w.pid}, "
              f"heartbeat {w.heartbeat_at:%H:%M:%S}" for w in workers]  # fmt: skip
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


def format_vector(vector: RelationVector) -> str:
    """A relation vector as a table: N_b (mean ± std over seeds) and r_b per batch size."""
    lines = [f"relation vector {vector.key or '?'} (N_b resolution {vector.resolution_samples} samples)",
             f"{'b':>6} {'N_b (samples)':>20} {'r_b':>8}"]  # fmt: skip
    for b in vector.batch_sizes:
        mean, std, ratio = vector.samples_for(b), vector.samples_std_for(b), vector.ratio(b)
        n_b = "censored" if mean is None else f"{mean:.0f} ± {std or 0:.0f}"
        lines.append(f"{b:>6} {n_b:>20} {'-' if ratio is None else f'{ratio:.3f}':>8}")
    lines.append(f"numbers from: {vector_source(vector)}")
    return "\n".join(lines)


def vector_source(vector: RelationVector) -> str:
    """Where a vector's numbers come from, in one line."""
    if vector.provenance is not None:
        return f"{vector.provenance.source}: {vector.provenance.summary}"
    request = vector.request
    if request is None:
        return "proxy runs (not recorded which)"
    seeds = len(request.seeds)
    return (f"proxy: {request.proxy_dataset.name} to {request.target_accuracy:g} on the server pool, "
            f"{len(request.batch_sizes)} batch sizes x {seeds} seed{'s' if seeds > 1 else ''} from {request.weights}")  # fmt: skip


def format_data_status(result: dict[str, bool | str]) -> str:
    """`edgetrain data status`: one line per dataset."""
    return "\n".join(f"{k:<14} {'ok' if v is True else v}" for k, v in result.items())


def format_data_fetch(result: dict[str, dict[str, str | float]]) -> str:
    """`edgetrain data fetch`: one line per dataset."""
    return "\n".join(f"{name:<14} {r['status']:<8} {r.get('path') or r.get('error')}" for name, r in result.items())
