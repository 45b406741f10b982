"""The data of a federated job: each device's training share and the server's test set."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..datasets.loading import LoadedDataset, load_dataset
from ..models import get_model
from ..schemas import DatasetRef
from .partition import split
from .spec import FederatedSpec

SPLIT_SEED = 0  # the train/test split every federated job of a dataset uses


def _loaded(ref: DatasetRef, model: str) -> LoadedDataset:
    """The dataset shaped for `model`, loaded once per process (a worker serves many rounds)."""
    return _load(ref.model_dump_json(), model)


@lru_cache(maxsize=4)
def _load(ref: str, model: str) -> LoadedDataset:
    return load_dataset(DatasetRef.model_validate_json(ref), get_model(model), SPLIT_SEED)


def shares(spec: FederatedSpec) -> dict[str, np.ndarray]:
    """The training-sample indices of the job's dataset each partitioned device holds."""
    partitioned = spec.partitioned()
    if not partitioned:
        return {}
    return dict(zip(partitioned, split(labels_of(spec), len(partitioned), spec.partition)))


def labels_of(spec: FederatedSpec) -> np.ndarray:
    """The training labels of the job's dataset (the one split over the partitioned devices)."""
    assert spec.dataset is not None, "a spec with partitioned devices names a dataset"
    return _loaded(spec.dataset, spec.model).train.tensors[1].numpy()


def device_data(spec: FederatedSpec, device_id: str, indices: np.ndarray | None = None) -> TensorDataset:
    """The training data `device_id` holds: its own dataset's training split, or its share of
    the job's dataset (`indices`, computed from the spec when not given)."""
    device = next(d for d in spec.devices if d.device_id == device_id)
    if device.dataset is not None:
        return _loaded(device.dataset, spec.model).train
    assert spec.dataset is not None
    idx = torch.from_numpy(shares(spec)[device_id] if indices is None else indices)
    x, y = _loaded(spec.dataset, spec.model).train.tensors
    return TensorDataset(x[idx], y[idx])


def test_set(spec: FederatedSpec) -> TensorDataset:
    """The server's global test set: the test split of `test_dataset`."""
    return _loaded(spec.test_dataset, spec.model).test


def own_test_set(spec: FederatedSpec, device_id: str) -> TensorDataset:
    """The test split of the dataset `device_id` holds of its own (its held-out data)."""
    device = next(d for d in spec.devices if d.device_id == device_id)
    assert device.dataset is not None, "the device names a dataset of its own"
    return _loaded(device.dataset, spec.model).test


def num_classes(spec: FederatedSpec) -> int:
    """Classes of the global model's head (those of the global test set)."""
    return _loaded(spec.test_dataset, spec.model).num_classes
