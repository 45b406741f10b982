"""The time of one evaluation (`common/training.evaluate`: accuracy and loss over a test split)
at the chunk size it uses against larger chunks, measured side by side in alternating rounds
on this machine's training device (one thread on a CPU, as a worker with
EDGETRAIN_TORCH_THREADS=1 runs). An evaluation's chunk is how many test samples one forward
pass takes: on a CPU, chunks whose activations leave the caches are slower per sample.

    python bench/evaluation_chunks.py [--rounds 5] [--chunks 1024 512 128] [--threads 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef
from edgetrain.common.training import EVAL_CHUNK, evaluate, torch_device

CASES = [("smallcnn", "mnist5k"), ("resnet18", "mnist5k")]  # model, dataset (its test split, in the model's input shape)


def measure(name: str, dataset: str, chunks: list[int], rounds: int) -> dict:
    """Median time of one evaluation (ms) per chunk size, and the accuracies (equal for all)."""
    entry = get_model(name)
    x, y = load_dataset(DatasetRef(name=dataset), entry, 0).test.tensors
    device = torch_device()
    x, y = x.to(device), y.to(device)
    model = initial_model(name, "init:0", 10).to(device)
    times: dict[int, list[float]] = {c: [] for c in chunks}
    accuracies = set()
    for r in range(rounds + 1):  # round 0 warms up
        for chunk in chunks:
            started = time.perf_counter()
            accuracy, _ = evaluate(model, x, y, chunk)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times[chunk].append((time.perf_counter() - started) * 1e3)
            accuracies.add(round(accuracy, 6))
    return {"model": name, "dataset": dataset, "test_samples": len(y), "device": str(device),
            "ms": {c: statistics.median(t) for c, t in times.items()}, "accuracies": sorted(accuracies)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 512, 128], help="sizes to compare with the one used")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chunks = sorted({*args.chunks, EVAL_CHUNK}, reverse=True)  # always the one used
    results = [measure(name, dataset, chunks, args.rounds) for name, dataset in CASES]
    print(f"one evaluation of the test split, median of {args.rounds} rounds side by side (ms); used now: chunks of {EVAL_CHUNK}")
    print("| model | device | test samples | " + " | ".join(f"chunk {c}" for c in chunks) + f" | chunk {chunks[0]} / chunk {EVAL_CHUNK} |")
    print("|---" * (len(chunks) + 4) + "|")
    for r in results:
        ratio = r["ms"][chunks[0]] / r["ms"][EVAL_CHUNK]
        cells = " | ".join(f"{r['ms'][c]:.0f}" for c in chunks)
        print(f"| {r['model']} | {r['device']} | {r['test_samples']} | {cells} | {ratio:.2f}x |")
        assert len(r["accuracies"]) == 1, f"{r['model']}: the chunk size changed the accuracy: {r['accuracies']}"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
