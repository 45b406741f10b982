"""Measure what a training step of a real torch model costs (FLOPs, activations, kernels)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .devices.base import Workload

BACKWARD_FACTOR = 3.0  # forward + backward is about 3x the forward FLOPs
KERNELS_PER_PARAMETER_TENSOR = 1  # fused optimizer update: about one kernel per tensor


def measure_workload(name: str, model: nn.Module, example: torch.Tensor) -> Workload:
    """Count FLOPs, activation bytes and kernel launches of one sample through `model`.

    `example` is one input sample with a leading batch dimension of 1 (or token ids).
    """
    outputs: list[int] = []
    leaf_calls = 0

    def hook(_module: nn.Module, _inp: object, out: object) -> None:
        nonlocal leaf_calls
        leaf_calls += 1
        tensors = out if isinstance(out, (tuple, list)) else (out,)
        outputs.extend(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(example)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    parameters = list(model.parameters())
    return Workload(
        model=name,
        input_shape=tuple(example.shape[1:]),
        flops_per_sample=float(counter.get_total_flops()) * BACKWARD_FACTOR,
        activation_bytes_per_sample=float(sum(outputs)),
        parameter_bytes=float(sum(p.numel() * p.element_size() for p in parameters)),
        kernels_per_step=3 * leaf_calls + KERNELS_PER_PARAMETER_TENSOR * len(parameters),
    )
