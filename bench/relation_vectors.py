"""Relation vectors at reduced scale, mean and standard deviation of N_b over seeds.

Each model is pre-trained on the MNIST subset (the `pretrain` path: weights published to the
artifact store and fetched by reference), then every batch size is trained from those
weights on the proxy (scikit-learn digits) to the target accuracy.

    python bench/relation_vectors.py [--models smallcnn resnet18] [--seeds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from edgetrain.common.estimation import aggregate, pretrain, train_proxy
from edgetrain.common.schemas import DatasetRef, EstimationRequest, LearningRatePolicy

SETTINGS = {  # model: (pre-training samples, target accuracy on the proxy)
    "smallcnn": (8000, 0.90),
    "resnet18": (4000, 0.90),
    "mobilenet_v2": (4000, 0.85),
}


def estimate(model: str, seeds: int, folder: Path) -> dict:
    samples, target = SETTINGS[model]
    started = time.perf_counter()
    weights, pre_acc = pretrain(model, DatasetRef(name="mnist5k"), samples, 64, LearningRatePolicy(), 0, folder)
    request = EstimationRequest(
        model=model, weights=weights, proxy_dataset=DatasetRef(name="digits"), target_accuracy=target,
        batch_sizes=[4, 8, 16, 32, 64, 128], seeds=list(range(seeds)), lr=LearningRatePolicy(),
        eval_every_samples=64, max_samples=30000,
    )  # fmt: skip
    outcomes = [train_proxy(request, b, s) for b in request.batch_sizes for s in request.seeds]
    vector = aggregate(request, outcomes)
    return {"model": model, "pretrain_accuracy_mnist5k": pre_acc, "target_accuracy": target,
            "vector": vector.model_dump(mode="json", exclude={"request"}), "wall_s": time.perf_counter() - started}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["smallcnn", "resnet18"], choices=sorted(SETTINGS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            r = estimate(model, args.seeds, Path(tmp))
            results.append(r)
            v = r["vector"]
            print(f"{model}: pre-trained to {r['pretrain_accuracy_mnist5k']:.3f} on mnist5k; proxy digits to {r['target_accuracy']:.0%}, "
                  f"{args.seeds} seeds, N_b resolution {v['resolution_samples']} samples, {r['wall_s']:.0f} s")  # fmt: skip
            print("  b     N_b mean ± std      r_b")
            for b, m, s, ratio in zip(v["batch_sizes"], v["samples_mean"], v["samples_std"], v["ratios"]):
                print(f"  {b:<5} " + ("censored" if m is None else f"{m:8.0f} ± {s:6.0f}   {ratio:.3f}"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
