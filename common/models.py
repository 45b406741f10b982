"""Model registry: the paper's models at their input shapes, and a small CNN.

The registry holds what the planner and the client need (name, task, input shape, optimizer)
without importing PyTorch; the networks themselves (`common/networks.py`) are imported when a
model is built.

A user's own model is named by import path, `package.module:factory`, and is imported only by
workers whose operator allows its module (`EDGETRAIN_ALLOWED_MODEL_MODULES`); the factory must
be defined in that module and is called as factory(num_classes=..., input_shape=...). It
declares what the planner needs as attributes: `task` ("image" or "text", default "image"),
`input_shape` (default (3, 32, 32)) and `optimizer` ("adam" or "adamw", default "adam").
A client never imports it: it checks the name's form only (and the module, when its own
environment sets the allow-list).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from .security import split_user_model, user_model_problem
from .settings import get_data_settings

if TYPE_CHECKING:
    import torch
    from torch import nn

Task = Literal["image", "text"]
Optimizer = Literal["adam", "adamw"]


@dataclass(frozen=True)
class ModelEntry:
    """A model: its task, its input shape per sample ((C, H, W) for images, (sequence
    length,) for text), the optimizer it trains with, and how to build it."""

    name: str
    task: Task
    input_shape: tuple[int, ...]
    factory: str | Callable[..., Any]  # "module:function" in edgetrain, or a user's callable
    optimizer: Optimizer = "adam"

    def build(self, num_classes: int) -> nn.Module:
        """A new, randomly initialised network with `num_classes` outputs (vocabulary size for text)."""
        if callable(self.factory):
            return self.factory(num_classes=num_classes, input_shape=self.input_shape)
        module, _, function = self.factory.partition(":")
        return getattr(importlib.import_module(module), function)(num_classes)

    def example_input(self, num_classes: int) -> torch.Tensor:
        """One input sample with a leading batch dimension of 1."""
        import torch

        if self.task == "text":
            return torch.randint(0, num_classes, (1, *self.input_shape))
        return torch.zeros(1, *self.input_shape)


_NETWORKS = "edgetrain.common.networks"
_REGISTRY: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry("smallcnn", "image", (1, 28, 28), f"{_NETWORKS}:SmallCNN"),
        ModelEntry("resnet18", "image", (3, 32, 32), f"{_NETWORKS}:resnet18"),
        ModelEntry("mobilenet_v2", "image", (3, 32, 32), f"{_NETWORKS}:mobilenet_v2"),
        ModelEntry("char_transformer", "text", (64,), f"{_NETWORKS}:CharTransformer", optimizer="adamw"),
    )
}


def register_model(entry: ModelEntry) -> None:
    """Add a model to the registry of this process."""
    _REGISTRY[entry.name] = entry


def model_names() -> list[str]:
    """The registered model names, sorted."""
    return sorted(_REGISTRY)


def unknown_model_message(name: str) -> str:
    """The error text for a model name that is neither registered nor an allowed user model."""
    return (
        f"model: unknown model {name!r}; registered: {model_names()}, or 'package.module:factory' "
        "from a module the workers allow (EDGETRAIN_ALLOWED_MODEL_MODULES)"
    )


def get_model(name: str, allowed_modules: Sequence[str] | None = None) -> ModelEntry:
    """A registered model, or `package.module:factory` for a user's own model, imported only
    when its module is in `allowed_modules` (default: settings.allowed_model_modules)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        raise ValueError(unknown_model_message(name))
    allowed = get_data_settings().allowed_model_modules if allowed_modules is None else allowed_modules
    return _user_model(name, allowed)


def _user_model(name: str, allowed: Sequence[str]) -> ModelEntry:
    problem = user_model_problem(name, allowed)
    if problem:
        raise ValueError(f"model: {problem}")
    module_name, attr = split_user_model(name)
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model {name!r}: cannot import {attr!r} from {module_name!r} ({exc})") from exc
    if not callable(factory) or getattr(factory, "__module__", None) != module_name:
        raise ValueError(f"model {name!r}: {attr!r} is not a factory defined in {module_name!r}")
    task, shape, optimizer = (getattr(factory, "task", "image"), getattr(factory, "input_shape", (3, 32, 32)),
                              getattr(factory, "optimizer", "adam"))  # fmt: skip
    if task not in get_args(Task) or optimizer not in get_args(Optimizer):
        raise ValueError(f"model {name!r}: task {task!r} or optimizer {optimizer!r} not one of {get_args(Task)}, {get_args(Optimizer)}")
    return ModelEntry(name, cast(Task, task), tuple(int(n) for n in shape), factory, cast(Optimizer, optimizer))


def build_model(name: str, num_classes: int, weights_seed: int) -> nn.Module:
    """A freshly initialised model, deterministic for a seed."""
    import torch

    entry = get_model(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(weights_seed)
        return entry.build(num_classes)
