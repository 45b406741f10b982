"""Ready-made job specs: the quick job of `edgetrain demo`, also used by tests and benchmarks.

A small CNN fine-tuned from a seeded initialisation on the MNIST subset (5000 images) to 85 %,
with the relation vector estimated on scikit-learn's digits: minutes on a 2-core CPU."""

from __future__ import annotations

import copy
from typing import Any

QUICK_JOB: dict[str, Any] = {
    "model": "smallcnn",
    "weights": "init:0",
    "dataset": {"name": "mnist5k"},
    "proxy_dataset": {"name": "digits"},
    "target_accuracy": 0.85,
    "devices": [
        {"device_id": "nano-1", "power_cap_w": 3.0},
        {"device_id": "tx2nx-1", "power_cap_w": 5.0},
    ],
    "batch_sizes": [4, 8, 16, 32, 64, 128],
    "seeds": [0],
    "eval_every_samples": 256,
    "max_samples": 40000,
}


def quick_job(devices: list[dict[str, Any]] | None = None, **changes: Any) -> dict[str, Any]:
    """A copy of QUICK_JOB on `devices` (default: its own two), with `changes` applied."""
    job = copy.deepcopy(QUICK_JOB)
    if devices is not None:
        job["devices"] = copy.deepcopy(devices)
    job.update(copy.deepcopy(changes))
    return job
