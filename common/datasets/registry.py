"""The dataset names edgetrain knows and the task each is for (no data is read here)."""

from __future__ import annotations

from ..models import Task

DATASET_TASKS: dict[str, Task] = {
    "digits": "image",
    "mnist5k": "image",
    "fashion_mnist": "image",
    "cifar10": "image",
    "cifar100": "image",
    "svhn": "image",
    "stl10": "image",
    "npz": "image",  # a user's arrays at dataset.path
    "imagefolder": "image",  # a user's images at dataset.path
    "austen": "text",
    "shakespeare": "text",
    "text": "text",  # a user's text at dataset.path
}
USER_DATA = frozenset({"npz", "imagefolder", "text"})  # read from dataset.path


def dataset_names(task: Task | None = None) -> list[str]:
    """Registered dataset names, all or those for one task ("image" or "text")."""
    return sorted(name for name, t in DATASET_TASKS.items() if task in (None, t))


def dataset_task(name: str) -> Task:
    """Whether dataset `name` is an "image" or a "text" dataset; ValueError if unknown."""
    if name not in DATASET_TASKS:
        raise ValueError(f"dataset: unknown dataset {name!r}; available: {dataset_names()}")
    return DATASET_TASKS[name]
