"""A device worker killed in the middle of a fine-tune: the task is redelivered when the
worker comes back and the job completes; nothing of the job is lost."""

import time

import pytest

from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.cluster import LocalCluster
from edgetrain.common.presets import quick_job

pytestmark = pytest.mark.e2e
VISIBILITY_S = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {"EDGETRAIN_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S)}
    with LocalCluster(tmp_path_factory.mktemp("faults"), devices={"nano-k": "sim:jetson-nano"}, env=env) as c:
        yield c


def test_fine_tune_survives_a_killed_device_worker(cluster) -> None:
    client = EdgeTrainClient(cluster.redis_url)
    spec = quick_job([{"device_id": "nano-k", "power_cap_w": 3.0}], target_accuracy=0.95)
    job_id = client.submit(spec)
    deadline = time.monotonic() + 180
    while not client.status(job_id).progress.get("nano-k") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.status(job_id).parts["nano-k"].state.value == "finetuning"
    cluster.kill("device-nano-k")
    killed_at = client.status(job_id).progress["nano-k"].samples
    cluster.restart("device-nano-k")
    status = client.wait(job_id, timeout_s=300)
    part = status.parts["nano-k"]
    assert part.state.value == "completed", (part.reason, status.events)
    assert part.report.reached and part.report.final_accuracy >= 0.95
    assert part.report.samples_processed > killed_at  # trained again from the start
