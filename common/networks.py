"""The networks of the model registry (PyTorch modules, imported only where a model is built)."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from typing_extensions import override


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head, for quick runs on 1x28x28 inputs."""

    def __init__(self, num_classes: int, channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, num_classes))

    @override
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

    @override
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:, :n]
        mask = cast(torch.Tensor, self.mask)  # a registered buffer
        x = self.blocks(x, mask=mask[:n, :n], is_causal=True)
        return self.head(self.norm(x))


def resnet18(num_classes: int) -> nn.Module:
    """torchvision's ResNet18 with `num_classes` outputs."""
    from torchvision.models import resnet18 as build

    return build(num_classes=num_classes)


def mobilenet_v2(num_classes: int) -> nn.Module:
    """torchvision's MobileNetV2 with `num_classes` outputs."""
    from torchvision.models import mobilenet_v2 as build

    return build(num_classes=num_classes)
