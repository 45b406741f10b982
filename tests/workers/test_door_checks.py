"""What a worker would refuse once a job runs, refused at submission where the client can know
it: a federated split of a dataset of known size into shares of fewer than 8 samples, a dataset
for another task than the model's. The counts the client uses are those loading gives."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.datasets.registry import training_samples
from edgetrain.common.federated.partition import MIN_SAMPLES, share_problem, split
from edgetrain.common.federated.spec import Partition
from edgetrain.common.models import get_model
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DatasetRef
from edgetrain.tasks.contract import CONTROL_QUEUE
from edgetrain.workers.cli_args import ExitCode

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]


def federated(devices: int, **changes: object) -> dict:
    return {"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
            "target_accuracy": 0.8, "devices": [{"device_id": f"d{i}"} for i in range(devices)]} | changes  # fmt: skip


def submit(spec: dict, redis_url: str, tmp) -> subprocess.CompletedProcess:
    (tmp / "job.json").write_text(json.dumps(spec))
    return subprocess.run([*CLI, "submit", str(tmp / "job.json"), "--redis-url", redis_url], capture_output=True, text=True, timeout=120)


def test_a_federated_split_the_dataset_cannot_give_is_refused_at_submission_and_nothing_is_stored(store, redis_server, tmp) -> None:
    done = submit(federated(1000), redis_server.url, tmp)
    assert done.returncode == ExitCode.usage, (done.stdout, done.stderr)
    assert done.stderr == ("invalid federated job spec:\n  dataset: 1438 training samples cannot give 1000 devices 8 samples each "
                           "(at most 179 devices on this data)\n")  # fmt: skip
    shards = submit(federated(100, partition={"scheme": "shards", "shards_per_device": 50}), redis_server.url, tmp)
    assert (
        shards.returncode == ExitCode.usage
        and "partition.shards_per_device: 50 shards per device leave a device fewer than 8" in shards.stderr
    )
    assert store.federated.job_ids(10) == [] and store.jobs.job_ids() == []
    accepted = submit(federated(179), redis_server.url, tmp)
    assert accepted.returncode == ExitCode.ok, accepted.stderr
    store.clear()
    redis.Redis.from_url(redis_server.url).delete(CONTROL_QUEUE)  # its first step, which no worker here takes


def test_a_dataset_for_another_task_than_the_model_s_is_refused_at_submission(store, redis_server, tmp) -> None:
    spec = quick_job([{"device_id": "nano-7", "power_cap_w": 3.0, "dataset": {"name": "austen"}}], proxy_dataset={"name": "shakespeare"})
    done = submit(spec, redis_server.url, tmp)
    assert done.returncode == ExitCode.usage and store.jobs.job_ids() == []
    assert "proxy_dataset.name: 'shakespeare' is a text dataset; model 'smallcnn' takes image input: ['cifar10'" in done.stderr
    assert "devices.0.dataset.name: 'austen' is a text dataset; model 'smallcnn' takes image input" in done.stderr, done.stderr


@pytest.mark.parametrize("name, fraction", [("digits", 1.0), ("digits", 0.3), ("mnist5k", 1.0), ("mnist5k", 0.05)])
def test_the_counts_known_at_submission_are_those_the_workers_load_and_split(name: str, fraction: float) -> None:
    ref = DatasetRef(name=name, fraction=fraction)
    labels = load_dataset(ref, get_model("smallcnn")).train.tensors[1].numpy()
    assert training_samples(ref) == len(labels)
    most = len(labels) // MIN_SAMPLES
    for scheme in ("iid", "shards"):
        partition = Partition(scheme=scheme, shards_per_device=1)
        assert share_problem(len(labels), most, partition) is None and min(map(len, split(labels, most, partition))) >= MIN_SAMPLES
        assert share_problem(len(labels), most + 1, partition) is not None
        with pytest.raises(ValueError, match="cannot give"):
            split(labels, most + 1, partition)
    assert training_samples(DatasetRef(name="npz", path="x.npz")) is None  # a user's data: known once read
