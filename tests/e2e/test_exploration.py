"""Exploration through the workers (real processes, two Nano twins, SIMULATED device time, real
training): the devices of one job that start at once do not explore the same batch size.

The data's records come from two real fine-tunes before (b=8 and b=128, one batch size a job);
then a job over both devices may use b=8, 32, 64 and 128. Under 3 W b=8 is the fastest measured
and b=32, which no run measured, may be up to 44 % faster: the proxy's r_b for b=32 and b=64
is set so that exploring b=32 fits the budget (3 % of the run's expected time) and b=64 does
not. So one device explores b=32 and the other, whose claim on it comes second, runs b=8 (as
the unit test of the claim: tests/common/test_closed_loop.py); without the claim both would
explore b=32. The vectors are stored as their proxy runs would store them: no server worker."""

from __future__ import annotations

import pytest

from edgetrain.common.keys import vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec, RelationVector
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.processes.cluster import LocalCluster
from edgetrain.workers.rendering.output import format_report

pytestmark = pytest.mark.e2e
DEVICES = ("nano-e", "nano-f")
PROXY = {8: 0.5, 32: 0.8, 64: 0.8, 128: 1.0}  # r_b; b=32 and b=64 no better than b=8 measures, at its point
TIMEOUT_S = 600


def job(devices: tuple[str, ...], batch_sizes: list[int]) -> dict:
    """The quick job under 3 W, evaluated every 64 samples (an evaluation interval is part of what exploring costs)."""
    return quick_job([{"device_id": d, "power_cap_w": 3.0} for d in devices], batch_sizes=batch_sizes, eval_every_samples=64)


def submit(cluster: LocalCluster, client: EdgeTrainClient, spec: dict) -> str:
    """Store `spec`'s relation vector as its proxy runs would, then submit it."""
    request = JobSpec.model_validate(spec).estimation_request()
    ratios = [PROXY[b] for b in request.batch_sizes]
    vector = RelationVector(batch_sizes=request.batch_sizes, ratios=ratios, samples_mean=[r * 20000 for r in ratios],
                            key=vector_key(request), request=request)  # fmt: skip
    cluster.store().resources.put_vector(vector)
    return client.submit(spec)


def test_the_devices_of_one_job_do_not_explore_the_same_batch_size(tmp_path) -> None:
    with LocalCluster(tmp_path, devices=dict.fromkeys(DEVICES, "sim:jetson-nano"), server_workers=0) as cluster:
        client = EdgeTrainClient(cluster.url)
        before = [submit(cluster, client, job((device,), [b])) for device, b in zip(DEVICES, (8, 128))]  # what the data measured
        for job_id in before:
            done = client.wait(job_id, timeout_s=TIMEOUT_S)
            assert done.state.value == "completed", [e.line() for e in done.events]
        job_id = submit(cluster, client, job(DEVICES, [8, 32, 64, 128]))
        assert client.wait(job_id, timeout_s=TIMEOUT_S).state.value == "completed"
        report = client.report(job_id)
    runs = {d.device_id: d.achieved for d in report.devices}
    text = format_report(report)
    explored = [run for run in runs.values() if run is not None and run.exploration is not None]
    assert len(explored) == 1, text
    (exploring,) = explored
    (other,) = [run for run in runs.values() if run is not exploring]
    assert exploring.exploration is not None and other is not None
    assert (exploring.exploration.batch_size, exploring.exploration.exploit_batch_size) == (32, 8), text
    assert exploring.exploration.against == [8, 128] and exploring.exploration.cost_bound <= 0.03, text
    assert exploring.configurations[0].batch_size == 32 and other.configurations[0].batch_size == 8, text
    assert "explored  : explored b=32 (else b=8)" in text
