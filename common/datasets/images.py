"""Image datasets: the loaders, each giving (N, C, H, W) images and labels, and the fit of
images to a model's input shape."""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from ..schemas import DatasetRef
from .sources import (
    FASHION_MNIST_FILES,
    SOURCES,
    TORCHVISION,
    DataFiles,
    DatasetMissingError,
    TorchvisionData,
    dataset_files,
    user_path,
)

PAD_LIMIT = 8  # pixels: larger size gaps are resized instead of padded


@dataclass(frozen=True)
class ImageArrays:
    """A loader's images (N, C, H, W) as uint8 or float in [0, 1], labels (N,) and the class count."""

    images: np.ndarray  # (N, C, H, W): uint8 in [0, 255] or float32 in [0, 1]
    labels: np.ndarray  # (N,) int64
    num_classes: int


def _digits(_ref: DatasetRef) -> ImageArrays:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    return ImageArrays(images, bunch.target.astype(np.int64), 10)


def _mnist5k(ref: DatasetRef) -> ImageArrays:
    with (dataset_files("mnist5k", ref.path) / "mnist_5k.csv.gz").open() as raw, gzip.open(raw, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)
    return ImageArrays(images, table[:, -1].astype(np.int64), 10)


def _read_idx(path: DataFiles) -> np.ndarray:
    with path.open() as raw, gzip.open(raw, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _fashion_mnist(ref: DatasetRef) -> ImageArrays:
    """Fashion-MNIST, train and test files joined (70,000 grey 28x28 images, 10 classes)."""
    folder = dataset_files("fashion_mnist", ref.path)
    tr_x, tr_y, te_x, te_y = (_read_idx(folder / f) for f in FASHION_MNIST_FILES)
    return ImageArrays(np.concatenate([tr_x, te_x])[:, None], np.concatenate([tr_y, te_y]).astype(np.int64), 10)


def _npz(ref: DatasetRef) -> ImageArrays:
    """A user's arrays: `.npz` with `x` (N, H, W) or (N, C, H, W) and `y` (N,) integer labels."""
    path = user_path(ref, "a .npz file with x and y", DataFiles.is_file)
    with path.open() as f, np.load(f) as arrays:
        x, y = arrays["x"].astype(np.float32), arrays["y"].astype(np.int64)
    if x.ndim == 3:
        x = x[:, None]
    if x.max() > 1.0:
        x = x / 255.0
    return ImageArrays(x, y, int(y.max()) + 1)


GREY_MODES = {"1", "L", "I", "I;16", "F"}  # PIL modes read as one grey channel


def _read_images(paths: list[DataFiles]) -> np.ndarray:
    """Images as (N, C, H, W) uint8: grey (C=1) if every image is grey, else RGB (C=3);
    images of another size than the most common one are resized to it."""
    from PIL import Image

    headers = []
    for p in paths:
        with p.open() as f, Image.open(f) as im:
            headers.append((im.mode, im.size))
    mode = "L" if all(m in GREY_MODES for m, _ in headers) else "RGB"
    size = Counter(s for _, s in headers).most_common(1)[0][0]
    pixels = []
    for p in paths:
        with p.open() as f, Image.open(f) as im:
            pixels.append(np.asarray(im.convert(mode).resize(size, Image.Resampling.BILINEAR)))
    x = np.stack(pixels)
    return x[:, None] if mode == "L" else x.transpose(0, 3, 1, 2)


def _imagefolder(ref: DatasetRef) -> ImageArrays:
    """A user's images in torchvision's ImageFolder layout, root/<class>/<image>, read as
    torchvision's ImageFolder finds them (files with an image extension, class folders by
    name, their subfolders included); class ids follow the sorted class folder names."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    root = user_path(ref, "a folder root/<class>/<image>", DataFiles.is_dir)
    classes = [name for name, is_folder in root.entries() if is_folder]
    samples = [
        (folder / name, label)
        for label, cls in enumerate(classes)
        for folder, names in (root / cls).walk()
        for name in names
        if name.lower().endswith(IMG_EXTENSIONS)
    ]
    empty = sorted(set(classes) - {classes[label] for _, label in samples})
    if not classes or empty:
        where = f"no image in the class folders {empty}" if empty else f"no class folder in {root.path}"
        raise DatasetMissingError(f"dataset 'imagefolder': {where} (images with extensions {list(IMG_EXTENSIONS)})")
    labels = np.array([label for _, label in samples], dtype=np.int64)
    return ImageArrays(_read_images([p for p, _ in samples]), labels, len(classes))


def _torchvision_images(name: str, tv: TorchvisionData, ref: DatasetRef) -> ImageArrays:
    """A torchvision dataset from local files, its splits joined (labels from torchvision); a
    dataset.path is handed to torchvision as its files opened and checked beforehand."""
    import torchvision.datasets

    files = dataset_files(name, ref.path)
    cls = getattr(torchvision.datasets, tv.cls)
    try:
        with files.pinned() as root:
            parts = [cls(str(root), download=False, **split) for split in tv.splits]
    except RuntimeError as exc:
        how = SOURCES[name].how_to_get
        raise DatasetMissingError(f"dataset {name!r}: files in {files.path} are incomplete or corrupted ({exc}); {how}") from exc
    images = np.concatenate([p.data if p.data.shape[1] == 3 else p.data.transpose(0, 3, 1, 2) for p in parts])
    labels = np.concatenate([np.asarray(p.targets if hasattr(p, "targets") else p.labels, dtype=np.int64) for p in parts])
    return ImageArrays(images, labels, tv.num_classes)


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


def unit_range(images: np.ndarray) -> np.ndarray:
    """uint8 images to float32 in [0, 1]; float images are already there."""
    return images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images


ImageLoader = Callable[[DatasetRef], ImageArrays]
IMAGE_LOADERS: dict[str, ImageLoader] = {
    "digits": _digits,
    "mnist5k": _mnist5k,
    "fashion_mnist": _fashion_mnist,
    "npz": _npz,
    "imagefolder": _imagefolder,
    **{name: partial(_torchvision_images, name, tv) for name, tv in TORCHVISION.items()},
}
