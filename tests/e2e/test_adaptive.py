"""End to end: a running fine-tune follows power caps set from the client and the CLI through
Redis, on a real device worker (a Nano twin, SIMULATED figures)."""

import subprocess
import sys

import pytest

from edgetrain.common.jobs.state import EventKind, PartState
from edgetrain.common.presets import quick_job
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_a_running_fine_tune_switches_pauses_and_resumes_with_the_caps_set_on_its_device(tmp_path) -> None:
    with LocalCluster(tmp_path, devices={"nano-c": "sim:jetson-nano"}) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        target = [{"device_id": "nano-c", "power_cap_w": 6.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}]
        job_id = client.submit(quick_job(target, target_accuracy=0.9, max_samples=12000))  # runs its whole budget
        poll_until(lambda: client.status(job_id).progress.get("nano-c"), 240, 0.2, "fine-tuning progress")
        client.set_power_cap("nano-c", 3.5)

        def reconfigured(count: int):  # for a cap: a switch at set-up or later may be one for evidence
            events = [e for e in client.status(job_id).events if e.kind == EventKind.reconfigured and "evidence" not in e.line()]
            return events if len(events) >= count else None

        poll_until(lambda: reconfigured(1), 60, 0.2, "the switch for 3.5 W")
        cli = [sys.executable, "-m", "edgetrain.workers.cli", "--redis-url", cluster.redis_url, "cap", "nano-c", "1.0"]
        assert subprocess.run(cli, capture_output=True, text=True, timeout=60).returncode == 0
        waiting = poll_until(lambda: client.status(job_id).parts["nano-c"].waiting, 60, 0.2, "the pause in status")
        assert waiting.startswith("paused: power cap 1.00 W is below what any configuration needs")
        assert client.status(job_id).progress["nano-c"].paused
        client.set_power_cap("nano-c", None)
        status = client.wait(job_id, timeout_s=300)
        part = status.parts["nano-c"]
        assert part.state == PartState.completed, (part.reason, [e.line() for e in status.events])
        report = part.report
        switches = [s for s in report.switches if s.cause in ("cap", "pause", "resume")]  # not the power guard's steps nor evidence
        assert [s.cause for s in switches][:3] == ["cap", "pause", "resume"]
        first, pause, resume = switches[:3]
        assert first.power_cap_w == 3.5
        assert (first.old_batch_size, first.old_frequency_hz) != (first.new_batch_size, first.new_frequency_hz)
        assert resume.power_cap_w is None and resume.samples == pause.samples
        assert report.paused_s > 0 and report.attempts == 1
        assert 12000 <= report.samples_processed < 12000 + 128  # the budget, counted once, to the step that passed it
        assert report.guard.peak_power_w > 0
        assert part.waiting is None
