"""Real training runs the benches share, cached: pre-trained weights, solo runs to a target at
one batch size and seed (as the server pool's proxy runs train; each keeps its curve of test
accuracy and loss), the relation vector they give, and a twin's lookup table (the real
profiling code). Kept under bench/results/runs/ (git-ignored): a rerun reuses them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.estimation import SPLIT_SEED, aggregate, pretrain
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import (
    DatasetRef,
    EstimationRequest,
    LearningRatePolicy,
    ProfileTable,
    ProfilingOptions,
    RelationVector,
    TrainingOutcome,
)
from edgetrain.common.training import DeviceTotals, Trainer, make_optimizer, train_to_accuracy

RESULTS = Path(__file__).resolve().parent / "results" / "runs"
ARTIFACTS = RESULTS / "artifacts"
EVAL_EVERY = 256
MAX_SAMPLES = 40_000
BATCH_SIZES = [4, 8, 16, 32, 64, 128]


def _digest(value: Any) -> str:
    """A short hash of a JSON-able key."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:20]


def cached(kind: str, key: dict[str, Any], compute: Any) -> Any:
    """`compute()`'s value, kept under RESULTS/kind by the key's hash, so a rerun reuses it."""
    path = RESULTS / kind / f"{_digest(key)}.json"
    if path.exists():
        return json.loads(path.read_text())["value"]
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "value": value}))
    return value


def pretrained(model: str, dataset: str, samples: int) -> str:
    """Weights pre-trained as `edgetrain evaluate`'s `pretrain` step does (b=128, init:0)."""
    key = {"model": model, "dataset": dataset, "samples": samples, "batch_size": 128, "seed": 0}

    def compute() -> dict[str, Any]:
        url, accuracy = pretrain(model, DatasetRef(name=dataset), samples, 128, LearningRatePolicy(), 0, ARTIFACTS)
        return {"weights": url, "test_accuracy": accuracy}

    return cached("pretrain", key, compute)["weights"]


def reference_run(model: str, weights: str, dataset: dict[str, Any], target: float, b: int, seed: int) -> dict[str, Any]:
    """A solo run at batch size `b` to the target (the server pool's proxy run): its outcome
    and its curve [samples, test accuracy, test loss] at every evaluation."""
    key = {"model": model, "weights": weights, "dataset": dataset, "target": target, "b": b, "seed": seed,
           "eval_every": EVAL_EVERY, "max_samples": MAX_SAMPLES}  # fmt: skip

    def compute() -> dict[str, Any]:
        entry = get_model(model)
        data = load_dataset(DatasetRef(**dataset), entry, SPLIT_SEED)
        net = initial_model(model, weights, data.num_classes, ARTIFACTS)
        trainer = Trainer(net, make_optimizer(net, LearningRatePolicy(), b), b, data.train, data.test, seed)
        losses: list[float] = []

        def on_eval(samples: int, accuracy: float, run: DeviceTotals) -> None:
            losses.append(trainer.test_loss or 0.0)

        outcome, run = train_to_accuracy(trainer, target, EVAL_EVERY, MAX_SAMPLES, seed, on_evaluation=on_eval)
        return {"outcome": outcome.model_dump(mode="json"), "curve": [[n, a, loss] for (n, a), loss in zip(run.history, losses)]}

    return cached("runs", key, compute)


def table(twin: str, model: str = "smallcnn") -> ProfileTable:
    """The twin's grid lookup table, profiled by the real profiling code."""

    def compute() -> dict[str, Any]:
        device = SimulatedDevice(load_twin(twin), seed=0)
        return profile(device, get_model(model), BATCH_SIZES, ProfilingOptions(), LearningRatePolicy()).model_dump(mode="json")

    return ProfileTable.model_validate(cached("tables", {"twin": twin, "model": model}, compute))


def vector(model: str, weights: str, dataset: dict[str, Any], target: float, seeds: list[int],
           batch_sizes: list[int] | None = None) -> RelationVector:  # fmt: skip
    """N_b over seeds for every batch size, from the reference runs (as the server pool estimates it)."""
    request = EstimationRequest(model=model, weights=weights, proxy_dataset=DatasetRef(**dataset), target_accuracy=target,
                                batch_sizes=batch_sizes or BATCH_SIZES, seeds=seeds, lr=LearningRatePolicy(),
                                eval_every_samples=EVAL_EVERY, max_samples=MAX_SAMPLES)  # fmt: skip
    outcomes = [TrainingOutcome.model_validate(reference_run(model, weights, dataset, target, b, s)["outcome"])
                for b in request.batch_sizes for s in seeds]  # fmt: skip
    return aggregate(request, outcomes)
