"""Throughput of edgetrain's training loop against a bare PyTorch loop (same model, batch,
data, optimizer), measured side by side in alternating rounds. Target: ratio >= 0.95.

    python bench/training_throughput.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef, LearningRatePolicy
from edgetrain.common.training import Trainer, make_optimizer, torch_device, train_to_accuracy

EVAL_SAMPLES = 64
CASES = [("smallcnn", 64, 60), ("resnet18", 32, 12)]  # model, batch size, steps per round


def bare_loop(model, optimizer, x, y, test_x, test_y, batch_size: int, steps: int, seed: int) -> float:
    """The loop a user would write: shuffle, slice, forward, loss, backward, step; then
    the accuracy on the test samples."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cursor = 0
    for _ in range(steps):
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(y)), 0
        idx = order[cursor : cursor + batch_size].to(x.device)
        cursor += batch_size
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return (model(test_x).argmax(-1) == test_y).float().mean().item()


def measure(name: str, batch_size: int, steps: int, rounds: int) -> dict:
    entry = get_model(name)
    data = load_dataset(DatasetRef(name="mnist5k"), entry, 0)
    test = TensorDataset(*(t[:EVAL_SAMPLES] for t in data.test.tensors))  # both loops end with one evaluation
    device = torch_device()
    policy = LearningRatePolicy()
    ours, bare = [], []
    for r in range(rounds + 1):  # round 0 warms up both
        model = initial_model(name, "init:0", 10)
        trainer = Trainer(model, make_optimizer(model, policy, batch_size), batch_size, data.train, test, seed=r, device=device)
        started = time.perf_counter()
        train_to_accuracy(trainer, 1.1, batch_size * steps, batch_size * steps, r)
        t_ours = time.perf_counter() - started
        model = initial_model(name, "init:0", 10).to(device).train()
        x, y = (t.to(device) for t in data.train.tensors)
        test_x, test_y = (t.to(device) for t in test.tensors)
        optimizer = make_optimizer(model, policy, batch_size)
        started = time.perf_counter()
        bare_loop(model, optimizer, x, y, test_x, test_y, batch_size, steps, r)
        t_bare = time.perf_counter() - started
        if r:
            ours.append(batch_size * steps / t_ours)
            bare.append(batch_size * steps / t_bare)
    return {
        "model": name, "batch_size": batch_size, "device": str(device),
        "edgetrain_samples_per_s": statistics.median(ours), "bare_samples_per_s": statistics.median(bare),
        "ratio": statistics.median(ours) / statistics.median(bare),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [measure(name, b, steps, args.rounds) for name, b, steps in CASES]
    for r in results:
        print(f"{r['model']:<10} b={r['batch_size']:<4} {r['device']}: edgetrain {r['edgetrain_samples_per_s']:8.1f} samples/s, "
              f"bare PyTorch {r['bare_samples_per_s']:8.1f} samples/s, ratio {r['ratio']:.3f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
