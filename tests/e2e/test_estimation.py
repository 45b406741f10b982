"""The relation vector on a pool of two real server worker processes."""

import re
import time

import pytest

from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e

REQUEST = {
    "model": "smallcnn",
    "weights": "init:0",
    "proxy_dataset": {"name": "digits"},
    "target_accuracy": 0.8,
    "batch_sizes": [8, 16, 32, 64],
    "seeds": [0, 1],
    "lr": {},
    "eval_every_samples": 128,
    "max_samples": 20000,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("pool"), server_workers=2) as c:
        yield c


def test_fan_out_over_two_server_workers_then_cache_hit(cluster) -> None:
    client = EdgeTrainClient(cluster.redis_url)
    vector = client.estimate(REQUEST, timeout_s=300)
    assert vector.batch_sizes == [8, 16, 32, 64] and vector.ratios[-1] == 1.0
    assert all(r is not None and r > 0 for r in vector.ratios)
    parts = cluster.store().resources.vector_parts(vector.key)
    assert len(parts) == 8
    assert len({p.worker for p in parts}) == 2, [p.worker for p in parts]
    started = time.monotonic()
    again = client.estimate(REQUEST, timeout_s=60)
    assert again == vector and time.monotonic() - started < 5
    assert len(cluster.store().resources.vector_parts(vector.key)) == 8  # nothing trained again


def test_censored_batch_size_is_reported(cluster) -> None:
    client = EdgeTrainClient(cluster.redis_url)
    vector = client.estimate(REQUEST | {"batch_sizes": [8, 128], "seeds": [0], "target_accuracy": 0.85, "max_samples": 2048}, timeout_s=300)
    assert vector.censored == [False, True]
    assert vector.ratios == [1.0, None] and vector.reference_batch_size == 8


def test_pretrain_on_the_server_publishes_weights(cluster, tmp) -> None:
    result = EdgeTrainClient(cluster.redis_url).pretrain("smallcnn", {"name": "digits"}, 1000, timeout_s=120, batch_size=32)
    assert re.fullmatch(r"artifact:smallcnn-digits-1000-[0-9a-f]{12}\.pt#sha256=[0-9a-f]{64}", result.weights)
    assert 0 < result.test_accuracy <= 1
