"""A step-driven training loop: one mini-batch per `step()`, so the device, the batch size
and the frequency can change between steps; accuracy is checked before training and then every
`eval_every_samples`, and N_b is interpolated between the evaluations around the target."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .devices.base import Device, Measurement
from .schemas import AccuracyBracket, LearningRatePolicy, TrainingOutcome

EVAL_CHUNK = 256  # samples a forward pass of an evaluation takes at once: larger chunks leave a CPU's caches (bench/evaluation_chunks.py)


def torch_device() -> torch.device:
    """The device training runs on here: CUDA when available, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_optimizer(model: nn.Module, policy: LearningRatePolicy, batch_size: int) -> torch.optim.Optimizer:
    """Adam or AdamW with the learning rate scaled for `batch_size` by `policy`."""
    cls = torch.optim.AdamW if policy.optimizer == "adamw" else torch.optim.Adam
    return cls(model.parameters(), lr=policy.lr_for(batch_size))


def set_batch_size(trainer: Trainer, policy: LearningRatePolicy, batch_size: int) -> None:
    """Switch batch size between steps, keeping weights and optimizer state (lr rescaled)."""
    trainer.batch_size = batch_size
    for group in trainer.optimizer.param_groups:
        group["lr"] = policy.lr_for(batch_size)


def loss_and_correct(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and correct predictions for class logits (N, C) or sequences (N, T, V)."""
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_target = target.reshape(-1)
    return F.cross_entropy(flat_logits, flat_target), (flat_logits.argmax(-1) == flat_target).sum()


class Trainer:
    """Holds the model, optimizer and a seeded stream of mini-batches."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batch_size: int,
        train: TensorDataset,
        test: TensorDataset | None,
        seed: int,
        device: torch.device | None = None,
    ):
        self.device = device or torch_device()
        self.model = model.to(self.device).train()
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.train_x, self.train_y = (t.to(self.device) for t in train.tensors)
        self.test = (test.tensors[0].to(self.device), test.tensors[1].to(self.device)) if test is not None else None  # inputs, targets
        self._generator = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._cursor = 0
        self.samples = 0
        self.steps = 0
        self.test_loss: float | None = None  # of the last evaluation (nats)

    def _next_indices(self) -> torch.Tensor:
        if self._cursor + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.train_y), generator=self._generator)
            self._cursor = 0
        idx = self._order[self._cursor : self._cursor + self.batch_size]
        self._cursor += self.batch_size
        return idx.to(self.device)

    def step(self) -> None:
        """Train on one mini-batch."""
        idx = self._next_indices()
        loss, _ = loss_and_correct(self.model(self.train_x[idx]), self.train_y[idx])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.samples += len(idx)
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly here: weights, optimizer state,
        counters and the position in the seeded stream of mini-batches."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self._generator.get_state(),
            "order": self._order,
            "cursor": self._cursor,
            "samples": self.samples,
            "steps": self.steps,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` of a trainer built the same way."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._generator.set_state(state["generator"])
        self._order, self._cursor = state["order"], state["cursor"]
        self.samples, self.steps, self.batch_size = state["samples"], state["steps"], state["batch_size"]

    def evaluate(self) -> float:
        """Accuracy on the test split (fraction; per character for sequence targets); the mean
        cross-entropy of the same pass is kept in `test_loss` (nats)."""
        if self.test is None:
            raise ValueError("no test split to evaluate on")
        accuracy, self.test_loss = evaluate(self.model, *self.test)
        return accuracy


def in_chunks(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk_size: int = EVAL_CHUNK
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The outputs of `model` on inputs `x` (moved to the model's device) and their targets `y`,
    `chunk_size` samples at a time, in evaluation mode and without gradients; the model is left in
    training mode."""
    where = next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(y), chunk_size):
                yield model(x[start : start + chunk_size].to(where)), y[start : start + chunk_size].to(where)
    finally:
        model.train()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk_size: int = EVAL_CHUNK) -> tuple[float, float]:
    """Accuracy of `model` on inputs `x` and targets `y` (fraction; per character for sequence
    targets) and the mean cross-entropy (nats), in chunks of `chunk_size` samples; the model is
    left in training mode."""
    correct = total = 0
    loss_sum = 0.0
    for logits, target in in_chunks(model, x, y, chunk_size):
        loss, hits = loss_and_correct(logits, target)
        correct += int(hits)
        total += target.numel()
        loss_sum += float(loss) * target.numel()
    return correct / total, loss_sum / total


@dataclass
class DeviceTotals:
    """Sums over the measured steps of a run on a device (s, J, W)."""

    elapsed_s: float = 0.0
    energy_j: float = 0.0
    peak_power_w: float = 0.0
    simulated: bool = False
    steps: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (samples, accuracy)

    def add(self, m: Measurement) -> None:
        """Add one measured region of steps to the totals."""
        self.elapsed_s += m.elapsed_s
        self.energy_j += m.energy_j
        self.peak_power_w = max(self.peak_power_w, m.peak_power_w)
        self.simulated = self.simulated or m.simulated
        self.steps += m.steps


Progress = Callable[[int, float, DeviceTotals], None]  # samples, accuracy, totals


class StepControl(Protocol):
    """Changes the run between steps (common/finetune/adaptive.py): batch size, frequency, pauses."""

    def before_step(self, run: DeviceTotals) -> None:
        """Called at each step boundary before the step; may idle the device (adding to `run`)."""

    def after_step(self, m: Measurement, run: DeviceTotals) -> None:
        """Called with each step's measured region once it is added to `run`."""


def crossing(history: list[tuple[int, float]], target_accuracy: float) -> tuple[int, AccuracyBracket] | None:
    """N_b from an accuracy curve: where the test accuracy first reaches the target.

    `history` holds (samples processed, test accuracy) per evaluation in order, starting with
    the evaluation before training. The crossing lies between the first evaluation at or above
    the target and the one before it (below the target, whatever came earlier: the curve need
    not be monotone); N_b is interpolated linearly between the two and rounded to a whole
    sample. A curve that meets the target at its first evaluation gives that evaluation's
    sample count (0 before training). None when no evaluation reaches the target.
    """
    for k, (samples, accuracy) in enumerate(history):
        if accuracy < target_accuracy:
            continue
        before_samples, before_accuracy = history[k - 1] if k else (samples, accuracy)
        bracket = AccuracyBracket(
            before_samples=before_samples, before_accuracy=before_accuracy, after_samples=samples, after_accuracy=accuracy
        )
        if not k:
            return samples, bracket
        share = (target_accuracy - before_accuracy) / (accuracy - before_accuracy)  # in (0, 1]
        return math.floor(before_samples + share * (samples - before_samples) + 0.5), bracket
    return None


def train_to_accuracy(
    trainer: Trainer,
    target_accuracy: float,
    eval_every_samples: int,
    max_samples: int,
    seed: int,
    device: Device | None = None,
    on_evaluation: Progress | None = None,
    totals: DeviceTotals | None = None,
    control: StepControl | None = None,
) -> tuple[TrainingOutcome, DeviceTotals]:
    """Train until the test accuracy reaches the target or `max_samples` are processed.

    Accuracy is evaluated before training and then every `eval_every_samples` samples (at the
    first step boundary past each interval); N_b is interpolated between the two evaluations
    around the crossing (see `crossing`). Steps run through `device` when one is given. A run
    resumed from a checkpoint (taken at an evaluation below the target) passes the trainer
    restored to that point and the totals saved with it, whose history goes on; totals without
    history start a new run and are added to as it goes. A `control`
    (with a `device`) sees every step boundary and measured step.
    """
    started = time.perf_counter()
    run = totals if totals is not None else DeviceTotals()
    resumed = bool(run.history)

    def evaluate() -> bool:
        accuracy = trainer.evaluate()
        run.history.append((trainer.samples, accuracy))
        if on_evaluation:
            on_evaluation(trainer.samples, accuracy, run)
        return accuracy >= target_accuracy

    reached = False if resumed else evaluate()
    next_eval = trainer.samples + eval_every_samples
    while not reached and trainer.samples < max_samples:
        if device is None:
            trainer.step()
        else:
            if control:
                control.before_step(run)
            measured = device.run_steps(trainer.step, trainer.batch_size, 1)
            run.add(measured)
            if control:
                control.after_step(measured, run)
        if trainer.samples >= next_eval or trainer.samples >= max_samples:
            next_eval = trainer.samples + eval_every_samples
            reached = evaluate()
    found = crossing(run.history, target_accuracy)
    outcome = TrainingOutcome(
        batch_size=trainer.batch_size,
        seed=seed,
        samples_to_accuracy=found[0] if found else None,
        bracket=found[1] if found else None,
        reached=reached,
        final_accuracy=run.history[-1][1],
        samples_processed=trainer.samples,
        evaluations=len(run.history),
        wall_s=time.perf_counter() - started,
    )
    return outcome, run
