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


def long_fine_tune(device_id: str, max_samples: int = 12000, eval_every_samples: int = 1024, **changes: Any) -> dict[str, Any]:
    """A quick job on `device_id` under 3 W whose fine-tune runs its whole budget of `max_samples`
    (the proxy, digits, reaches 90 %; a tenth of Fashion-MNIST does not), evaluated (and
    checkpointed) every `eval_every_samples`: a fine-tune to stop, kill or freeze mid-way."""
    target = [{"device_id": device_id, "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}]
    job = {"target_accuracy": 0.9, "max_samples": max_samples, "batch_sizes": [16, 64], "eval_every_samples": eval_every_samples}
    return quick_job(target, **(job | changes))
