"""The global model scored on the server's test set and on each device's own data.

A global test set balanced over classes does not show who a non-IID fleet leaves behind, so
every aggregated round also scores the global model on each device's held-out data: for a
device trained on a share of the job's dataset, the global model's accuracy on each class of the
held-out test split weighted by the classes of the device's share (the accuracy it would see on
held-out data drawn like its own; the splits here skew labels only); for a device with a
dataset of its own, that dataset's test split. One pass over the test split gives both the
global accuracy and every partitioned device's score."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..training import in_chunks
from .data import labels_of, num_classes, own_test_set, shares, test_set
from .rounds import State
from .spec import FederatedSpec


def class_hits(model: nn.Module, state: State, test: TensorDataset, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The global weights' correct predictions and targets per class on `test` (two arrays of
    `classes` counts; per target position for sequence targets)."""
    model.load_state_dict(state)
    x, y = test.tensors
    correct, count = torch.zeros(classes, dtype=torch.long), torch.zeros(classes, dtype=torch.long)
    for logits, chunk in in_chunks(model, x, y):  # local training may have moved the model to the GPU
        target = chunk.reshape(-1).cpu()
        hit = (logits.reshape(-1, logits.shape[-1]).argmax(-1).cpu() == target).long()
        count += torch.bincount(target, minlength=classes)[:classes]
        correct += torch.bincount(target, weights=hit, minlength=classes)[:classes].long()
    return correct.numpy(), count.numpy()


def score(spec: FederatedSpec, model: nn.Module, state: State) -> tuple[float, dict[str, float]]:
    """The global weights' accuracy on the server's test set (fraction) and on each device's
    held-out data (device id -> fraction; see the module docstring)."""
    test, classes = test_set(spec), num_classes(spec)
    correct, count = class_hits(model, state, test, classes)
    per_class = np.divide(correct, count, out=np.zeros(classes), where=count > 0)
    devices = {}
    for device_id, indices in shares(spec).items():
        mix = np.bincount(labels_of(spec)[indices].reshape(-1), minlength=classes)[:classes] * (count > 0)
        devices[device_id] = float(mix @ per_class / mix.sum()) if mix.sum() else 0.0
    for d in spec.devices:
        if d.dataset is not None:
            own = own_test_set(spec, d.device_id)
            hits, seen = class_hits(model, state, own, classes)
            devices[d.device_id] = float(hits.sum() / max(seen.sum(), 1))
    return float(correct.sum() / count.sum()), devices
