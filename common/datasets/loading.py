"""Loading a dataset shaped for a model, with a seeded subset and train/test split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..models import ModelEntry
from ..schemas import DatasetRef
from .images import IMAGE_LOADERS, adapt_images, unit_range
from .registry import TEST_FRACTION, dataset_names, dataset_task, split_sizes
from .text import TEXT_LOADERS, VOCAB, encode_text, text_windows


@dataclass
class LoadedDataset:
    """A dataset shaped for a model: train and test splits and the class (or vocabulary) count."""

    name: str
    train: TensorDataset
    test: TensorDataset
    num_classes: int


def _subset_and_split(n: int, fraction: float, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    train, test = split_sizes(n, fraction, test_fraction)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: train + test]
    return order[test:].numpy(), order[:test].numpy()


def _text_samples(ref: DatasetRef, model: ModelEntry) -> tuple[np.ndarray, np.ndarray]:
    ids = encode_text(TEXT_LOADERS[ref.name](ref))
    length = model.input_shape[0]
    if len(ids) < 2 * length + 1:
        raise ValueError(
            f"dataset {ref.name!r}: {len(ids)} characters in the vocabulary; model {model.name!r} "
            f"needs at least {2 * length + 1} (two windows of {length})"
        )
    return text_windows(ids, length)


def load_dataset(ref: DatasetRef, model: ModelEntry, seed: int = 0) -> LoadedDataset:
    """Load `ref` shaped for `model`, with a seeded subset and train/test split."""
    task = dataset_task(ref.name)
    if task != model.task:
        raise ValueError(
            f"dataset {ref.name!r} is for {task} models, model {model.name!r} takes {model.task} input; "
            f"{model.task} datasets: {dataset_names(model.task)}"
        )
    if task == "text":
        x, y = _text_samples(ref, model)
        num_classes = len(VOCAB)
    else:
        arrays = IMAGE_LOADERS[ref.name](ref)
        x, y, num_classes = arrays.images, arrays.labels, arrays.num_classes
    train_idx, test_idx = _subset_and_split(len(y), ref.fraction, TEST_FRACTION[task], seed)

    def tensors(idx: np.ndarray) -> TensorDataset:
        inputs = adapt_images(unit_range(x[idx]), model.input_shape) if task == "image" else torch.from_numpy(x[idx])
        return TensorDataset(inputs, torch.from_numpy(y[idx]))

    return LoadedDataset(ref.name, tensors(train_idx), tensors(test_idx), num_classes)
