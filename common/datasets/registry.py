"""The dataset names edgetrain knows, the task each is for, the share of each kept for testing,
and the size of those whose size is fixed (no data is read here)."""

from __future__ import annotations

from ..models import Task
from ..schemas import DatasetRef

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
TEST_FRACTION: dict[Task, float] = {"image": 0.2, "text": 0.1}  # of the samples kept, the test split's share
SAMPLES = {  # samples of the image datasets of a fixed size, their splits joined
    "digits": 1797,
    "mnist5k": 5000,
    "fashion_mnist": 70_000,
    "cifar10": 60_000,
    "cifar100": 60_000,
    "svhn": 99_289,
    "stl10": 13_000,
}


def dataset_names(task: Task | None = None) -> list[str]:
    """Registered dataset names, all or those for one task ("image" or "text")."""
    return sorted(name for name, t in DATASET_TASKS.items() if task in (None, t))


def dataset_task(name: str) -> Task:
    """Whether dataset `name` is an "image" or a "text" dataset; ValueError if unknown."""
    if name not in DATASET_TASKS:
        raise ValueError(f"dataset: unknown dataset {name!r}; available: {dataset_names()}")
    return DATASET_TASKS[name]


def split_sizes(samples: int, fraction: float, test_fraction: float) -> tuple[int, int]:
    """(training, test) sample counts of a dataset of `samples` samples, subset to `fraction`
    and split with `test_fraction` held out (both at least 1)."""
    kept = max(2, int(round(samples * fraction)))
    test = max(1, int(round(kept * test_fraction)))
    return kept - test, test


def training_samples(ref: DatasetRef) -> int | None:
    """How many training samples `ref` gives, where its size is fixed (a registered image
    dataset from its usual place); None where it depends on the files."""
    if ref.name not in SAMPLES or ref.path is not None:
        return None
    return split_sizes(SAMPLES[ref.name], ref.fraction, TEST_FRACTION[dataset_task(ref.name)])[0]
