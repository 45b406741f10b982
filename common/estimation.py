"""Relation vector estimation (docs/method.md, part 2): train on the proxy dataset with every
batch size (and seed) to the target accuracy, and r_b = N_b / N_{b_max}."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from .artifacts import initial_model, put_state_dict
from .datasets.loading import load_dataset
from .keys import vector_key
from .models import get_model
from .progress import ProxyRunProgress, throttled
from .schemas import (
    DatasetRef,
    EstimationRequest,
    LearningRatePolicy,
    RelationVector,
    TrainingOutcome,
    utc_now,
)
from .training import DeviceTotals, Trainer, make_optimizer, train_to_accuracy

SPLIT_SEED = 0  # the proxy's train/test split is the same for every batch size and seed


def train_proxy(
    request: EstimationRequest, batch_size: int, seed: int, on_progress: Callable[[ProxyRunProgress], None] | None = None
) -> TrainingOutcome:
    """One proxy run: pre-trained weights, lr scaled for the batch, until the target.
    `on_progress` sees its evaluations, at most about once a second (the first at once)."""
    started = utc_now()
    report = throttled(on_progress)

    def evaluated(samples: int, accuracy: float, _: DeviceTotals) -> None:
        report(ProxyRunProgress(batch_size=batch_size, seed=seed, samples=samples, accuracy=accuracy, started_at=started,
                                target_accuracy=request.target_accuracy, max_samples=request.max_samples))  # fmt: skip

    entry = get_model(request.model)
    data = load_dataset(request.proxy_dataset, entry, SPLIT_SEED)
    model = initial_model(request.model, request.weights, data.num_classes)
    trainer = Trainer(model, make_optimizer(model, request.lr, batch_size), batch_size, data.train, data.test, seed)
    outcome, _ = train_to_accuracy(
        trainer, request.target_accuracy, request.eval_every_samples, request.max_samples, seed, on_evaluation=evaluated
    )
    if outcome.samples_to_accuracy == 0:
        raise ValueError(
            f"target_accuracy: {request.proxy_dataset.name} is at {outcome.final_accuracy:.4f} before any training, "
            f"already at or above the target {request.target_accuracy}: N_b is 0 for every batch size, so there is "
            "nothing to choose; set a higher target accuracy"
        )
    return outcome


def resolution_samples(request: EstimationRequest, outcomes: list[TrainingOutcome]) -> int | None:
    """The widest bracket around a crossing over the runs that reached the target (samples);
    a run recorded without its bracket counts with the evaluation interval. None if none reached."""
    widths = [o.bracket.width_samples if o.bracket else request.eval_every_samples for o in outcomes if o.reached]
    return max(widths, default=None)


def aggregate(request: EstimationRequest, outcomes: list[TrainingOutcome]) -> RelationVector:
    """N_b (interpolated per run) as mean and std over seeds; a batch size censored in any
    seed is censored, and the reference is the largest batch size that reached the target."""
    means: list[float | None] = []
    stds: list[float | None] = []
    censored: list[bool] = []
    for b in request.batch_sizes:
        runs = [o for o in outcomes if o.batch_size == b]
        missing = set(request.seeds) - {o.seed for o in runs}
        if missing:
            raise ValueError(f"batch size {b}: no outcome for seeds {sorted(missing)}")
        is_censored = any(not o.reached for o in runs)
        counts = [float(o.samples_to_accuracy) for o in runs if o.samples_to_accuracy is not None]
        censored.append(is_censored)
        means.append(None if is_censored else statistics.fmean(counts))
        stds.append(None if is_censored else (statistics.stdev(counts) if len(counts) > 1 else 0.0))
    reached = [(b, m) for b, m in zip(request.batch_sizes, means) if m is not None]
    reference_b, reference_n = reached[-1] if reached else (None, 1.0)
    return RelationVector(
        batch_sizes=request.batch_sizes,
        ratios=[None if m is None else m / reference_n for m in means],
        samples_mean=means,
        samples_std=stds,
        censored=censored,
        resolution_samples=resolution_samples(request, outcomes),
        key=vector_key(request),
        reference_batch_size=reference_b,
        request=request,
    )


def estimate_in_process(request: EstimationRequest, on_run: Callable[[TrainingOutcome], None] | None = None) -> RelationVector:
    """Every proxy run of `request` (each batch size and seed) one after the other in this
    process, as the server pool would run them, aggregated; `on_run` sees each outcome."""
    outcomes = []
    for b in request.batch_sizes:
        for seed in request.seeds:
            outcomes.append(train_proxy(request, b, seed))
            if on_run:
                on_run(outcomes[-1])
    return aggregate(request, outcomes)


def pretrain(
    model_name: str, dataset: DatasetRef, samples: int, batch_size: int, lr: LearningRatePolicy, seed: int, folder: Path
) -> tuple[str, float]:
    """Train `model_name` from a seeded initialisation on `dataset` for `samples` samples and
    publish the weights to the artifact store; returns (weights URL, test accuracy)."""
    entry = get_model(model_name)
    data = load_dataset(dataset, entry, SPLIT_SEED)
    model = initial_model(model_name, f"init:{seed}", data.num_classes)
    trainer = Trainer(model, make_optimizer(model, lr, batch_size), batch_size, data.train, data.test, seed)
    while trainer.samples < samples:
        trainer.step()
    accuracy = trainer.evaluate()  # where it trained: the weights move to the CPU to be published
    name = f"{model_name}-{dataset.name}-{samples}"
    return put_state_dict(trainer.model.cpu(), name, folder), accuracy
