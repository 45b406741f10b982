"""Workers live through what Redis hands them, with real processes and default settings: a
malformed message on any queue, an evicting Redis, a full one, a restart without persistence;
a device worker whose pool process passes its memory limit goes on with a new one; and they
stop within seconds of SIGTERM when Redis is gone too.

The tests share one cluster (control, server and device workers) and run in file order: the
last one stops Redis for good."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from celery.result import AsyncResult

from edgetrain.common.presets import quick_job
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName, device_queue
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.processes.cluster import EmbeddedRedis, LocalCluster, WorkerProcess

pytestmark = pytest.mark.e2e
DEVICE = "nano-w"
SMALL = {"batch_sizes": [16, 64], "target_accuracy": 0.5, "eval_every_samples": 256, "max_samples": 2048}
STOPPED_WITHIN_S = 15.0  # Kubernetes kills after 30 s, systemd after 90 s


class Fleet:
    """The cluster, its Redis (as its admin) and a client."""

    def __init__(self, cluster: LocalCluster, server: EmbeddedRedis, base: Path):
        self.cluster, self.server, self.base = cluster, server, base
        self.admin = redis.Redis(unix_socket_path=str(server.socket))
        self.client = EdgeTrainClient(cluster.url)
        self.app = producer_app(Settings(redis_url=cluster.url))
        self.env = {**os.environ, "EDGETRAIN_REDIS_URL": cluster.url}

    def small_job(self) -> dict:
        return quick_job([{"device_id": DEVICE, "power_cap_w": 3.0}], **SMALL)

    def edgetrain(self, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """Run the `edgetrain` command against the cluster."""
        return subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", *argv], env=self.env, capture_output=True,
                              text=True, timeout=timeout_s)  # fmt: skip

    def job_file(self) -> Path:
        path = self.base / "job.json"
        path.write_text(json.dumps(self.small_job()))
        return path

    def envelope(self, task: str, payload: object) -> bytes:
        """A real task message for `task` (as a producer sends it), not yet on any queue."""
        self.app.send_task(task, args=[payload], queue="unconsumed")
        raw = self.admin.rpop("unconsumed")
        assert isinstance(raw, bytes)
        return raw

    def log_count(self, worker: str, words: str) -> int:
        return self.cluster.worker(worker).log.read_text().count(words)

    def log_says(self, worker: str, words: str, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.log_count(worker, words) == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("worker-life")
    server = EmbeddedRedis(base / "redis")
    try:
        with LocalCluster(base / "cluster", devices={DEVICE: "sim:jetson-nano"}, redis_url=server.url) as cluster:
            yield Fleet(cluster, server, base)
    finally:
        server.stop()


def test_a_malformed_message_on_any_queue_is_dropped_and_every_worker_lives_on(fleet: Fleet) -> None:
    wrong_shape = json.loads(fleet.envelope(TaskName.advance_job.value, "job"))
    wrong_shape["body"] = base64.b64encode(b"[1, 2]").decode()  # a valid envelope, a body that is no task call
    unknown = fleet.envelope("edgetrain.no_such_task", "job")
    invalid = {CONTROL_QUEUE: fleet.envelope(TaskName.advance_page.value, {"job_id": 5}),
               SERVER_QUEUE: fleet.envelope(TaskName.train_proxy.value, {"batch_size": "many"}),
               device_queue(DEVICE): fleet.envelope(TaskName.finetune.value, {"job_id": "x"})}  # fmt: skip
    models = {CONTROL_QUEUE: "JobPage", SERVER_QUEUE: "ProxyRunRequest", device_queue(DEVICE): "FinetuneRequest"}
    garbage = {CONTROL_QUEUE: b"garbage", SERVER_QUEUE: b"garbage", device_queue(DEVICE): b"[1,2]"}
    for queue in garbage:
        fleet.admin.lpush(queue, garbage[queue], json.dumps(wrong_shape), unknown, invalid[queue])
    workers = {"control": CONTROL_QUEUE, "server-0": SERVER_QUEUE, f"device-{DEVICE}": device_queue(DEVICE)}
    for worker, queue in workers.items():
        validation_failed = AsyncResult(json.loads(invalid[queue])["headers"]["id"], app=fleet.app)
        validation_failed.get(timeout=60, propagate=False)  # the last one pushed: every message was taken
        assert validation_failed.state == "FAILURE" and fleet.log_says(worker, f" for {models[queue]}"), worker
    time.sleep(3)  # a redelivery would show by now
    assert [w for w in workers if not fleet.cluster.worker(w).alive()] == []
    assert [fleet.admin.llen(q) for q in garbage] == [0, 0, 0] and fleet.admin.hlen("unacked") == 0
    for worker, queue in workers.items():
        what = "not JSON" if queue != device_queue(DEVICE) else "not a message (TypeError"
        assert fleet.log_count(worker, f"dropped a malformed message from queue {queue}: {what}") == 1, worker  # not redelivered
        assert fleet.log_count(worker, "dropped a malformed task message (ValueError: not enough values to unpack") == 1, worker
        assert fleet.log_count(worker, "Received unregistered task of type 'edgetrain.no_such_task'") == 1, worker
    status = fleet.client.wait(fleet.client.submit(fleet.small_job()), timeout_s=300)
    assert status.state.value == "completed", [e.line() for e in status.events]


def test_a_device_worker_over_its_memory_limit_replaces_its_pool_process_after_each_task_and_goes_on(fleet: Fleet) -> None:
    # the recipes' second line against a worker that grows: 1 MB, so that every task ends over it
    worker = fleet.cluster.add_device_worker("device-recycled", "nano-m", "sim:jetson-nano", env={"EDGETRAIN_WORKER_MAX_MEMORY_MB": "1"})

    def finetuned_in() -> list[str]:  # the pool process (Celery numbers each new one) of each fine-tune that succeeded
        return re.findall(r"/(ForkPoolWorker-\d+)\] Task edgetrain\.finetune\[[^\n]* succeeded", worker.log.read_text())

    try:
        poll_until(lambda: any(d.device_id == "nano-m" for d in fleet.client.fleet()) or None, 120, 0.5, "nano-m registered")
        for n in (1, 2):
            status = fleet.client.wait(
                fleet.client.submit(quick_job([{"device_id": "nano-m", "power_cap_w": 3.0}], **SMALL)), timeout_s=300
            )
            assert status.state.value == "completed", [e.line() for e in status.events]
            poll_until(lambda: len(finetuned_in()) == n or None, 30, 0.2, f"fine-tune {n} logged")  # noqa: B023
        assert len(set(finetuned_in())) == 2 and worker.alive(), worker.log.read_text()[-3000:]
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.process is not None
        worker.process.wait(timeout=60)


def test_an_evicting_redis_is_refused_by_a_starting_worker_and_by_submit(fleet: Fleet) -> None:
    jobs_before = fleet.admin.zcard("edgetrain:jobs")
    fleet.admin.config_set("maxmemory-policy", "allkeys-lru")
    try:
        worker = fleet.edgetrain("worker", "control", "--name", "control-evicting", timeout_s=60)
        submit = fleet.edgetrain("submit", str(fleet.job_file()))
    finally:
        fleet.admin.config_set("maxmemory-policy", "noeviction")
    fix = "Set `maxmemory-policy noeviction` (redis-cli CONFIG SET maxmemory-policy noeviction, and in redis.conf to keep it)"
    assert worker.returncode == ExitCode.redis_unsafe, worker.stderr  # a worker that stops on an error says so in its exit status
    assert "refusing to start: Redis maxmemory-policy is allkeys-lru" in worker.stderr and fix in worker.stderr
    assert submit.returncode == ExitCode.redis_unsafe and "refusing to submit: Redis maxmemory-policy is allkeys-lru" in submit.stderr, (
        submit.stderr
    )
    assert fix in submit.stderr and fleet.admin.zcard("edgetrain:jobs") == jobs_before  # nothing was written


def test_a_full_redis_refuses_submit_by_name_and_the_control_worker_waits_it_out(fleet: Fleet) -> None:
    control: WorkerProcess = fleet.cluster.worker("control")
    control.signal(signal.SIGSTOP)  # so that a job is queued when Redis fills up
    try:
        job_id = fleet.client.submit(fleet.small_job())
        fleet.admin.config_set("maxmemory", fleet.admin.info("memory")["used_memory"] // 2)  # full, with noeviction
        try:
            submit = fleet.edgetrain("submit", str(fleet.job_file()))
            control.signal(signal.SIGCONT)
            waits = fleet.log_says("control", "Redis is full: task edgetrain.plan_submitted[")
        finally:
            fleet.admin.config_set("maxmemory", 0)
    finally:
        control.signal(signal.SIGCONT)
    assert waits and control.alive()
    assert submit.returncode == ExitCode.redis_unsafe, submit.stderr
    assert "Redis is full: it uses" in submit.stderr and "of its maxmemory" in submit.stderr and "Is it running" not in submit.stderr
    status = fleet.client.wait(job_id, timeout_s=300)  # the queued job, once Redis has room
    assert status.state.value == "completed", [e.line() for e in status.events]
    assert fleet.log_says("control", "Redis has room again: task recorded after") and control.alive()


def test_status_of_a_job_lost_in_a_redis_restart_without_persistence_says_so(fleet: Fleet) -> None:
    job_id = fleet.client.submit(quick_job([{"device_id": "absent-1", "power_cap_w": 3.0}], **SMALL))  # nothing runs on it
    fleet.server.kill()
    for kept in fleet.server.folder.glob("appendonly*"):  # as Redis without appendonly, or one whose disk was lost
        shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
    fleet.server.start()  # empty
    assert fleet.log_says("control", "edgetrain's data in Redis was lost: the store")
    status = fleet.edgetrain("status", job_id)
    assert status.returncode == 5, status.stderr
    assert f"no job '{job_id}'; this Redis's edgetrain data was created at " in status.stderr
    assert "after Redis restarted without persistence or its data was deleted: jobs submitted before then are lost" in status.stderr
    never = fleet.edgetrain("status", "never-submitted")
    assert never.returncode == 5 and "created at" in never.stderr  # the store was reset: that may be why


def test_workers_exit_within_seconds_of_sigterm_when_redis_is_gone(fleet: Fleet) -> None:
    workers = [w for w in fleet.cluster.workers if w.alive()]
    assert len(workers) == 3
    fleet.server.stop()
    time.sleep(2)  # the workers notice: the consumer is reconnecting
    started = time.monotonic()
    for worker in workers:
        worker.signal(signal.SIGTERM)
    exited: dict[str, tuple[int, float]] = {}
    for worker in workers:
        assert worker.process is not None
        code = worker.process.wait(timeout=60)
        exited[worker.name] = (code, round(time.monotonic() - started, 1))
    print("exit status and seconds after SIGTERM, Redis gone:", exited)
    assert all(code == 0 for code, _ in exited.values()), exited
    assert max(seconds for _, seconds in exited.values()) < STOPPED_WITHIN_S, exited
