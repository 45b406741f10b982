"""An operator stopping tasks from outside, with real processes and a real Flower: Terminate and
Revoke (Flower's HTTP API, as its task page's buttons send them) on a running and on a queued
fine-tune and on a running proxy run. Each ends its part in a state that says what happened,
at once, and `edgetrain requeue` then completes it."""

from __future__ import annotations

import time
import urllib.request

import pytest

from edgetrain.common.jobs.state import TERMINAL, EventKind, PartState
from edgetrain.common.presets import long_fine_tune
from edgetrain.common.testing.flower import flower
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEVICE = "nano-o"
STOPPED_S = 20  # a stop ends the part within this long (well inside a lease)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("operator")
    env = {"EDGETRAIN_CHECKPOINT_EVERY_S": "0"}
    with LocalCluster(base, devices={DEVICE: "sim:jetson-nano"}, env=env) as cluster, flower(cluster.redis_url) as api:
        yield cluster, EdgeTrainClient(cluster.redis_url), api


def press(api: str, task_id: str, terminate: bool) -> None:
    """Flower's Terminate (terminate=true) or Revoke button on a task's page."""
    request = urllib.request.Request(f"{api}/task/revoke/{task_id}?terminate={'true' if terminate else 'false'}", method="POST", data=b"")
    assert urllib.request.urlopen(request, timeout=30).status == 200


def running_fine_tune(client: EdgeTrainClient, job_id: str, samples: int = 1024):
    return poll_until(lambda: (p := client.status(job_id).progress.get(DEVICE)) and p.samples >= samples and p or None,
                      300, 0.3, "fine-tuning progress")  # fmt: skip


def ended(client: EdgeTrainClient, job_id: str, state: PartState):
    part = poll_until(lambda: (p := client.status(job_id).parts[DEVICE]).state in TERMINAL and p or None,
                      STOPPED_S, 0.2, f"the part of {job_id} to end")  # fmt: skip
    assert part.state == state, (part.state, part.reason)
    return part


def test_terminate_on_a_running_fine_tune_cancels_its_part_and_requeue_continues_from_its_checkpoint(fleet) -> None:
    cluster, client, api = fleet
    job_id = client.submit(long_fine_tune(DEVICE, max_samples=6000, eval_every_samples=256))
    running_fine_tune(client, job_id)
    token = client.status(job_id).parts[DEVICE].dispatch.token
    pressed_at = time.monotonic()
    press(api, token, terminate=True)
    part = ended(client, job_id, PartState.cancelled)
    assert "terminated by an operator" in part.reason and "`edgetrain requeue` continues from it" in part.reason, part.reason
    assert time.monotonic() - pressed_at < STOPPED_S
    kept = cluster.store().jobs.checkpoint(job_id, DEVICE)
    assert kept is not None and kept.samples >= 1024
    client.requeue(job_id, DEVICE)
    status = client.wait(job_id, timeout_s=300)
    done = status.parts[DEVICE]
    last = [e.line() for e in status.events][-6:]
    assert done.state == PartState.completed and done.report.samples_processed == 6000, (done.reason, last)
    resumed = next(e for e in status.events if e.kind == EventKind.resumed)
    assert resumed.fields["samples"] >= kept.samples


def test_revoke_on_a_queued_fine_tune_cancels_its_part_when_the_device_reaches_it(fleet) -> None:
    _, client, api = fleet
    busy = client.submit(long_fine_tune(DEVICE, eval_every_samples=256))
    running_fine_tune(client, busy, samples=256)
    queued = client.submit(long_fine_tune(DEVICE, eval_every_samples=256))  # its table and vector are the busy job's
    token = poll_until(lambda: (p := client.status(queued).parts[DEVICE]).dispatch and p.dispatch.token, 120, 0.3, "the second dispatch")
    press(api, token, terminate=False)
    client.cancel(busy)  # the device moves on to the revoked message
    assert ended(client, busy, PartState.cancelled)
    part = ended(client, queued, PartState.cancelled)
    assert "was revoked before it ran" in part.reason, part.reason
    client.requeue(queued, DEVICE)
    status = client.wait(queued, timeout_s=400)
    assert status.parts[DEVICE].state == PartState.completed, [e.line() for e in status.events]


def test_terminate_on_a_running_proxy_run_fails_the_vector_with_the_reason_and_requeue_estimates_again(fleet) -> None:
    cluster, client, api = fleet
    job_id = client.submit(long_fine_tune(DEVICE, max_samples=6000, eval_every_samples=256, seeds=[7]))  # a vector of its own
    lease = poll_until(lambda: next((x for x in cluster.store().liveness.running() if x.task == "edgetrain.train_proxy"), None),
                       120, 0.2, "a proxy run")  # fmt: skip
    press(api, lease.task_id, terminate=True)
    part = poll_until(lambda: (p := client.status(job_id).parts[DEVICE]).state == PartState.failed and p or None, STOPPED_S + 10, 0.2,
                      "the part to fail")  # fmt: skip
    assert "proxy training b=" in part.reason and "terminated by an operator" in part.reason, part.reason
    client.requeue(job_id, DEVICE)
    status = client.wait(job_id, timeout_s=400)
    assert status.parts[DEVICE].state == PartState.completed, [e.line() for e in status.events]
