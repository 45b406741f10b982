"""A folder of a dataset.path swapped for a link out of the data roots after the path was
checked is refused, whichever loader reads it: what was opened is checked, not what was named.
The swap is made deterministic by doing it from a hook: right after the check by name, or
right before the file is opened."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgetrain.common import security
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.datasets.sources import DataFiles, user_data
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef
from edgetrain.common.security import RefusedError, open_inside
from edgetrain.common.settings import reload_settings

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 10
SECRET = "S3CRET " * 200


def write_text(folder: Path, content: str) -> None:
    folder.mkdir(parents=True)
    (folder / "a.txt").write_text(content)


def write_npz(folder: Path, value: int) -> None:
    folder.mkdir(parents=True)
    np.savez(folder / "a.npz", x=np.full((20, 28, 28), value, dtype=np.uint8), y=np.arange(20) % 2)


def write_images(folder: Path, value: int) -> None:
    for cls in ("ant", "cat"):
        (folder / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((28, 28), value, dtype=np.uint8), "L").save(folder / cls / f"{i}.png")


def write_mnist5k(folder: Path, value: int) -> None:
    folder.mkdir(parents=True)
    rows = np.hstack([np.full((20, 784), value), (np.arange(20) % 10)[:, None]])
    with gzip.open(folder / "mnist_5k.csv.gz", "wt") as f:
        np.savetxt(f, rows, delimiter=",", fmt="%d")


# dataset, model, path under the root, how to write its data (mine, or the secret outside)
CASES: dict[str, tuple[str, str, str, Callable[[Path, bool], None]]] = {
    "text file": ("text", "char_transformer", "user/sub/a.txt", lambda f, secret: write_text(f, SECRET if secret else TEXT)),
    "text folder": ("text", "char_transformer", "user/sub", lambda f, secret: write_text(f, SECRET if secret else TEXT)),
    "npz": ("npz", "smallcnn", "user/sub/a.npz", lambda f, secret: write_npz(f, 255 if secret else 0)),
    "imagefolder": ("imagefolder", "smallcnn", "user/sub", lambda f, secret: write_images(f, 255 if secret else 0)),
    "mnist5k at a path": ("mnist5k", "smallcnn", "user/sub", lambda f, secret: write_mnist5k(f, 255 if secret else 0)),
}


class Swap:
    """Replaces root/user/sub by a link to outside/sub, once, when `trigger(path)` first sees a path under it."""

    def __init__(self, root: Path, outside: Path):
        self.folder, self.target, self.done = root / "user" / "sub", outside / "sub", False

    def __call__(self, path: object) -> None:
        if not self.done and str(path).startswith(str(self.folder)):
            self.folder.rename(self.folder.with_name("sub.moved"))
            self.folder.symlink_to(self.target, target_is_directory=True)
            self.done = True


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    monkeypatch.setenv("EDGETRAIN_DATA_ROOTS", str(root))
    reload_settings()
    yield root, outside
    reload_settings()


def after_the_check(monkeypatch: pytest.MonkeyPatch, swap: Swap) -> None:
    """The swap right after a path is checked by name (where a loader that opens it again later races)."""
    check = security.confine

    def checked_then_swapped(path, roots, field, where):
        resolved = check(path, roots, field, where)
        swap(resolved)
        return resolved

    monkeypatch.setattr(security, "confine", checked_then_swapped)


def at_the_open(monkeypatch: pytest.MonkeyPatch, swap: Swap) -> None:
    """The swap right before the kernel opens the path (after every check by name)."""
    real_open = os.open

    def swapped_then_opened(path, flags, *args, **kwargs):
        swap(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swapped_then_opened)


@pytest.mark.parametrize("hook", [after_the_check, at_the_open])
@pytest.mark.parametrize("case", list(CASES))
def test_a_folder_swapped_for_a_link_out_of_the_roots_is_refused(roots, monkeypatch, case: str, hook) -> None:
    root, outside = roots
    name, model, path, write = CASES[case]
    write(root / "user" / "sub", False)
    write(outside / "sub", True)
    ref = DatasetRef(name=name, path=path)
    assert len(load_dataset(ref, get_model(model)).train) > 0  # read as usual without a swap
    swap = Swap(root, outside)
    hook(monkeypatch, swap)
    with pytest.raises(RefusedError, match=r"dataset.path: .* is outside the data roots"):
        load_dataset(ref, get_model(model))
    assert swap.done


@pytest.mark.parametrize("hook", [after_the_check, at_the_open])
def test_files_handed_to_torchvision_are_opened_and_checked_first(roots, monkeypatch, hook) -> None:
    root, outside = roots
    for folder, content in ((root / "user" / "sub" / "cifar-10-batches-py", TEXT), (outside / "sub" / "cifar-10-batches-py", SECRET)):
        write_text(folder, content)
    with user_data("user/sub").pinned() as pinned:
        assert (pinned / "cifar-10-batches-py" / "a.txt").read_text() == TEXT
        (root / "user" / "sub" / "cifar-10-batches-py" / "a.txt").write_text(SECRET)  # the same file, rewritten: still its content
    swap = Swap(root, outside)
    hook(monkeypatch, swap)
    with pytest.raises(RefusedError, match="is outside the data roots"), user_data("user/sub").pinned():
        pass
    assert swap.done


def test_what_was_opened_must_be_a_regular_file_or_a_folder(roots) -> None:
    root, _ = roots
    os.mkfifo(root / "fifo")  # opening it to read would block without a writer: it is refused at once
    with pytest.raises(RefusedError, match="is not a regular file"):
        open_inside(root / "fifo", [root])
    (root / "plain").write_text("x")
    with pytest.raises(NotADirectoryError):
        open_inside(root / "plain", [root], folder=True)
    assert DataFiles(root / "plain", (root,)).read_bytes() == b"x"
