"""Profiling cost on the simulated Jetson twins: staircase vs full grid, and profiling time
as a share of the fine-tuning time to accuracy it serves.

For every twin x model, the full grid and the staircase at a low and a mid power cap are
profiled by the real profiling code (`common.profiling.profile`: every warm-up and measured
step really runs on this CPU; device time and power come from the twin, so they are
SIMULATED). The profiling device time is the sum of the twin's time over all those steps,
read by a proxy around the device. The selection of eq. (4) is computed from both tables
and compared. The fine-tuning time it serves is eq. (2) on the twin,
T[b*][f*] * N_b / N_s, where N_b is measured by really training the model with b* at
reduced scale (FINETUNE_* below).

    python bench/profiling_cost.py [--models resnet18 mobilenet_v2 smallcnn] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from edgetrain.common.devices.base import Device, Measurement
from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.estimation import aggregate, train_proxy
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import (
    PAPER_BATCH_SIZES,
    DatasetRef,
    EstimationRequest,
    LearningRatePolicy,
    ProfileTable,
    ProfilingOptions,
    RelationVector,
)
from edgetrain.common.selection import Equation4

CAPS_W = {"jetson-nano": (4.0, 5.0), "jetson-tx2-nx": (5.0, 6.0)}  # low and mid board power caps
MODELS = ("resnet18", "mobilenet_v2", "smallcnn")
LR = LearningRatePolicy()  # Adam, 5e-4 at b=128, square-root scaling
# Reduced-scale fine-tuning for N_b: from a seeded initialisation on the MNIST subset (4000 train /
# 1000 test images); MobileNetV2 learns slowly from scratch, so its target is lower.
FINETUNE_DATASET = "mnist5k"
FINETUNE_WEIGHTS = "init:0"
FINETUNE_TARGETS = {"resnet18": 0.90, "mobilenet_v2": 0.70, "smallcnn": 0.90}
EVAL_EVERY_SAMPLES = 512  # the job spec's default: N_b resolution
MAX_SAMPLES = 16384
PROXY_DATASET, PROXY_TARGET, PROXY_EVAL_EVERY = "digits", 0.90, 64  # smallcnn's relation vector
STORED_VECTORS = Path(__file__).parent / "results" / "relation_vectors.json"
PAPER_NANO_RESNET18_S = (4032, 9292)  # docs/method.md: the paper's ResNet18 times to accuracy on the Nano ("Ours")


class CostMeter:
    """A Device proxy that sums the device seconds of every step run through it (warm-up too)."""

    def __init__(self, device: Device):
        self._device = device
        self.device_s = 0.0
        self.steps = 0

    def __getattr__(self, name: str):
        return getattr(self._device, name)

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        m = self._device.run_steps(step, batch_size, steps)
        self.device_s += m.elapsed_s
        self.steps += m.steps
        return m


@dataclass
class Profiled:
    table: ProfileTable
    device_s: float  # simulated device time of all profiling steps (s)
    wall_s: float  # wall time on this CPU (s)


def run_profile(twin: str, model: str, mode: str, power_cap_w: float | None) -> Profiled:
    meter = CostMeter(SimulatedDevice(load_twin(twin), seed=0))
    started = time.perf_counter()
    table = profile(meter, get_model(model), PAPER_BATCH_SIZES, ProfilingOptions(mode=mode), LR, power_cap_w)
    return Profiled(table, meter.device_s, time.perf_counter() - started)


def request(model: str, dataset: str, target: float, eval_every: int, batch_sizes: list[int]) -> EstimationRequest:
    return EstimationRequest(
        model=model, weights=FINETUNE_WEIGHTS, proxy_dataset=DatasetRef(name=dataset), target_accuracy=target,
        batch_sizes=batch_sizes, seeds=[0], lr=LR, eval_every_samples=eval_every, max_samples=MAX_SAMPLES,
    )  # fmt: skip


def relation_vector(model: str) -> tuple[RelationVector, str]:
    """smallcnn: measured now on the proxy; resnet18: the stored bench vector; otherwise r_b = 1."""
    if model == "smallcnn":
        req = request(model, PROXY_DATASET, PROXY_TARGET, PROXY_EVAL_EVERY, PAPER_BATCH_SIZES)
        vector = aggregate(req, [train_proxy(req, b, 0) for b in req.batch_sizes])
        return vector, f"measured now ({FINETUNE_WEIGHTS} on {PROXY_DATASET} to {PROXY_TARGET:.0%}, 1 seed)"
    stored = json.loads(STORED_VECTORS.read_text()) if STORED_VECTORS.is_file() else []
    for entry in stored:
        if entry["model"] == model:
            return RelationVector.model_validate(entry["vector"]), f"stored in bench/results/{STORED_VECTORS.name}"
    ones = RelationVector(batch_sizes=PAPER_BATCH_SIZES, ratios=[1.0] * len(PAPER_BATCH_SIZES))
    return ones, "r_b = 1 for all b (no relation vector measured)"


@cache
def samples_to_accuracy(model: str, batch_size: int) -> int | None:
    """N_b: samples until the target accuracy, really training with `batch_size` (reduced scale)."""
    req = request(model, FINETUNE_DATASET, FINETUNE_TARGETS[model], EVAL_EVERY_SAMPLES, [batch_size])
    return train_proxy(req, batch_size, 0).samples_to_accuracy


def objective_on(table: ProfileTable, vector: RelationVector, b: int, f: int) -> float:
    """T[b][f] * r_b read from `table` (s)."""
    return table.time_s[table.batch_sizes.index(b)][table.frequencies_hz.index(f)] * vector.ratio(b)


def compare(twin: str, model: str, cap: float, grid: Profiled, stair: Profiled, vector: RelationVector) -> dict:
    """One row: costs of both profiles, their selections under `cap`, and their shares of fine-tuning."""
    chosen = Equation4(vector).choose(grid.table, cap)
    from_stair = Equation4(vector).choose(stair.table, cap)
    b, f = chosen.batch_size, chosen.frequency_hz
    # the staircase's choice timed on the grid: how much slower it is than the grid's choice (noise)
    loss_pct = 100 * (objective_on(grid.table, vector, from_stair.batch_size, from_stair.frequency_hz) / chosen.estimated_time_s - 1)
    t_ns = objective_on(grid.table, vector, b, f) / vector.ratio(b)
    n_b = samples_to_accuracy(model, b)
    finetune_s = None if n_b is None else t_ns * n_b / grid.table.samples  # eq. (2), simulated
    return {
        "device_type": twin, "model": model, "power_cap_w": cap, "simulated": True,
        "points_staircase": stair.table.points_measured, "points_grid": grid.table.points_measured,
        "profiling_device_s_staircase": stair.device_s, "profiling_device_s_grid": grid.device_s,
        "wall_s_staircase": stair.wall_s, "wall_s_grid": grid.wall_s,
        "selection": [b, f], "selection_staircase": [from_stair.batch_size, from_stair.frequency_hz],
        "same_selection": (b, f) == (from_stair.batch_size, from_stair.frequency_hz),
        "staircase_choice_slower_pct": loss_pct,
        "samples_to_accuracy": n_b, "finetune_device_s": finetune_s,
        "staircase_pct": None if finetune_s is None else 100 * stair.device_s / finetune_s,
        "grid_pct": None if finetune_s is None else 100 * grid.device_s / finetune_s,
        "staircase_equivalent_samples": stair.device_s / t_ns * grid.table.samples,
    }  # fmt: skip


HEADER = (
    f"{'device':<14} {'model':<13} {'cap W':>5} | {'points':>9} | {'profiling device s':>18} | {'wall s (CPU)':>13} | "
    f"{'selection':<16} {'staircase choice':<22} | {'N_b':>5} | {'fine-tune s':>11} | {'profiling %':>13} | {'staircase as':>12}"
)
SUBHEADER = (
    f"{'':<34} | {'st / grid':>9} | {'st / grid (SIM)':>18} | {'st / grid':>13} | {'(b, MHz), grid':<16} {'vs the grid':<22} | "
    f"{'':>5} | {'(SIM)':>11} | {'st / grid':>13} | {'samples':>12}"
)


def num(v: float) -> str:
    """3 significant digits, without exponents for large values."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def fmt_row(r: dict) -> str:
    b, f = r["selection"]
    bs, fs = r["selection_staircase"]
    stair = "same" if r["same_selection"] else f"b={bs} f={fs / 1e6:g} {r['staircase_choice_slower_pct']:+.1f}%"
    n_b = "cens." if r["samples_to_accuracy"] is None else str(r["samples_to_accuracy"])
    ft = "-" if r["finetune_device_s"] is None else num(r["finetune_device_s"])
    pct = "-" if r["staircase_pct"] is None else f"{num(r['staircase_pct'])} / {num(r['grid_pct'])}"
    return (
        f"{r['device_type']:<14} {r['model']:<13} {r['power_cap_w']:>5.1f} | {r['points_staircase']:>3} / {r['points_grid']:<3} | "
        f"{num(r['profiling_device_s_staircase']):>7} / {num(r['profiling_device_s_grid']):<8} | "
        f"{r['wall_s_staircase']:>5.1f} / {r['wall_s_grid']:<5.1f} | {f'b={b} f={f / 1e6:g}':<16} {stair:<22} | "
        f"{n_b:>5} | {ft:>11} | {pct:>13} | {r['staircase_equivalent_samples']:>12.0f}"
    )


def span(values: list[float], fmt: Callable[[float], str] = num) -> str:
    """'lo-hi' (or one value) formatted by `fmt`; 'n/a' when empty."""
    if not values:
        return "n/a"
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def summary(model: str, rows: list[dict]) -> str:
    """Lines for the README: ranges over the twins and caps."""
    shape = "x".join(map(str, get_model(model).input_shape))
    done = [r for r in rows if r["staircase_pct"] is not None]
    col = lambda key, rs=rows: [r[key] for r in rs]  # noqa: E731
    lines = [
        f"{model} ({shape}), SIMULATED twins: staircase profiling measures {span(col('points_staircase'), str)} of "
        f"{span(col('points_grid'), str)} points and costs {span(col('profiling_device_s_staircase'))} s of device time "
        f"(full grid {span(col('profiling_device_s_grid'))} s), as much as fine-tuning on "
        f"{span(col('staircase_equivalent_samples'), '{:.0f}'.format)} samples at the selected (b, f); at reduced scale "
        f"(N_b = {span(col('samples_to_accuracy', done), str)} samples to {FINETUNE_TARGETS[model]:.0%} on {FINETUNE_DATASET} "
        f"from {FINETUNE_WEIGHTS}) that is {span(col('staircase_pct', done))} % of the fine-tuning time "
        f"(grid {span(col('grid_pct', done))} %); staircase and grid select the same (b, f) in "
        f"{sum(col('same_selection'))}/{len(rows)} cases"
    ]
    nano = [r["profiling_device_s_staircase"] for r in rows if r["device_type"] == "jetson-nano"]
    if model == "resnet18" and nano:
        lo, hi = PAPER_NANO_RESNET18_S
        lines.append(
            f"  at the paper's scale (ResNet18 on a real Nano reached its targets in {lo}-{hi} s) the Nano twin's staircase "
            f"cost is {span([100 * s / hi for s in nano] + [100 * s / lo for s in nano], '{:.2g}'.format)} % (paper: at most 1.9 %)"
        )
    return "\n".join(lines)


def log(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:5.0f} s] {text}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--json", help="write every row and the settings to this file")
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    rows: list[dict] = []
    vectors: dict[str, str] = {}
    for model in args.models:
        vector, vectors[model] = relation_vector(model)
        for twin, caps in CAPS_W.items():
            grid = run_profile(twin, model, "grid", None)
            log(started, f"{twin} {model}: grid profiled")
            for cap in caps:
                rows.append(compare(twin, model, cap, grid, run_profile(twin, model, "staircase", cap), vector))
                log(started, f"{twin} {model}: staircase for {cap} W profiled, N_b measured")
    options = ProfilingOptions()
    print("SIMULATED: profiling device seconds, power and fine-tuning times come from the twins of the boards; wall seconds")
    print(f"are this CPU's (torch threads: {torch.get_num_threads()}), running the same real steps. Profiling: {options.warmup_batches} "
          f"warm-up + {options.measure_batches} measured steps per point, batch sizes {PAPER_BATCH_SIZES}, caps (W) {CAPS_W}.")  # fmt: skip
    print(f"N_b: really trained with b* from {FINETUNE_WEIGHTS} on {FINETUNE_DATASET} (4000 train / 1000 test images) to "
          f"{', '.join(f'{m} {t:.0%}' for m, t in FINETUNE_TARGETS.items())}, accuracy checked every {EVAL_EVERY_SAMPLES} "
          f"samples (reduced scale; the paper fine-tunes pre-trained models on 12500-22500 images).")  # fmt: skip
    print("relation vectors for the selection: " + "; ".join(f"{m}: {v}" for m, v in vectors.items()))
    print()
    print(HEADER)
    print(SUBHEADER)
    for r in rows:
        print(fmt_row(r))
    print()
    for model in args.models:
        print(summary(model, [r for r in rows if r["model"] == model]))
    total = time.perf_counter() - started
    print(f"\nbench wall time {total:.0f} s")
    if args.json:
        settings = {
            "caps_w": CAPS_W, "finetune": {"dataset": FINETUNE_DATASET, "weights": FINETUNE_WEIGHTS, "targets": FINETUNE_TARGETS,
            "eval_every_samples": EVAL_EVERY_SAMPLES, "max_samples": MAX_SAMPLES}, "vectors": vectors, "wall_s": total,
        }  # fmt: skip
        Path(args.json).write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
