"""Ready-made evaluations, as data: `quick` for a CPU-only machine, `paper` for a GPU server.

quick (small CNN on 1x28x28, the data that ships with the install or `edgetrain data fetch`):
  - paper-like: pre-trained on Fashion-MNIST (60000 samples, about one pass), fine-tuned on
    the MNIST subset to 90 % with scikit-learn's digits (another set of handwritten digits)
    as the proxy;
  - poorly matched proxy: from a seeded initialisation, digits as the proxy for the MNIST
    subset and for a tenth of Fashion-MNIST (clothes, not digits); its sensitivity matrix
    covers every pair among the three.
  Both on the Jetson Nano and TX2 NX twins (SIMULATED devices) under two caps and none,
  batch sizes 4..128, 3 seeds.

paper (the protocol of Ahmed et al., "Accelerated Training on Low-Power Edge Devices",
TMLR 2025, section 5): ResNet18 and MobileNetV2 at 3x32x32, pre-trained on CIFAR-100, proxy
12500 CIFAR-10 images, target 18315 SVHN images (a quarter of its training split's size), the paper's
target accuracies, batch sizes 4..128, 5 seeds, Adam at 5e-4 for b = 128 with square-root
scaling. CIFAR-10/100 and SVHN are read by torchvision from local files (`edgetrain data
status` says where). CINIC-10 has no registry entry: add it as a target with
{"dataset": {"name": "imagefolder", "path": ...}, "target_accuracy": 0.76} (ResNet18) or
0.74 (MobileNetV2). The devices are the twins; name registered `device_id`s for real boards.
"""

from __future__ import annotations

from typing import Any, Literal

from .spec import EvaluationSpec

Scale = Literal["quick", "paper"]

TWINS = [
    {"twin": "jetson-nano", "power_caps_w": [3.5, 5.0, None]},
    {"twin": "jetson-tx2-nx", "power_caps_w": [5.0, 6.0, None]},
]
QUICK_RUNS = {"batch_sizes": [4, 8, 16, 32, 64, 128], "seeds": [0, 1, 2], "eval_every_samples": 256, "max_samples": 40_000}
CIFAR10_PROXY_FRACTION = 12_500 / 60_000  # the registry joins CIFAR-10's splits: 60000 images
SVHN_QUARTER_FRACTION = 18_315 / 99_289  # a quarter of 73257 training images, drawn from the 99289 of both splits
PAPER_RUNS = {
    "batch_sizes": [4, 8, 16, 32, 64, 128], "seeds": [0, 1, 2, 3, 4], "eval_every_samples": 1024, "max_samples": 1_000_000,
    "lr": {"optimizer": "adam", "lr_ref": 5e-4, "b_ref": 128, "rule": "sqrt"},
    "pretrain": {"dataset": {"name": "cifar100"}, "max_samples": 1_500_000},
}  # fmt: skip
PAPER_ACCURACY = {"resnet18": {"cifar10": 0.87, "svhn": 0.92}, "mobilenet_v2": {"cifar10": 0.845, "svhn": 0.915}}


def _paper(model: str) -> dict[str, Any]:
    accuracy = PAPER_ACCURACY[model]
    return {
        "name": f"paper: {model}, pre-trained on CIFAR-100, proxy CIFAR-10 (12500), target SVHN (quarter)",
        "model": model,
        "proxy": {
            "dataset": {"name": "cifar10", "fraction": CIFAR10_PROXY_FRACTION}, "target_accuracy": accuracy["cifar10"], "name": "cifar10",
        },
        "targets": [{"dataset": {"name": "svhn", "fraction": SVHN_QUARTER_FRACTION}, "target_accuracy": accuracy["svhn"], "name": "svhn"}],
        "devices": TWINS,
        **PAPER_RUNS,
    }  # fmt: skip


PRESETS: dict[Scale, list[dict[str, Any]]] = {
    "quick": [
        {
            "name": "quick, paper-like: pre-trained on Fashion-MNIST, proxy digits, target MNIST (5000)",
            "model": "smallcnn",
            "pretrain": {"dataset": {"name": "fashion_mnist"}, "max_samples": 60_000},
            "proxy": {"dataset": {"name": "digits"}, "target_accuracy": 0.9},
            "targets": [{"dataset": {"name": "mnist5k"}, "target_accuracy": 0.9}],
            "devices": TWINS,
            **QUICK_RUNS,
        },
        {
            "name": "quick, poorly matched proxy: digits for MNIST (5000) and Fashion-MNIST (7000)",
            "model": "smallcnn",
            "proxy": {"dataset": {"name": "digits"}, "target_accuracy": 0.9},
            "targets": [
                {"dataset": {"name": "mnist5k"}, "target_accuracy": 0.9},
                {"dataset": {"name": "fashion_mnist", "fraction": 0.1}, "target_accuracy": 0.8, "name": "fashion_mnist"},
            ],
            "devices": TWINS,
            **QUICK_RUNS,
        },
    ],
    "paper": [_paper("resnet18"), _paper("mobilenet_v2")],
}
SCALES: tuple[Scale, ...] = ("quick", "paper")


def scale_preset(scale: Scale) -> list[EvaluationSpec]:
    """The evaluations of a scale, validated."""
    if scale not in PRESETS:
        raise ValueError(f"scale: unknown scale {scale!r}; use one of {list(SCALES)}")
    return [EvaluationSpec.model_validate(spec) for spec in PRESETS[scale]]
