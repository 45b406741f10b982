"""The estimators measured for the closed loop (docs/closed-loop.md), on smallcnn pre-trained on
Fashion-MNIST (60000 samples) and fine-tuned on the MNIST subset (real training, no device):

- warp: solo runs at each batch size (bench/runs.py's cached reference runs, no training
  here): the samples each needs to reach a test loss, over b=128's, against N_b / N_128;
- segments: one model trained in alternating segments at two batch sizes (A first), the ratio
  of their test-loss slopes (log loss per sample; each B segment against the A segments around
  it), with one Adam state or one per batch size, against N_A / N_B of the solo runs;
- noise: the gradient noise scale tr(Sigma) / |G|^2 online from consecutive steps' gradients
  (as adaptdl does with one replica), ratio of sums, along a solo run at b=128 and b=64.

    python -m bench.closed_loop_estimators warp|segments|noise
"""

from __future__ import annotations

import copy
import math
import statistics
import sys

import numpy as np
import torch

from bench.runs import ARTIFACTS, pretrained, reference_run
from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef, LearningRatePolicy
from edgetrain.common.training import Trainer, make_optimizer, set_batch_size

BATCHES = [128, 64, 32, 16, 8, 4]
LEVELS = [1.5, 1.0, 0.7, 0.5, 0.4, 0.33]  # test losses (nats)


def trainer(weights: str, dataset: dict, b: int, seed: int) -> Trainer:
    entry = get_model("smallcnn")
    data = load_dataset(DatasetRef(**dataset), entry, 0)
    net = initial_model("smallcnn", weights, data.num_classes, ARTIFACTS)
    return Trainer(net, make_optimizer(net, LearningRatePolicy(), b), b, data.train, data.test, seed)


def samples_at(curve: list[list[float]], loss: float) -> float | None:
    previous = None
    for n, _, value in curve:
        if value <= loss:
            return n if previous is None else previous[0] + (previous[1] - loss) / (previous[1] - value) * (n - previous[0])
        previous = (n, value)
    return None


def warp(weights: str) -> None:
    for dataset in ({"name": "mnist5k"}, {"name": "digits"}):
        for seed in (0, 1):
            runs = {b: reference_run("smallcnn", weights, dataset, 0.93, b, seed) for b in BATCHES}
            print(f"{dataset['name']} seed {seed}: n_b(L) / n_128(L) for b = {BATCHES[1:]}")
            for level in LEVELS:
                base = samples_at(runs[128]["curve"], level)
                ratios = [samples_at(runs[b]["curve"], level) for b in BATCHES[1:]]
                print(f"  L={level}: " + " ".join(f"{r / base:.2f}" if r and base else "-" for r in ratios))
            n = {b: runs[b]["outcome"]["samples_to_accuracy"] for b in BATCHES}
            print("  N_b / N_128:", " ".join(f"{n[b] / n[128]:.2f}" for b in BATCHES[1:]))


def alternate(weights: str, a: int, b: int, segment: int, total: int, seed: int, per_batch_state: bool) -> list[tuple[int, float, int]]:
    """(samples, log test loss, batch size of the interval before) at every 256 samples."""
    t = trainer(weights, {"name": "mnist5k"}, a, seed)
    t.evaluate()
    points, states, running, switch_at = [(0, math.log(t.test_loss or 1.0), a)], {}, a, 512 + segment
    next_eval = 256
    while t.samples < total:
        t.step()
        if t.samples >= next_eval:
            t.evaluate()
            points.append((t.samples, math.log(t.test_loss or 1.0), running))
            next_eval = t.samples + 256
            if t.samples >= switch_at:
                if per_batch_state:
                    states[running] = copy.deepcopy(t.optimizer.state_dict())
                running = b if running == a else a
                if per_batch_state and running in states:
                    t.optimizer.load_state_dict(states[running])
                set_batch_size(t, LearningRatePolicy(), running)
                switch_at = t.samples + segment
    return points


def slope_ratios(points: list[tuple[int, float, int]], a: int, b: int, second_half: bool) -> list[float]:
    """Per B segment with A segments on both sides (and A with B around it, inverted): the
    ratio of its log-loss slope to theirs, interpolated at its middle."""
    segments: list[tuple[int, list[tuple[int, float]]]] = []
    for (n0, y0, _), (n1, y1, batch) in zip(points, points[1:]):
        if not segments or segments[-1][0] != batch:
            segments.append((batch, [(n0, y0)]))
        segments[-1][1].append((n1, y1))

    def slope(pts: list[tuple[int, float]]) -> tuple[float, float]:
        pts = pts[len(pts) // 2 :] if second_half else pts
        n, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        return -float(np.polyfit(n, y, 1)[0]), float(n.mean())

    ratios = []
    for before, (batch, pts), after in zip(segments, segments[1:], segments[2:]):
        if before[0] != after[0] or before[0] == batch or pts[0][0] < 512:
            continue
        s, m = slope(pts)
        (s0, m0), (s1, m1) = slope(before[1]), slope(after[1])
        around = s0 + (s1 - s0) * (m - m0) / (m1 - m0)
        if s > 0 and around > 0:
            ratios.append((s / around) if batch == b else (around / s))
    return ratios


def segments(weights: str) -> None:
    truth = {b: statistics.fmean(reference_run("smallcnn", weights, {"name": "mnist5k"}, 0.93, b, s)["outcome"]["samples_to_accuracy"]
                                 for s in (0, 1)) for b in BATCHES}  # fmt: skip
    designs = [
        ("1024 samples, one Adam state", 1024, False, False, 8704),
        ("1024 samples, Adam state per batch size", 1024, True, False, 10752),
        ("4096 samples, per batch size, second halves", 4096, True, True, 20992),
    ]
    for name, length, per_b, half, total in designs:
        print(name)
        for a, b in ((128, 64), (128, 32), (64, 32)):
            for seed in (0, 1):
                ratios = slope_ratios(alternate(weights, a, b, length, total, seed, per_b), a, b, half)
                mean = math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else float("nan")
                print(
                    f"  A={a} B={b} seed {seed}: B's progress per sample over A's {mean:.2f} ({len(ratios)} segments); "
                    f"solo N_A / N_B {truth[a] / truth[b]:.2f}; sqrt(A / B) {math.sqrt(a / b):.2f}",
                    flush=True,
                )


def noise(weights: str) -> None:
    for dataset, total in (({"name": "mnist5k"}, 24000), ({"name": "digits"}, 10000)):
        for b in (128, 64):
            t = trainer(weights, dataset, b, 0)
            params = list(t.model.parameters())
            previous, trace, signal, marks = None, 0.0, 0.0, []
            while t.samples < total:
                t.step()
                grads = [p.grad.detach().clone() for p in params if p.grad is not None]
                if previous is not None:
                    one, two = (sum(float(g.pow(2).sum()) for g in gs) for gs in (previous, grads))
                    mean = sum(float(((g + h) / 2).pow(2).sum()) for g, h in zip(previous, grads))
                    local = (one + two) / 2
                    trace, signal = trace + (local - mean) * 2 * b, signal + 2 * mean - local
                previous = grads
                if t.samples % 2048 < b:
                    marks.append(f"{t.samples // 1000}k:{trace / signal:.0f}" if signal > 0 else "inf")
            print(f"{dataset['name']} b={b}: noise scale (samples), ratio of sums so far: {' '.join(marks)}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"warp": warp, "segments": segments, "noise": noise}[sys.argv[1]](pretrained("smallcnn", "fashion_mnist", 60_000))
