"""Faults past the everyday ones, with real processes and the default settings: a device worker
frozen past its lease and replaced, which then wakes up; a hand-on that a crash interrupted;
an operator stopping tasks from outside (Flower's Terminate and Revoke, a warm shutdown); and,
with a job step's time limit of seconds, a control worker's pool process stopped while idle."""

import json
import signal
import time

import psutil
import pytest

from edgetrain.common.jobs.state import EventKind, PartState
from edgetrain.common.presets import long_fine_tune
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.tasks.contract import HANDED_ON, TaskName, send
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEFAULTS = Settings()
RECOVERY_S = DEFAULTS.lease_ttl_s + DEFAULTS.reaper_interval_s + 15


def wait_for(check, timeout_s: float, what: str, poll_s: float = 0.2):
    return poll_until(check, timeout_s, poll_s, what)


def checkpoints(folder, job_id: str) -> list[str]:
    return sorted(p.name for p in folder.glob(f"checkpoint-{job_id}-*"))


def test_a_frozen_device_worker_replaced_by_another_stops_at_once_when_it_wakes(tmp_path) -> None:
    artifacts = tmp_path / "artifacts"
    env = {"EDGETRAIN_CHECKPOINT_EVERY_S": "0", "EDGETRAIN_ARTIFACT_DIR": str(artifacts)}
    with LocalCluster(tmp_path, devices={"nano-z": "sim:jetson-nano"}, env=env) as cluster:
        client, store = EdgeTrainClient(cluster.redis_url), cluster.store()
        job_id = client.submit(long_fine_tune("nano-z"))
        wait_for(lambda: (c := store.jobs.checkpoint(job_id, "nano-z")) and c.samples >= 1024 or None, 240, "a checkpoint")
        old = cluster.worker("device-nano-z")
        old.signal(signal.SIGSTOP)  # frozen: no heartbeat, no lease renewal
        wait_for(lambda: store.fleet.owner("nano-z") is None or None, DEFAULTS.heartbeat_ttl_s + 10, "the device id to be free")
        wait_for(lambda: store.jobs.part(job_id, "nano-z").attempt is None or None, RECOVERY_S, "the lost attempt let go")
        new = cluster.add_device_worker("device-nano-z-2", "nano-z", "sim:jetson-nano")
        wait_for(lambda: (p := store.jobs.part(job_id, "nano-z")).attempt and p.attempt.number == 2 or None, 120, "the new attempt")
        old.signal(signal.SIGCONT)
        woke_at = time.monotonic()
        old.process.wait(timeout=30)  # it stops at once: its device id is served by another worker
        assert old.process.returncode == 7 and time.monotonic() - woke_at < 20, old.log.read_text()[-2000:]
        assert "this worker stops" in old.log.read_text()
        seen = []
        status = client.wait(job_id, timeout_s=300, on_update=lambda s: seen.append(p.samples) if (p := s.progress.get("nano-z")) else None)
        part = status.parts["nano-z"]
        assert part.state == PartState.completed, (part.reason, [e.line() for e in status.events])
        assert part.report.attempts == 2 and part.report.samples_processed == 12000
        assert seen == sorted(seen)  # progress never went backwards
        # the worker removes the checkpoints just after the part is recorded completed; the old
        # worker has exited, so none is re-created
        wait_for(lambda: checkpoints(artifacts, job_id) == [] or None, 30, "the checkpoints of the completed job removed")
        time.sleep(2)
        assert checkpoints(artifacts, job_id) == []
        assert new.alive() and store.fleet.owner("nano-z").endswith(f":{new.process.pid}")


def test_a_hand_on_interrupted_by_a_crash_is_completed_and_the_job_finishes(tmp_path) -> None:
    env = {"EDGETRAIN_CHECKPOINT_EVERY_S": "0"}
    with LocalCluster(tmp_path, devices={"nano-c": "sim:jetson-nano"}, env=env) as cluster:
        client, store = EdgeTrainClient(cluster.redis_url), cluster.store()
        job_id = client.submit(long_fine_tune("nano-c", max_samples=8000))
        wait_for(lambda: (c := store.jobs.checkpoint(job_id, "nano-c")) and c.samples >= 1024 or None, 240, "a checkpoint")
        cluster.kill("control")
        cluster.kill("device-nano-c")  # its message stays unacknowledged in the broker
        lease = next(lease for lease in store.liveness.running() if lease.task == "edgetrain.finetune")
        store.liveness.reap(lease)  # the reaper took the lease away, then died before putting the message back
        raw = store._redis
        assert raw.hlen("unacked") == 1 and raw.llen("device.nano-c") == 0
        cluster.restart("control", "device-nano-c")
        restarted_at = time.monotonic()
        resumed = wait_for(lambda: next((e for e in client.status(job_id).events if e.kind == EventKind.resumed), None),
                           RECOVERY_S + 60, "the fine-tune resumed")  # fmt: skip
        assert time.monotonic() - restarted_at < RECOVERY_S + 60
        status = client.wait(job_id, timeout_s=300)
        part = status.parts["nano-c"]
        assert part.state == PartState.completed and part.report.samples_processed == 8000, [e.line() for e in status.events]
        assert any("its unacknowledged message was put back on the queue" in e.message for e in status.events)
        assert resumed.fields["samples"] >= 1024


def test_a_warm_shutdown_checkpoints_the_fine_tune_and_the_next_worker_continues_it(tmp_path) -> None:
    with LocalCluster(tmp_path, devices={"nano-w": "sim:jetson-nano"}) as cluster:
        client, store = EdgeTrainClient(cluster.redis_url), cluster.store()
        job_id = client.submit(long_fine_tune("nano-w", max_samples=8000))
        wait_for(lambda: (p := store.jobs.progress(job_id, "nano-w")) and p.samples >= 1024 or None, 240, "fine-tuning progress")
        worker = cluster.worker("device-nano-w")
        worker.signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        worker.process.wait(timeout=60)
        assert time.monotonic() - stopped_at < 30 and worker.process.returncode == 0
        part = store.jobs.part(job_id, "nano-w")
        assert part.state == PartState.queued and part.attempt is None and "shutting down" in part.waiting
        kept = store.jobs.checkpoint(job_id, "nano-w")
        assert kept is not None and kept.samples >= 1024
        assert json.loads(store._redis.lindex("device.nano-w", 0))["headers"]["id"] == part.dispatch.token  # back on its queue
        cluster.restart("device-nano-w")
        status = client.wait(job_id, timeout_s=300)
        done = status.parts["nano-w"]
        assert done.state == PartState.completed and done.report.attempts == 2 and done.report.samples_processed == 8000
        assert done.report.lost_device_time_s == pytest.approx(0.0, abs=1e-9)  # nothing was lost


def test_steps_handed_to_a_stopped_control_pool_process_run_on_another_within_twice_their_time_limit(tmp_path) -> None:
    """A pool process stopped while idle is handed steps it never begins: no time limit runs for
    them and its worker heartbeats on. The reaper puts them back once held for twice a step's
    time limit and a lease (here 2 * 3 + 2 s), and the other pool process runs them."""
    limit_s, lease_s = 3, 2
    env = {"EDGETRAIN_CONTROL_TIME_LIMIT_S": str(limit_s), "EDGETRAIN_HEARTBEAT_S": "1", "EDGETRAIN_LEASE_TTL_S": str(lease_s),
           "EDGETRAIN_REAPER_INTERVAL_S": "1"}  # fmt: skip
    with LocalCluster(tmp_path, server_workers=0, control_concurrency=2, env=env) as cluster:
        pool = psutil.Process(cluster.worker("control").process.pid).children()
        assert len(pool) == 2
        pool[0].suspend()
        try:
            app = producer_app(Settings(redis_url=cluster.url))
            started = time.monotonic()
            steps = [send(app, TaskName.advance_job, f"no-such-job-{i}", awaited=True) for i in range(6)]
            assert [step.get(timeout=60) for step in steps] == ["unknown job"] * 6
            took_s = time.monotonic() - started
            assert cluster.store().monitoring.counts(HANDED_ON).get("control", 0) >= 1  # some went to the stopped one
            assert took_s < 2 * limit_s + lease_s + 20, took_s
            assert "holds it unstarted" in (tmp_path / "logs" / "control.log").read_text()
        finally:
            pool[0].resume()
