"""A fleet on a real Redis 7 that speaks only TLS (a throwaway CA) and knows one ACL user per
role: workers, a submitter and Flower as the monitor each do their part and nothing more,
connections without TLS or the right password are refused, and no password shows in `ps`."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import DeviceRound, LocalUpdate
from edgetrain.common.keys import Keys
from edgetrain.common.presets import quick_job
from edgetrain.common.settings import Settings
from edgetrain.common.testing.certificates import issue
from edgetrain.common.testing.redis_server import TlsRedis, free_port
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.commands.redis_acl import ROLES, acl_file
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEVICE = "nano-t"


class Secure:
    def __init__(self, base: Path, server: TlsRedis, passwords: dict[str, str], cluster: LocalCluster):
        self.base, self.server, self.passwords, self.cluster = base, server, passwords, cluster

    def url(self, role: str) -> str:
        return self.server.url(role, self.passwords[role])

    def client(self, role: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(role), decode_responses=True)

    def secret_file(self, name: str, content: str) -> Path:
        path = self.base / name
        path.write_text(content + "\n")
        path.chmod(0o600)
        return path


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    base = tmp_path_factory.mktemp("transport")
    ca = issue(base / "tls", "ca")
    server_identity = issue(base / "tls", "redis", ca, hosts=("127.0.0.1", "localhost"))
    passwords = {role: secrets.token_urlsafe(16) for role in ROLES}
    (base / "users.acl").write_text(acl_file(passwords))
    server = TlsRedis(base / "redis", server_identity, ca.certificate, base / "users.acl").start()
    try:
        url = server.url("worker", passwords["worker"])
        with LocalCluster(base / "cluster", devices={DEVICE: "sim:jetson-nano"}, redis_url=url) as cluster:
            yield Secure(base, server, passwords, cluster)
    finally:
        server.stop()


def test_a_job_runs_over_tls_with_one_user_per_role(secure: Secure) -> None:
    client = EdgeTrainClient(secure.url("submitter"))
    assert [d.device_id for d in client.fleet()] == [DEVICE]
    spec = quick_job([{"device_id": DEVICE, "power_cap_w": 5.0}], batch_sizes=[16, 64], target_accuracy=0.5,
                     eval_every_samples=256, max_samples=2048)  # fmt: skip
    status = client.wait(client.submit(spec), timeout_s=300)
    part = status.parts[DEVICE]
    assert part.state.value == "completed", (part.reason, status.events)
    assert part.report.reached and part.report.final_accuracy >= 0.5


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda url: url.split("?")[0].replace("rediss://", "redis://"), redis.ConnectionError),  # no TLS
        (lambda url: url.split("?")[0], redis.ConnectionError),  # TLS, but the system CAs do not know this one
        (lambda url: url.replace("submitter:", "submitter:x"), redis.AuthenticationError),  # wrong password
        (lambda url: url.replace("submitter:", ":", 1).replace("://:", "://"), redis.AuthenticationError),
    ],
)
def test_connections_without_tls_or_the_right_password_are_refused(secure: Secure, change, error) -> None:
    with pytest.raises(error):
        redis.Redis.from_url(change(secure.url("submitter")), socket_timeout=5).ping()


def test_the_default_user_is_off(secure: Secure) -> None:
    url = secure.url("submitter").replace(f"submitter:{secure.passwords['submitter']}@", "")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).get("edgetrain:jobs")


@pytest.mark.parametrize(
    "role, command",
    [
        ("submitter", ("LPUSH", "device.nano-t", "{}")),  # a device's queue
        ("submitter", ("RPOP", "control")),  # taking a task
        ("submitter", ("LRANGE", "control", "0", "-1")),  # reading the queued tasks of every user
        ("submitter", ("LINDEX", "server", "0")),
        ("submitter", ("LRANGE", "device.nano-t", "0", "-1")),
        ("submitter", ("HGETALL", "unacked")),  # the tasks being run
        ("submitter", ("SET", "edgetrain:fleet:device:fake", "{}")),
        ("submitter", ("SET", "edgetrain:table:x", "{}")),
        ("submitter", ("HSET", "edgetrain:vector-parts:x", "32:0", "{}")),  # a proxy run's outcome
        ("submitter", ("SET", "edgetrain:vector-request:x", "{}")),  # an estimation the server pool sent
        ("submitter", ("SET", "edgetrain:claim:vector:x", "me")),
        ("submitter", ("PUBLISH", "/0.celery.pidbox", "{}")),  # remote control: shutdown, revoke
        ("submitter", ("FLUSHALL",)),
        ("submitter", ("CONFIG", "GET", "*")),
        ("submitter", ("KEYS", "*")),
        ("monitor", ("SET", "edgetrain:job:x", "{}")),
        ("monitor", ("LPUSH", "control", "{}")),
        ("monitor", ("DEL", "edgetrain:jobs")),
        ("monitor", ("PUBLISH", "/0.celery.pidbox", "{}")),  # remote control: shutdown, revoke
        ("monitor", ("SUBSCRIBE", "/0.celery.pidbox")),
        ("monitor", ("LPUSH", "x.reply.celery.pidbox", "{}")),  # a forged reply to an operator's command
        ("worker", ("FLUSHALL",)),
        ("worker", ("ACL", "SETUSER", "me", "on", "+@all")),
        ("worker", ("SHUTDOWN",)),
    ],
)
def test_each_role_is_refused_what_it_does_not_need(secure: Secure, role: str, command: tuple[str, ...]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        secure.client(role).execute_command(*command)


def test_each_role_may_do_its_part(secure: Secure) -> None:
    submitter, monitor = secure.client("submitter"), secure.client("monitor")
    assert DEVICE in submitter.smembers("edgetrain:fleet:ids")
    assert submitter.llen("control") >= 0  # a queue's length is not its content (LLEN reads no element)
    assert monitor.llen("control") >= 0 and monitor.llen(f"device.{DEVICE}") >= 0
    assert monitor.zcard("edgetrain:jobs") >= 0


def test_the_monitor_cannot_shut_a_worker_down(secure: Secure) -> None:
    """Celery's own remote control, as the monitor user (what Flower's buttons send), is refused
    by Redis, and the device worker lives on."""
    monitor = producer_app(Settings(redis_url=secure.url("monitor"), redis_url_file=None))
    device = secure.cluster.worker(f"device-{DEVICE}")
    with pytest.raises(Exception, match="no permissions"):
        monitor.control.shutdown(destination=[f"device-{DEVICE}@{socket.gethostname()}"])
    time.sleep(2.0)
    assert device.alive()


def test_a_client_reads_its_password_from_a_file(secure: Secure, monkeypatch: pytest.MonkeyPatch) -> None:
    password_file = secure.secret_file("submitter.password", secure.passwords["submitter"])
    monkeypatch.setenv("EDGETRAIN_REDIS_PASSWORD_FILE", str(password_file))
    without_password = secure.url("submitter").replace(f":{secure.passwords['submitter']}@", "@")
    assert secure.passwords["submitter"] not in without_password
    assert [d.device_id for d in EdgeTrainClient(without_password).fleet()] == [DEVICE]


def pids_of(process: subprocess.Popen) -> list[int]:
    """The process and its children (Celery's pool processes)."""
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    return [process.pid, *map(int, children)]


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_flower_as_the_monitor_behind_a_login_with_no_secret_in_the_process_list(secure: Secure) -> None:
    port = free_port()
    env = {**os.environ, "EDGETRAIN_REDIS_URL_FILE": str(secure.secret_file("monitor-url", secure.url("monitor")))}
    env.pop("EDGETRAIN_REDIS_URL", None)
    auth_file = secure.secret_file("flower-auth", "admin:" + secrets.token_urlsafe(12))
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "flower", "--port", str(port), "--basic-auth-file", str(auth_file)]
    flower = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        header = {"Authorization": "Basic " + base64.b64encode(auth_file.read_text().strip().encode()).decode()}

        def get(path: str) -> dict:
            return json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=header), timeout=10))

        def seen_by_flower(check, what: str):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError):
                    if found := check():
                        return found
                time.sleep(0.5)
            raise AssertionError(f"Flower does not show {what}")

        def worker_names() -> set[str] | None:
            names = {w["hostname"].split("@")[0] for w in get("/workers?json=1")["data"]}
            return names if len(names) >= 3 else None

        workers = seen_by_flower(worker_names, "the workers")
        assert workers == {"control", "server-0", f"device-{DEVICE}"}  # from their heartbeats: no remote control needed
        queues = {q["name"] for q in get("/api/queues/length")["active_queues"]}
        assert queues == {"control", "server", f"device.{DEVICE}"}
        EdgeTrainClient(secure.url("submitter")).submit(quick_job([{"device_id": "ghost-1"}]))  # tasks while Flower watches
        tasks = seen_by_flower(lambda: get("/api/tasks"), "the tasks")
        assert any(t["name"].startswith(("edgetrain.plan_submitted[", "edgetrain.advance_")) for t in tasks.values())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/workers", timeout=10)
        assert refused.value.code == 401
        lines = [command_line(pid) for w in secure.cluster.workers for pid in pids_of(w.process)] + [command_line(flower.pid)]
        leaked = [line for line in lines for secret in [*secure.passwords.values(), auth_file.read_text().strip()] if secret in line]
        assert len(lines) >= 5 and leaked == []
    finally:
        flower.terminate()
        flower.wait(timeout=30)


def test_no_submitter_can_hand_a_federated_round_an_update_and_a_write_beside_the_store_is_never_aggregated(secure: Secure) -> None:
    operator, client = EdgeTrainClient(secure.url("worker")), EdgeTrainClient(secure.url("submitter"))
    operator.profile(operator.store.fleet.device(DEVICE), "smallcnn", [16, 32], merge=True).wait(
        120, 0.2
    )  # the round opens without profiling
    device = secure.cluster.worker(f"device-{DEVICE}")
    device.signal(signal.SIGSTOP)  # the round stays open while the updates are forged
    try:
        job_id = client.submit({
            "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
            "target_accuracy": 0.99, "batch_sizes": [16, 32], "devices": [{"device_id": DEVICE}], "max_rounds": 2,
            "local": {"local_steps": 4},
        })  # fmt: skip
        poll_until(lambda: (s := client.federated_status(job_id)) and s.state.phase == "training" or None, 120, 0.05, "round 1")
        state = client.federated_status(job_id).state
        key = Keys().federated_round(job_id, state.round)
        a = state.assigned(DEVICE)
        ghost = Assignment(**(a.model_dump() | {"device_id": "ghost-1"}))
        trained = DeviceRound(assignment=ghost, device_time_s=0.1, energy_j=1.0, samples=64)
        forged = LocalUpdate(job_id=job_id, device_id="ghost-1", round=state.round, weights=f"artifact:ghost.pt#sha256={'0' * 64}",
                             held_samples=1_000_000, trained=trained).model_dump_json()  # fmt: skip
        with pytest.raises(redis.exceptions.NoPermissionError):
            secure.client("submitter").hset(key, "ghost-1", forged)
        secure.client("worker").hset(key, "ghost-1", forged)  # a writer beside the store
    finally:
        device.signal(signal.SIGCONT)
    status = client.wait_federated(job_id, timeout_s=300)
    events = [e.line() for e in status.events]
    assert status.rounds and status.rounds[0].accuracy > 0, (status.state, events)
    assert [d.assignment.device_id for d in status.rounds[0].devices] == [DEVICE], events
    assert any("round 1: ignored entries the round never accepted: ghost-1" in e for e in events), events
