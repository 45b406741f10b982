"""Seeded splits of a dataset's training samples over devices (lists of sample indices), so a
non-IID fleet can be reproduced: every device computes its own share from the same seed."""

from __future__ import annotations

import numpy as np

from ..datasets.registry import training_samples
from .spec import FederatedSpec, Partition

MIN_SAMPLES = 8  # the fewest samples a device's share may hold


def share_problem(samples: int, devices: int, partition: Partition) -> str | None:
    """Why `samples` training samples cannot be split over `devices` devices under `partition`
    with MIN_SAMPLES in every share, as far as the count alone tells (a Dirichlet draw is only
    known on the labels); None when they can. Starts with the field to change."""
    if samples < devices * MIN_SAMPLES:
        return (f"dataset: {samples} training samples cannot give {devices} devices {MIN_SAMPLES} samples each "
                f"(at most {samples // MIN_SAMPLES} devices on this data)")  # fmt: skip
    per_device = partition.shards_per_device
    if partition.scheme == "shards" and samples // (devices * per_device) * per_device < MIN_SAMPLES:
        return f"partition.shards_per_device: {per_device} shards per device leave a device fewer than {MIN_SAMPLES} samples"
    return None


def spec_share_problem(spec: FederatedSpec) -> str | None:
    """`share_problem` of the job's dataset over the devices that hold no data of their own,
    where its size is known without reading it (common/datasets/registry.py); None otherwise."""
    samples = training_samples(spec.dataset) if spec.dataset is not None else None
    devices = len(spec.partitioned())
    return share_problem(samples, devices, spec.partition) if samples is not None and devices else None


def split(labels: np.ndarray, devices: int, partition: Partition) -> list[np.ndarray]:
    """Indices of `labels` for each of `devices` devices under `partition`; every sample is in
    at most one share (all of them for iid and shards), and every share holds at least
    MIN_SAMPLES (ValueError naming the field when the data cannot give that)."""
    if devices < 1:
        raise ValueError("devices: at least one device shares the dataset")
    if problem := share_problem(len(labels), devices, partition):
        raise ValueError(problem)
    rng = np.random.default_rng(partition.seed)
    if partition.scheme == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), devices)]
    if partition.scheme == "shards":
        return _shards(labels, devices, partition.shards_per_device, rng)
    return _dirichlet(labels, devices, partition.alpha, rng)


def _shards(labels: np.ndarray, devices: int, per_device: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sorted by label (ties in a seeded order), cut in devices * per_device shards, dealt at random."""
    order = np.lexsort((rng.permutation(len(labels)), labels))
    shards = np.array_split(order, devices * per_device)  # share_problem checked their size
    dealt = rng.permutation(len(shards))
    return [np.sort(np.concatenate([shards[k] for k in dealt[d * per_device : (d + 1) * per_device]])) for d in range(devices)]


def _dirichlet(labels: np.ndarray, devices: int, alpha: float, rng: np.random.Generator, tries: int = 100) -> list[np.ndarray]:
    """Each label's samples shared out by proportions ~ Dir(alpha) over the devices; drawn
    again (up to `tries` times) until every device holds MIN_SAMPLES."""
    classes = np.unique(labels)
    for _ in range(tries):
        shares: list[list[np.ndarray]] = [[] for _ in range(devices)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(devices, alpha))) * len(members)).astype(int)[:-1]
            for d, part in enumerate(np.split(members, cuts)):
                shares[d].append(part)
        parts = [np.sort(np.concatenate(s)) for s in shares]
        if min(len(p) for p in parts) >= MIN_SAMPLES:
            return parts
    raise ValueError(
        f"partition.alpha: Dir({alpha}) over {devices} devices left a device fewer than {MIN_SAMPLES} samples "
        f"in {tries} draws; use a larger alpha or fewer devices"
    )


def label_counts(labels: np.ndarray, parts: list[np.ndarray]) -> list[dict[int, int]]:
    """How many samples of each label every share holds (for reports)."""
    return [{int(c): int(n) for c, n in zip(*np.unique(labels[p], return_counts=True))} for p in parts]
