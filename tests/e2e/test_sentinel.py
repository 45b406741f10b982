"""No single Redis to lose: with Redis Sentinel (a primary and a replica with append-only files,
three sentinels, real processes on loopback ports), killing the primary mid fine-tune loses
nothing: the sentinels promote the replica, the store, the broker and the result backend follow
it, the job completes with its fine-tune run once, and `status` says the store failed over."""

import os
import subprocess
import sys
import threading

import pytest
import redis

from edgetrain.common.jobs.state import EventKind, PartState
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.common.store import Store
from edgetrain.common.store.connection import connect
from edgetrain.common.testing.redis_processes import SentinelGroup, redis_binary
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.commands.redis_acl import ROLES, acl_file
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
# the proxy (digits) reaches 90 %, the device's data (a tenth of Fashion-MNIST) does not: the fine-tune runs its whole budget
TARGET = [{"device_id": "nano-h", "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}]


@pytest.fixture
def sentinels(tmp_path):
    if redis_binary() is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server redis-sentinel)")
    group = SentinelGroup(tmp_path / "redis").start()
    yield group
    group.stop()


def test_killing_the_primary_mid_fine_tune_loses_nothing(tmp_path, sentinels, require_dataset) -> None:
    require_dataset("fashion_mnist")
    primary = sentinels.master_port()
    with LocalCluster(tmp_path / "cluster", devices={"nano-h": "sim:jetson-nano"}, redis_url=sentinels.url) as cluster:
        client = EdgeTrainClient(cluster.url)
        job_id = client.submit(quick_job(TARGET, target_accuracy=0.9, max_samples=12000))
        poll_until(lambda: (p := client.status(job_id).progress.get("nano-h")) and p.samples >= 1024 or None, 300, 0.5, "fine-tuning")
        events_before = [e.model_dump() for e in client.status(job_id).events]
        sentinels.primary.kill()
        promoted = poll_until(lambda: (port := sentinels.master_port()) != primary and port or None, 60, 0.5, "the replica promoted")
        assert promoted == sentinels.replica.port
        status = client.wait(job_id, timeout_s=300)
        part = status.parts["nano-h"]
        assert part.state == PartState.completed, (part.reason, [e.line() for e in status.events])
        assert part.report.attempts == 1 and part.report.samples_processed == 12000  # run once, its budget counted once
        assert [e.model_dump() for e in status.events[: len(events_before)]] == events_before  # nothing lost
        failover = [e for e in status.events if e.kind == EventKind.store_failover]
        assert len(failover) == 1 and f"promoted 127.0.0.1:{promoted}" in failover[0].message, [e.line() for e in status.events]
        shown = subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", "status", job_id], capture_output=True, text=True,
                               env={**os.environ, "EDGETRAIN_REDIS_URL": cluster.url}, timeout=60)  # fmt: skip
        assert shown.returncode == 0 and "the store failed over" in shown.stdout, shown.stdout + shown.stderr


def test_a_command_in_flight_when_the_primary_dies_is_retried_on_the_promoted_replica(sentinels) -> None:
    client = connect(sentinels.url, patient=True)  # a worker's client
    sentinel, lookups = client.connection_pool.sentinel_manager, []
    ask = sentinel.discover_master
    sentinel.discover_master = lambda name: lookups.append(name) or ask(name)  # type: ignore[method-assign]
    assert client.ping() and len(lookups) == 1, lookups  # a new connection asks the sentinels where the master is once
    answer: list[object] = []
    waiting = threading.Thread(target=lambda: answer.append(_or_error(lambda: client.blpop(["edgetrain-test"], timeout=60))))
    waiting.start()
    poll_until(lambda: _blocked_on(sentinels.primary) or None, 30, 0.1, "BLPOP in flight")
    old = sentinels.master_port()
    sentinels.primary.kill()
    promoted = poll_until(lambda: (port := sentinels.master_port()) != old and port or None, 60, 0.5, "the replica promoted")
    poll_until(lambda: _blocked_on(sentinels.replica) or None, 30, 0.2, "BLPOP sent again to the promoted replica")
    sentinels.replica.client().rpush("edgetrain-test", "after the failover")
    waiting.join(60)
    assert promoted == sentinels.replica.port and answer == [("edgetrain-test", "after the failover")], answer


def _blocked_on(server) -> bool:
    return any(c["cmd"] == "blpop" for c in server.client().client_list())


def _or_error(call):
    try:
        return call()
    except redis.RedisError as error:
        return error


def test_with_a_user_per_role_the_sentinels_fail_over_and_the_old_primary_comes_back_as_a_replica(tmp_path) -> None:
    if redis_binary() is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server redis-sentinel)")
    passwords = {role: f"{role}-secret" for role in ROLES}
    acl = tmp_path / "users.acl"
    acl.write_text(acl_file(passwords))
    group = SentinelGroup(tmp_path / "redis", acl_file=acl, passwords=passwords).start()
    try:
        store = Store.connect(group.url_for("worker", passwords["worker"]), patient=True)
        store.jobs.create("j1", JobSpec.model_validate(quick_job(TARGET)))
        old = group.master_port()
        group.primary.kill()
        assert store.jobs.record("j1") is not None  # read through the promoted replica, as the worker user
        assert group.master_port() == group.replica.port != old
        group.primary.start()  # the sentinels turn it into a replica of the new master; it logs in as `replica`
        old_primary = redis.Redis(port=group.primary.port, username="sentinel", password=passwords["sentinel"], decode_responses=True)
        poll_until(lambda: old_primary.info("replication").get("master_link_status") == "up" or None, 60, 0.5, "the old primary in sync")
        assert old_primary.info("replication")["role"] == "slave"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=group.replica.port).ping()  # the default user is off
    finally:
        group.stop()
