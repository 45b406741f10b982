"""A cap that drops and rises while fine-tuning, on the Jetson Nano twin (SIMULATED figures).

The schedule 3.2 W -> 2.4 W -> 2.8 W (the changes at fixed device times, printed) is run, from
the same weights, data order and twin seed, by:

- adaptive: edgetrain's choice re-selected at each change (AdaptiveControl);
- best fixed: the best configuration feasible for the whole schedule (edgetrain's choice at
  the lowest cap), kept;
- baseline 1 re-pinned: Baseline 1's configuration re-selected at each change;
- adaptive + drift: the adaptive run on a twin drawing 10 % more power after DRIFT_AFTER
  steps, to show the power guard.

Every step really trains on this CPU (accuracy is real); device time and power come from
the twin. The table is a grid profile by the real profiling code, the relation vector is
estimated on the proxy (digits) as a job would. Prints a table of time to the target, energy,
time over the cap (in all, and the longest stretch), guard step-downs and switches, and
writes JSON and, with --plot, a timeline of the adaptive + drift run.

    python bench/adaptive_caps.py [--json OUT.json] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.devices.twin_spec import PowerDrift
from edgetrain.common.estimation import estimate_in_process
from edgetrain.common.finetune.adaptive import AdaptiveControl, CapFollower
from edgetrain.common.models import get_model
from edgetrain.common.presets import quick_job
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import DeviceTarget, JobSpec, LearningRatePolicy, ProfileTable, RelationVector
from edgetrain.common.selection import Baseline1, Fixed, Robust, Strategy, estimated_time_to_accuracy_s
from edgetrain.common.training import Trainer, make_optimizer, train_to_accuracy
from edgetrain.common.workload import measure_workload

TWIN = "jetson-nano"
CAPS_W = (3.2, 2.4, 2.8)  # smallcnn draws 2.2-3.2 W on the Nano twin at b <= 16: these caps bind, 6 W would not
DRIFT_AFTER, DRIFT_FACTOR = 20, 1.10
SEED = 0
Trace = list[tuple[float, float | None, float, int, int]]


@dataclass
class Run:
    name: str
    reached: bool
    device_time_s: float
    energy_j: float
    samples: int
    over_cap_s: float
    longest_over_cap_s: float
    step_downs: int
    switches: int
    paused_s: float
    peak_power_w: float
    trace: Trace
    history: list[tuple[int, float]]


def longest_over_cap_s(trace: Trace) -> float:
    """The longest stretch of consecutive measured regions over the cap in force (s of device time)."""
    longest = current = 0.0
    last_t = 0.0
    for t, cap, power, _, _ in trace:
        current = current + (t - last_t) if cap is not None and power > cap else 0.0
        longest, last_t = max(longest, current), t
    return longest


def fine_tune(name: str, spec: JobSpec, table: ProfileTable, strategy: Strategy, target: DeviceTarget,
              drift: PowerDrift | None = None) -> Run:  # fmt: skip
    """One fine-tune of the job's device under `target`'s schedule, re-selecting with `strategy`."""
    twin = load_twin(TWIN)
    device = SimulatedDevice(twin.model_copy(update={"power_drift": drift}), seed=SEED)
    entry = get_model(spec.model)
    data = load_dataset(spec.dataset, entry, 0)
    model = initial_model(spec.model, spec.weights, data.num_classes)
    device.bind_workload(measure_workload(spec.model, model, entry.example_input(data.num_classes)))
    first = strategy.choose(table, target.cap_at(0))
    trainer = Trainer(model, make_optimizer(model, spec.lr, first.batch_size), first.batch_size, data.train, data.test, SEED)
    device.set_frequency(first.frequency_hz)
    trace: Trace = []
    control = AdaptiveControl(device, trainer, spec.lr, table, strategy, CapFollower(target, lambda: None),
                              target.cap_at(0), first.frequency_hz, trace=trace)  # fmt: skip
    outcome, totals = train_to_accuracy(trainer, spec.target_accuracy, spec.eval_every_samples, spec.max_samples, SEED,
                                        device, control=control)  # fmt: skip
    guard = control.guard.report
    return Run(
        name=name, reached=outcome.reached, device_time_s=totals.elapsed_s, energy_j=totals.energy_j,
        samples=trainer.samples, over_cap_s=guard.over_cap_s, longest_over_cap_s=longest_over_cap_s(trace),
        step_downs=guard.step_downs, switches=len(control.switches), paused_s=control.paused_s,
        peak_power_w=guard.peak_power_w, trace=trace, history=totals.history,
    )  # fmt: skip


def estimate_vector(spec: JobSpec) -> RelationVector:
    """The job's relation vector, estimated on its proxy as the server workers would."""
    return estimate_in_process(spec.estimation_request())


def plot_timeline(run: Run, path: Path) -> None:
    """Cap, measured power, frequency, batch size and accuracy against device time."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    t = [p[0] for p in run.trace]
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(9, 8), constrained_layout=True)
    axes[0].plot(t, [p[2] for p in run.trace], lw=0.6, color="tab:orange", label="measured peak power (W)")
    axes[0].step(t, [p[1] for p in run.trace], where="post", color="black", label="cap (W)")
    axes[0].set_ylabel("W")
    axes[0].legend(loc="lower left", fontsize=8)
    axes[1].step(t, [p[3] / 1e6 for p in run.trace], where="post")
    axes[1].set_ylabel("GPU MHz")
    axes[2].step(t, [p[4] for p in run.trace], where="post", color="tab:green")
    axes[2].set_ylabel("batch size")
    samples_at = _device_time_of_samples(run)
    axes[3].plot([samples_at.get(s, 0.0) for s, _ in run.history], [a for _, a in run.history], marker=".")
    axes[3].set_ylabel("test accuracy")
    axes[3].set_xlabel("device time (s, SIMULATED: Jetson Nano twin)")
    fig.suptitle(f"{run.name}: schedule {' -> '.join(f'{c:g} W' for c in CAPS_W)} (SIMULATED)")
    fig.savefig(path, dpi=120)


def _device_time_of_samples(run: Run) -> dict[int, float]:
    """Device time (s) at which each sample count was reached, from the trace's batch sizes."""
    at, samples = {0: 0.0}, 0
    for t, _, _, _, b in run.trace:
        samples += b
        at.setdefault(samples, t)
    return at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write the timeline of the adaptive + drift run here (PNG)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    spec = JobSpec.model_validate(quick_job([{"device_id": "nano", "power_cap_w": CAPS_W[0]}]))
    device = SimulatedDevice(load_twin(TWIN), seed=SEED)
    entry = get_model(spec.model)
    table = profile(device, entry, spec.batch_sizes, spec.profiling, LearningRatePolicy(optimizer=entry.optimizer))
    vector = estimate_vector(spec)
    first = Robust(vector).choose(table, CAPS_W[0])
    expected_s = estimated_time_to_accuracy_s(table, vector, first) or 60.0
    times = (0.0, float(f"{0.25 * expected_s:.3g}"), float(f"{0.6 * expected_s:.3g}"))
    schedule = [[t, c] for t, c in zip(times, CAPS_W)]
    target = DeviceTarget(device_id="nano", power_cap_w=CAPS_W[0], power_cap_schedule=schedule)
    fixed = Robust(vector).choose(table, min(CAPS_W))
    runs = [
        fine_tune("adaptive", spec, table, Robust(vector), target),
        fine_tune(
            f"best fixed (b={fixed.batch_size}, {fixed.frequency_hz / 1e6:g} MHz)",
            spec,
            table,
            Fixed(vector, fixed.batch_size, fixed.frequency_hz),
            target,
        ),  # fmt: skip
        fine_tune("baseline 1 re-pinned", spec, table, Baseline1(vector, device.power_envelope_w), target),
        fine_tune(
            f"adaptive + drift x{DRIFT_FACTOR:g} after {DRIFT_AFTER} steps",
            spec,
            table,
            Robust(vector),
            target,
            PowerDrift(after_steps=DRIFT_AFTER, factor=DRIFT_FACTOR),
        ),  # fmt: skip
    ]
    print(f"SIMULATED: {TWIN} twin, {spec.model} on {spec.dataset.name} to {spec.target_accuracy:.0%}; "
          f"cap schedule {schedule} (s of device time, W)")  # fmt: skip
    print(f"{'run':<40} {'reached':>7} {'time to target':>15} {'energy':>9} {'over cap':>9} {'longest':>8} "
          f"{'step-downs':>10} {'switches':>8} {'paused':>7} {'peak W':>7}")  # fmt: skip
    for r in runs:
        print(f"{r.name:<40} {str(r.reached):>7} {r.device_time_s:>13.1f} s {r.energy_j:>7.0f} J {r.over_cap_s:>7.2f} s "
              f"{r.longest_over_cap_s:>6.2f} s {r.step_downs:>10} {r.switches:>8} {r.paused_s:>5.0f} s {r.peak_power_w:>7.2f}")  # fmt: skip
    adaptive = runs[0]
    for other in runs[1:3]:
        print(f"adaptive vs {other.name}: {other.device_time_s / adaptive.device_time_s:.2f}x faster to the target")
    print(f"wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        rows = [{k: v for k, v in vars(r).items() if k not in ("trace", "history")} for r in runs]
        args.json.write_text(json.dumps({"simulated": True, "twin": TWIN, "schedule": schedule, "runs": rows}, indent=2))
    if args.plot:
        plot_timeline(runs[-1], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
