"""The gradient noise scale: exact on a model whose gradient noise is known, and the r_b it predicts."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from edgetrain.common.noise_scale import NoiseScale, corrected_ratio, noise_scale


class Mean(nn.Module):
    """Predicts a constant for every class: the gradient of its bias is the mean of
    per-sample gradients (softmax - one-hot), whose spread over the data is known."""

    def __init__(self, classes: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(len(x), -1)


def test_a_noise_scale_measured_from_data_matches_the_formula() -> None:
    classes, n = 4, 20000
    torch.manual_seed(0)
    labels = torch.multinomial(torch.tensor([0.7, 0.1, 0.1, 0.1]), n, replacement=True)
    data = TensorDataset(torch.zeros(n, 1), labels)
    # per-sample gradient of the bias at zero logits: softmax (1/4 each) - one_hot(y)
    per_sample = torch.full((n, classes), 1 / classes) - nn.functional.one_hot(labels, classes).float()
    mean = per_sample.mean(0)
    expected = float(((per_sample - mean) ** 2).sum(1).mean()) / float(mean.pow(2).sum())
    measured = noise_scale(Mean(classes), data, small=8, large=256, batches=400, seed=1)
    assert measured.scale == pytest.approx(expected, rel=0.15)
    assert measured.samples == 400 * (8 + 256)


def test_the_ratio_a_noise_scale_predicts() -> None:
    scale = NoiseScale(scale=32.0, gradient_sq=1.0, trace=32.0, samples=0)
    assert scale.ratio(128, 128) == 1.0
    assert scale.ratio(32, 128) == pytest.approx((1 + 1) / (1 + 0.25))
    tiny = NoiseScale(scale=0.001, gradient_sq=1.0, trace=0.001, samples=0)
    assert tiny.ratio(4, 128) == pytest.approx(1.0, abs=1e-3)  # no gradient noise: every batch size needs the same samples


def test_the_proxy_ratio_carries_over_by_the_noise_scales() -> None:
    proxy, same = NoiseScale(16.0, 1.0, 16.0, 0), NoiseScale(16.0, 2.0, 32.0, 0)
    assert corrected_ratio(0.6, 16, 128, proxy, same) == pytest.approx(0.6)
    noisier = NoiseScale(256.0, 1.0, 256.0, 0)  # the target rewards large batches more
    assert corrected_ratio(0.6, 16, 128, proxy, noisier) > 0.6
    calmer = NoiseScale(1.0, 1.0, 1.0, 0)
    assert corrected_ratio(0.6, 16, 128, proxy, calmer) < 0.6


def test_the_weights_do_not_change_and_a_device_can_account_the_steps() -> None:
    model = nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    data = TensorDataset(torch.randn(100, 3), torch.randint(0, 2, (100,)))
    steps: list[int] = []

    def run(step, batch_size: int) -> None:
        steps.append(batch_size)
        step()

    noise_scale(model, data, 4, 16, batches=3, seed=0, run=run)
    assert steps == [4, 4, 4, 16, 16, 16]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="need 0 < small < large"):
        noise_scale(model, data, 16, 4, batches=1, seed=0)
