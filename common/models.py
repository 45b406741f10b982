"""Model registry: the paper's models adapted to their input shapes, and a small CNN.

A model entry builds an `nn.Module` for `num_classes` outputs; users register their own by
import path (`package.module:factory`, called as factory(num_classes=..., input_shape=...)).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

Task = Literal["image", "text"]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    task: Task
    input_shape: tuple[int, ...]  # per sample: (C, H, W) for images, (sequence length,) for text
    build: Callable[[int], nn.Module]  # num_classes (vocabulary size for text) -> model
    optimizer: Literal["adam", "adamw"] = "adam"

    def example_input(self, num_classes: int) -> torch.Tensor:
        if self.task == "text":
            return torch.randint(0, num_classes, (1, *self.input_shape))
        return torch.zeros(1, *self.input_shape)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head, for quick runs on 1x28x28 inputs."""

    def __init__(self, num_classes: int, channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class CharTransformer(nn.Module):
    """Decoder-only character model: next-character logits for every position."""

    def __init__(self, vocab_size: int, seq_len: int = 64, width: int = 256, heads: int = 8, layers: int = 6):
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} must be divisible by heads={heads}")
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(torch.zeros(1, seq_len, width))
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:, :n]
        x = self.blocks(x, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(x))


def _resnet18(num_classes: int) -> nn.Module:
    from torchvision.models import resnet18

    return resnet18(num_classes=num_classes)


def _mobilenet_v2(num_classes: int) -> nn.Module:
    from torchvision.models import mobilenet_v2

    return mobilenet_v2(num_classes=num_classes)


_REGISTRY: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry("smallcnn", "image", (1, 28, 28), SmallCNN),
        ModelEntry("resnet18", "image", (3, 32, 32), _resnet18),
        ModelEntry("mobilenet_v2", "image", (3, 32, 32), _mobilenet_v2),
        ModelEntry("char_transformer", "text", (64,), CharTransformer, optimizer="adamw"),
    )
}


def register_model(entry: ModelEntry) -> None:
    _REGISTRY[entry.name] = entry


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def get_model(name: str) -> ModelEntry:
    """A registered model, or `package.module:factory` for a user's own image model."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model {name!r}: cannot import {attr!r} from {module_name!r} ({exc})") from exc
        shape = tuple(getattr(factory, "input_shape", (3, 32, 32)))
        task = getattr(factory, "task", "image")
        return ModelEntry(name, task, shape, lambda n: factory(num_classes=n, input_shape=shape))
    raise ValueError(f"model: unknown model {name!r}; registered: {model_names()} or 'package.module:factory'")


def build_model(name: str, num_classes: int, weights_seed: int) -> nn.Module:
    """A freshly initialised model, deterministic for a seed."""
    entry = get_model(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(weights_seed)
        return entry.build(num_classes)
