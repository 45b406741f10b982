"""A fleet's everyday faults with real processes and the default timeouts: workers killed with
SIGKILL, Redis killed and restarted, devices that never come back, models that crash their
process. Recovery comes from liveness (task leases, heartbeats), within a minute."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgetrain.common.jobs.state import EventKind, PartState
from edgetrain.common.keys import table_id, table_resource, vector_resource
from edgetrain.common.presets import long_fine_tune, quick_job
from edgetrain.common.settings import Settings
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.processes.cluster import EmbeddedRedis, LocalCluster

pytestmark = pytest.mark.e2e
DEFAULTS = Settings()
# the stated bound after the holder stops, with slack for a machine that runs other tests beside
RECOVERY_S = DEFAULTS.lease_ttl_s + DEFAULTS.reaper_interval_s + 30
NANO_TABLE = table_id("jetson-nano", "smallcnn", [1, 28, 28])


def wait_for(check, timeout_s: float, what: str, poll_s: float = 0.2):
    return poll_until(check, timeout_s, poll_s, what)


def kinds(status) -> list[EventKind]:
    return [e.kind for e in status.events]


def lease_of(cluster, task: str):
    return next((lease for lease in cluster.store().liveness.running() if lease.task == task), None)


def kill_mid_run(cluster, worker: str, task: str) -> None:
    """SIGKILL `worker` while it runs `task`. A run seen just before it ended may end before the
    kill lands, between two runs (nothing is lost then): the worker is started again and killed
    at its next run. Once the worker is dead, a lease of `task` still held is a lost run's."""
    while True:
        wait_for(lambda: lease_of(cluster, task), 120, f"{task} in progress")
        cluster.kill(worker)
        if lease_of(cluster, task) is not None:
            return
        cluster.restart(worker)


@pytest.fixture
def redis_aof(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis", persistent=True)
    yield server
    server.stop()


def test_a_fine_tune_whose_device_worker_is_killed_resumes_from_its_checkpoint(tmp_path) -> None:
    env = {"EDGETRAIN_CHECKPOINT_EVERY_S": "0"}  # a checkpoint at every evaluation (not a recovery timeout)
    with LocalCluster(tmp_path, devices={"nano-k": "sim:jetson-nano"}, env=env) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(long_fine_tune("nano-k"))
        store = cluster.store()

        def checkpoint_past_2048():
            checkpoint = store.jobs.checkpoint(job_id, "nano-k")
            return checkpoint if checkpoint is not None and checkpoint.samples >= 2048 else None

        checkpoint = wait_for(checkpoint_past_2048, 240, "a checkpoint")
        cluster.kill("device-nano-k")
        killed_at = time.monotonic()
        cluster.restart("device-nano-k")
        lost = wait_for(lambda: EventKind.attempt_lost in kinds(client.status(job_id)) or None, RECOVERY_S + 30, "the lost attempt")
        assert lost and time.monotonic() - killed_at < RECOVERY_S + 30
        status = client.wait(job_id, timeout_s=300)
        part = status.parts["nano-k"]
        assert part.state == PartState.completed, (part.reason, [e.line() for e in status.events])
        report = part.report
        assert report.attempts == 2 and report.samples_processed == 12000  # the budget, counted once
        resumed = next(e for e in status.events if e.kind == EventKind.resumed)
        resumed_at = resumed.fields["samples"]
        assert resumed_at >= checkpoint.samples  # continued from the checkpoint, not from zero
        assert report.lost_device_time_s >= 0 and report.device_time_s > checkpoint.device_time_s


def test_a_killed_server_worker_loses_nothing_and_the_vector_is_exact(tmp_path) -> None:
    with LocalCluster(tmp_path, devices={"nano-s": "sim:jetson-nano"}) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(quick_job([{"device_id": "nano-s", "power_cap_w": 3.0}], batch_sizes=[16, 64], seeds=[0, 1]))
        kill_mid_run(cluster, "server-0", "edgetrain.train_proxy")
        killed_at = time.monotonic()
        cluster.restart("server-0")
        wait_for(lambda: EventKind.attempt_lost in kinds(client.status(job_id)) or None, RECOVERY_S, "the lost proxy run handed on")
        assert time.monotonic() - killed_at < RECOVERY_S
        status = client.wait(job_id, timeout_s=300)
        assert status.state.value == "completed", [e.line() for e in status.events]
        vector_key = next(e.fields["vector"] for e in status.events if e.kind == EventKind.estimating)
        parts = cluster.store().resources.vector_parts(vector_key)
        assert sorted((p.batch_size, p.seed) for p in parts) == [(16, 0), (16, 1), (64, 0), (64, 1)]  # each run once
        assert cluster.store().monitoring.counts("handed_on")["server"] >= 1  # what edgetrain_tasks_handed_on_total reports


def test_a_redis_restart_while_a_device_profiles_loses_nothing(tmp_path, redis_aof) -> None:
    with LocalCluster(tmp_path / "cluster", devices={"nano-r": "sim:jetson-nano"}, redis_url=redis_aof.url) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(quick_job([{"device_id": "nano-r", "power_cap_w": 3.0}]))
        wait_for(lambda: lease_of(cluster, "edgetrain.profile_device"), 120, "profiling in progress")
        redis_aof.kill()
        time.sleep(3)
        redis_aof.start()
        try:
            status = client.wait(job_id, timeout_s=300)
        except TimeoutError:
            pytest.fail(f"not finished: {[e.line() for e in client.status(job_id).events]}")
        assert status.state.value == "completed", [e.line() for e in status.events]
        assert cluster.store().resources.table(NANO_TABLE) is not None


def test_a_six_second_redis_outage_does_not_restart_a_fine_tune(tmp_path, redis_aof) -> None:
    with LocalCluster(tmp_path / "cluster", devices={"nano-b": "sim:jetson-nano"}, redis_url=redis_aof.url) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(long_fine_tune("nano-b", eval_every_samples=256))  # slower: it outlasts the outage
        wait_for(lambda: client.status(job_id).progress.get("nano-b"), 240, "fine-tuning progress")
        redis_aof.kill()
        time.sleep(6)
        redis_aof.start()
        status = client.wait(job_id, timeout_s=300)
        part = status.parts["nano-b"]
        assert part.state == PartState.completed, (part.reason, [e.line() for e in status.events])
        assert part.report.attempts == 1 and part.report.samples_processed == 12000


def test_a_device_that_never_comes_back_fails_its_part_after_the_grace_period(tmp_path) -> None:
    with LocalCluster(tmp_path, devices={"nano-g": "sim:jetson-nano"}) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(long_fine_tune("nano-g", device_grace_s=10))
        wait_for(lambda: client.status(job_id).progress.get("nano-g"), 240, "fine-tuning progress")
        cluster.kill("device-nano-g")
        killed_at = time.monotonic()
        waiting = wait_for(lambda: w if (w := client.status(job_id).parts["nano-g"].waiting) and "has not been heard from since" in w else None,
                           90, "status saying the device is missing")  # fmt: skip
        assert "the part fails at" in waiting
        status = client.wait(job_id, timeout_s=120)
        part = status.parts["nano-g"]
        assert part.state == PartState.failed and part.reason.startswith("device 'nano-g' disappeared at ")
        assert time.monotonic() - killed_at < DEFAULTS.heartbeat_ttl_s + 10 + RECOVERY_S


def test_a_device_lost_while_profiling_does_not_block_another_of_its_type(tmp_path) -> None:
    devices = {"nano-a": "sim:jetson-nano", "nano-b": "sim:jetson-nano"}
    with LocalCluster(tmp_path, devices=devices) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        slow = {"batch_sizes": [16, 64], "profiling": {"measure_batches": 50}}
        first = client.submit(quick_job([{"device_id": "nano-a", "power_cap_w": 3.0}], device_grace_s=15, **slow))
        wait_for(lambda: lease_of(cluster, "edgetrain.profile_device"), 120, "profiling on nano-a")
        second = client.submit(quick_job([{"device_id": "nano-b", "power_cap_w": 3.0}], **slow))
        wait_for(lambda: client.status(second).parts["nano-b"].state == PartState.profiling or None, 60, "the second job waiting")
        assert cluster.store().coordination.holder(table_resource(NANO_TABLE)).startswith(f"{first}/")
        cluster.kill("device-nano-a")
        status = client.wait(second, timeout_s=RECOVERY_S + 240)
        assert status.state.value == "completed", [e.line() for e in status.events]
        assert any(e.kind == EventKind.profiling and e.device_id == "nano-b" for e in status.events)
        lost = client.wait(first, timeout_s=120)
        assert lost.parts["nano-a"].reason.startswith("device 'nano-a' disappeared")


def _module(folder, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def test_a_model_that_kills_its_process_fails_the_part_and_the_worker_lives_on(tmp_path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    _module(models, "suicidal", """
        import os, signal
        input_shape = (1, 28, 28)
        def factory(num_classes, input_shape):
            os.kill(os.getpid(), signal.SIGKILL)
        factory.input_shape = input_shape
    """)  # fmt: skip
    env = {"PYTHONPATH": f"{models}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "EDGETRAIN_ALLOWED_MODEL_MODULES": "suicidal"}
    with LocalCluster(tmp_path / "cluster", devices={"nano-x": "sim:jetson-nano"}, env=env) as cluster:
        sys.path.insert(0, str(models))
        try:
            client = EdgeTrainClient(cluster.redis_url)
            status = client.wait(
                client.submit(quick_job([{"device_id": "nano-x", "power_cap_w": 3.0}], model="suicidal:factory")), timeout_s=180
            )
        finally:
            sys.path.remove(str(models))
        part = status.parts["nano-x"]
        assert part.state == PartState.failed and "its process died" in part.reason and "SIGKILL" in part.reason, part.reason
        vector = next(e.fields["vector"] for e in status.events if e.kind == EventKind.estimating)
        assert poll_until(
            lambda: cluster.store().coordination.failure(vector_resource(vector)), 60, 0.2, "the vector failed"
        ).reason.startswith("proxy training b=4 seed=0 its process died")  # at its first run's death, not after every run and retry
        assert cluster.worker("device-nano-x").alive()
        again = client.wait(client.submit(quick_job([{"device_id": "nano-x", "power_cap_w": 3.0}], batch_sizes=[16, 64])), timeout_s=300)
        assert again.state.value == "completed", [e.line() for e in again.events]


def test_a_planning_error_fails_the_part_with_its_reason(tmp_path) -> None:
    env = {"EDGETRAIN_ALLOWED_MODEL_MODULES": "clientside"}  # allowed, but not installed on the workers
    cluster_dir = tmp_path / "cluster"
    with LocalCluster(cluster_dir, devices={"nano-p": "sim:jetson-nano"}, server_workers=0, env=env) as cluster:  # fails in planning
        client = EdgeTrainClient(cluster.redis_url)
        job_id = client.submit(quick_job([{"device_id": "nano-p", "power_cap_w": 3.0}], model="clientside:factory"))
        status = client.wait(job_id, timeout_s=60)
        part = status.parts["nano-p"]
        assert part.state == PartState.failed and part.reason.startswith("planning failed:") and "clientside" in part.reason


def test_a_failure_is_not_reused_by_a_later_job_once_the_cause_is_fixed(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    proxy = data / "proxy.npz"
    proxy.write_bytes(b"not an npz file")
    env = {"EDGETRAIN_DATA_DIR": str(data)}
    with LocalCluster(tmp_path / "cluster", devices={"nano-f": "sim:jetson-nano"}, env=env) as cluster:
        client = EdgeTrainClient(cluster.redis_url)
        target = {"device_id": "nano-f", "power_cap_w": 3.0}
        spec = quick_job([target], proxy_dataset={"name": "npz", "path": proxy.name}, batch_sizes=[16, 64])
        first = client.wait(client.submit(spec), timeout_s=300)
        assert first.state.value == "failed" and "relation vector estimation failed" in first.parts["nano-f"].reason
        import numpy as np
        from sklearn.datasets import load_digits

        digits = load_digits()
        np.savez(proxy, x=(digits.images * 16).astype("uint8"), y=digits.target)
        second = client.wait(client.submit(spec), timeout_s=300)
        assert second.state.value == "completed", [e.line() for e in second.events]


def test_a_second_worker_with_the_same_device_id_is_refused(tmp_path) -> None:
    with LocalCluster(tmp_path, devices={"nano-d": "sim:jetson-nano"}, server_workers=0) as cluster:  # no job runs
        env = {**os.environ, "EDGETRAIN_REDIS_URL": cluster.redis_url}
        cmd = [sys.executable, "-m", "edgetrain.workers.cli", "worker", "device", "--device-id", "nano-d", "--backend", "sim:jetson-nano"]
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 7 and "is served by another live worker (device-nano-d@" in second.stderr, second.stderr
        assert cluster.worker("device-nano-d").alive()
        assert cluster.store().fleet.owner("nano-d").split(":")[-1] == str(cluster.worker("device-nano-d").process.pid)
        cluster.worker("device-nano-d").signal(signal.SIGTERM)
