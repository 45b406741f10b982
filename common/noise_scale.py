"""The gradient noise scale of a model on a dataset, and what it says about batch sizes.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018): with
G the true gradient and Sigma the per-sample gradient covariance, a batch of b samples gives
E|G_b|^2 = |G|^2 + tr(Sigma)/b, and the "simple" noise scale is B = tr(Sigma)/|G|^2. The
samples needed to reach a given loss grow like N_b = N_min (1 + B / b): batches much larger
than B spend samples for little gain, much smaller ones waste none. So, relative to the
largest batch b_max,

    r_b(B) = (1 + B / b) / (1 + B / b_max)

Two batch sizes give both unknowns (their Appendix A): from the mean squared gradient norms
|G_s|^2 and |G_l|^2 at sizes s < l,

    |G|^2    = (l |G_l|^2 - s |G_s|^2) / (l - s)
    tr(Sigma) = (|G_s|^2 - |G_l|^2) / (1/s - 1/l)

It needs only gradients of the current weights on the data (no training step), so a device
measures it on its own data, which never leaves it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

from .training import loss_and_correct

MIN_SCALE, MAX_SCALE = 1e-3, 1e7  # samples: estimates outside are noise, clipped


@dataclass(frozen=True)
class NoiseScale:
    """A measured gradient noise scale: B (samples), |G|^2 and tr(Sigma), and the samples it took."""

    scale: float
    gradient_sq: float
    trace: float
    samples: int

    def ratio(self, batch_size: int, largest: int) -> float:
        """r_b = N_b / N_{b_max} that this noise scale predicts (b_max = `largest`)."""
        return (1 + self.scale / batch_size) / (1 + self.scale / largest)


def gradient_sq(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """|g|^2 of the mean-loss gradient of one batch (weights unchanged)."""
    model.zero_grad(set_to_none=True)
    loss, _ = loss_and_correct(model(x), y)
    loss.backward()
    total = sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return total


def noise_scale(
    model: nn.Module,
    data: TensorDataset,
    small: int,
    large: int,
    batches: int,
    seed: int,
    run: Callable[[Callable[[], None], int], None] | None = None,
) -> NoiseScale:
    """Estimate B from `batches` batches of `small` and of `large` samples drawn from `data`
    (seeded). `run(step, batch_size)`, when given, runs each gradient computation (a device
    that accounts its time and energy); the model's weights are not changed."""
    if not 0 < small < large:
        raise ValueError(f"noise scale: need 0 < small < large batch sizes, got {small}, {large}")
    x_all, y_all = (t.to(next(model.parameters()).device) for t in data.tensors)
    generator = torch.Generator().manual_seed(seed)
    means = {}
    for size in (small, large):
        total = 0.0
        for _ in range(batches):
            index = torch.randint(len(y_all), (size,), generator=generator).to(x_all.device)
            values: list[float] = []

            def step(index: torch.Tensor = index, values: list[float] = values) -> None:
                values.append(gradient_sq(model, x_all[index], y_all[index]))

            (run or (lambda f, _b: f()))(step, size)
            total += values[0]
        means[size] = total / batches
    g_sq = (large * means[large] - small * means[small]) / (large - small)
    trace = (means[small] - means[large]) / (1 / small - 1 / large)
    scale = trace / g_sq if g_sq > 0 and trace > 0 else (MAX_SCALE if g_sq <= 0 else MIN_SCALE)
    return NoiseScale(min(max(scale, MIN_SCALE), MAX_SCALE), g_sq, trace, batches * (small + large))


def corrected_ratio(proxy_ratio: float, batch_size: int, largest: int, proxy: NoiseScale, target: NoiseScale) -> float:
    """The proxy's r_b carried over to the target data: scaled by how the target's noise scale
    changes r_b compared with the proxy's. Equal noise scales leave r_b unchanged."""
    value = proxy_ratio * target.ratio(batch_size, largest) / proxy.ratio(batch_size, largest)
    return value if math.isfinite(value) else proxy_ratio
