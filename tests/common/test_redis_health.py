"""What edgetrain reads of its Redis server and what it says is wrong with it, on a real Redis:
as the admin (CONFIG allowed) and as an ACL user without admin rights (INFO only)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import redis

from edgetrain.common.redis_health import RedisFull, RedisUnsafe, problems, read_facts, refuse_unsafe
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import Settings
from edgetrain.common.store import DeviceIdTaken, JobNotFoundError, Store, WorkerInfo
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.processes.heartbeat import Heartbeat


@pytest.fixture
def admin(redis_server):
    """The server's admin client; every setting changed here is put back."""
    client = redis.Redis(unix_socket_path=str(redis_server.socket), decode_responses=True)
    before = client.config_get("maxmemory*") | client.config_get("appendonly")
    yield client
    client.config_set("maxmemory-policy", before["maxmemory-policy"])
    client.config_set("maxmemory", before["maxmemory"])
    client.config_set("appendonly", before["appendonly"])
    while client.info("persistence")["aof_rewrite_in_progress"]:  # Redis will not stop while it writes its first AOF
        time.sleep(0.05)
    client.acl_deluser("limited")


def test_a_default_redis_is_safe_but_says_that_a_restart_loses_the_jobs(admin) -> None:
    admin.config_set("appendonly", "no")  # Redis's default (the test's server keeps one, as a fleet's should)
    facts = read_facts(admin)
    assert facts.maxmemory_policy == "noeviction" and not facts.evicts and facts.version.count(".") == 2
    assert facts.rdb_save == "" and not facts.aof_enabled and facts.used_memory_bytes > 0
    found = problems(facts)
    assert [(p.setting, p.severe) for p in found] == [("appendonly", False)]
    assert "Set `appendonly yes`" in found[0].line() and "RDB snapshots: off" in found[0].line()
    refuse_unsafe(facts, "to submit")  # nothing severe


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_redis_is_refused_with_the_setting_to_change(admin, policy: str) -> None:
    admin.config_set("maxmemory-policy", policy)
    facts = read_facts(admin)
    first = problems(facts)[0]
    assert first.severe and first.found == policy and first.fix == "maxmemory-policy noeviction"
    with pytest.raises(RedisUnsafe, match=f"refusing to submit: Redis maxmemory-policy is {policy}: .*"
                                          "Set `maxmemory-policy noeviction` \\(redis-cli CONFIG SET"):  # fmt: skip
        refuse_unsafe(facts, "to submit")


def test_a_full_redis_is_named_full_with_its_memory(admin) -> None:
    used = admin.info("memory")["used_memory"]
    admin.config_set("maxmemory", used // 2)
    facts = read_facts(admin)
    assert facts.maxmemory_bytes == used // 2 and facts.used_memory_bytes >= facts.maxmemory_bytes
    assert [p.setting for p in problems(facts)][:1] == ["maxmemory"]
    with pytest.raises(RedisFull, match=r"Redis is full: it uses [\d.]+ MiB of its maxmemory [\d.]+ MiB \(maxmemory-policy noeviction\)"):
        refuse_unsafe(facts, "to submit")


def test_a_user_without_admin_rights_reads_the_settings_from_info(admin, redis_server) -> None:
    admin.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-@admin", "+info"])
    admin.config_set("maxmemory-policy", "allkeys-lru")
    admin.config_set("appendonly", "no")
    limited = redis.Redis(unix_socket_path=str(redis_server.socket), username="limited", password="pw", decode_responses=True)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.config_get("save")
    facts = read_facts(limited)
    assert facts.rdb_save is None and facts.maxmemory_policy == "allkeys-lru"
    assert [p.setting for p in problems(facts)] == ["maxmemory-policy", "appendonly"]
    assert "RDB snapshots: unknown (CONFIG not allowed)" in problems(facts)[1].line()


def test_a_store_identity_is_made_once_and_a_reset_is_told_to_status(store: Store, redis_server, caplog) -> None:
    settings = Settings(redis_url=redis_server.url)
    heartbeat = Heartbeat(store, settings, WorkerInfo(node="control@here", role="control", queues=["control"], hostname="here", pid=1))
    heartbeat.watch_identity()
    first = store.identity.current()
    assert first is not None and first == heartbeat.identity and first.replaces is None and first.reset_note() is None
    assert store.identity.ensure() == first  # made once
    client = EdgeTrainClient(redis_server.url)
    with pytest.raises(JobNotFoundError) as plain:
        client.status("old-job")
    assert plain.value.args[0] == "no job 'old-job'"
    store.clear()  # what a restart without persistence leaves
    with caplog.at_level(logging.ERROR):
        heartbeat.watch_identity()
    second = store.identity.current()
    assert second is not None and second.replaces == first.store_id and heartbeat.identity == second
    assert f"the store {first.store_id}" in caplog.text and "Redis restarted without persistence" in caplog.text
    with pytest.raises(JobNotFoundError) as reset:
        client.status("old-job")
    created = f"{second.created_at:%Y-%m-%d %H:%M:%S}"
    assert reset.value.args[0] == (f"no job 'old-job'; this Redis's edgetrain data was created at {created} UTC, after Redis "
                                   "restarted without persistence or its data was deleted: jobs submitted before then are lost")  # fmt: skip


def test_a_stopping_process_stops_waiting_for_redis(tmp_path) -> None:
    """A patient client rides out about 30 s of outage, but not once its process is stopping."""
    code = textwrap.dedent(f"""
        import threading, time
        import redis
        from edgetrain.common.store.connection import connect, stop_retrying
        client = connect("unix://{tmp_path}/gone.sock", patient=True)
        threading.Timer(1.0, stop_retrying).start()
        started = time.monotonic()
        try:
            client.ping()
        except redis.ConnectionError:
            print(round(time.monotonic() - started, 1))
    """)  # fmt: skip
    waited_s = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout)
    assert 0.9 <= waited_s < 2.0  # retried until told to stop, then gave up at once


def test_a_second_worker_refused_the_device_id_leaves_the_live_workers_entries_alone(store: Store, redis_server) -> None:
    """A worker started again for a device whose worker lives on this host is refused at its
    first beat; stopping it must not take the live worker (same node name) out of the registry."""
    settings = Settings(redis_url=redis_server.url)
    device = DeviceInfo(device_id="nano-9", device_type="jetson-nano", backend="sim", frequencies_hz=[1, 2], memory_bytes=4, simulated=True)
    live = WorkerInfo(node="device-nano-9@here", role="device", queues=["nano-9"], hostname="here", pid=os.getpid())
    owner = Heartbeat(store, settings, live, device)
    owner.first_beat(1.0, print)
    second = Heartbeat(store, settings, live.model_copy(update={"pid": os.getpid() + 1}), device)
    with pytest.raises(DeviceIdTaken):
        second.first_beat(1.0, print)
    second.stop()
    assert [w.pid for w in store.liveness.workers(settings.heartbeat_ttl_s)] == [os.getpid()]
    assert store.fleet.owner("nano-9") == owner.instance
    owner.stop()
    assert store.liveness.workers(settings.heartbeat_ttl_s) == [] and store.fleet.owner("nano-9") is None


def test_a_shutdown_signal_landing_as_the_first_beat_returns_still_leaves_the_fleet(store: Store, redis_server, monkeypatch) -> None:
    """SIGTERM soon after a worker registered (the device worker's handler raises SystemExit):
    on a loaded machine the signal can land after the registration was written but before the
    heartbeat noted it, and the stopping worker left its device in the fleet for a heartbeat
    TTL (seen once in CI: `test_nvml_worker_registers_its_control_axis`)."""
    settings = Settings(redis_url=redis_server.url)
    device = DeviceInfo(device_id="nano-8", device_type="jetson-nano", backend="sim", frequencies_hz=[1, 2], memory_bytes=4, simulated=True)
    worker = WorkerInfo(node="device-nano-8@here", role="device", queues=["nano-8"], hostname="here", pid=os.getpid())
    register = store.fleet.register

    def register_then_signalled(*args, **kwargs):
        register(*args, **kwargs)
        raise SystemExit(143)

    monkeypatch.setattr(store.fleet, "register", register_then_signalled)
    beating = Heartbeat(store, settings, worker, device)
    with pytest.raises(SystemExit):
        beating.first_beat(1.0, print)
    assert store.fleet.device("nano-8") is not None
    beating.stop()
    assert store.fleet.device("nano-8") is None and store.fleet.owner("nano-8") is None
