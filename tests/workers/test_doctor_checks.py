"""The doctor's checks of a Redis server's facts (the parts no local server can show: an old
version) and of Sentinel addresses."""

import pytest
import redis

from edgetrain.common.redis_address import sentinel_address
from edgetrain.common.redis_health import RedisFacts, read_facts
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import celery_config
from edgetrain.workers.commands.doctor import access_findings, redis_findings

SAFE = RedisFacts(
    version="7.0.15", maxmemory_bytes=0, maxmemory_policy="noeviction", used_memory_bytes=10**6, aof_enabled=True, rdb_save=""
)


def test_a_redis_older_than_6_2_is_found_with_the_upgrade_to_make() -> None:
    assert redis_findings(SAFE, "Redis") == []
    old = redis_findings(SAFE.model_copy(update={"version": "5.0.7"}), "Redis")
    assert [f.check for f in old] == ["redis version"] and "5.0.7 is older than 6.2" in old[0].problem and "upgrade" in old[0].fix


def test_snapshots_without_an_append_only_file_are_found() -> None:
    found = redis_findings(SAFE.model_copy(update={"aof_enabled": False, "rdb_save": "3600 1"}), "Redis")
    assert [f.check for f in found] == ["redis appendonly"] and "appendonly yes" in found[0].fix


def test_sentinel_addresses_name_the_sentinels_the_master_and_the_database() -> None:
    address = sentinel_address("sentinel://worker:p%40ss@s1:26379,s2:26380,[::1]:26381/edgetrain/2")
    assert address.sentinels == (("s1", 26379), ("s2", 26380), ("::1", 26381))
    assert (address.master_name, address.db, address.username, address.password) == ("edgetrain", 2, "worker", "p@ss")
    assert sentinel_address("redis://localhost:6379/0") is None
    config = celery_config(Settings(redis_url="sentinel://worker:p%40ss@s1:26379,s2:26380/edgetrain/2"))
    assert config["broker_url"] == config["result_backend"] == "sentinel://worker:p%40ss@s1:26379/2;sentinel://worker:p%40ss@s2:26380/2"
    assert config["broker_transport_options"]["master_name"] == config["result_backend_transport_options"]["master_name"] == "edgetrain"


@pytest.mark.parametrize(
    "url, error",
    [
        ("sentinel://s1/edgetrain/0", "sentinel 's1' is not HOST:PORT"),
        ("sentinel://s1:26379", "does not name the master"),
        ("sentinel://s1:26379/edgetrain/zero", "does not name the master"),
    ],
)
def test_a_malformed_sentinel_address_is_refused_naming_the_setting(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=f"redis_url: .*{error}"):
        Settings(redis_url=url)


def test_acl_users_on_a_redis_older_than_7_with_the_default_user_on_are_found(redis_server) -> None:
    admin = redis.Redis(unix_socket_path=str(redis_server.socket), decode_responses=True)
    admin.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"])
    try:
        url = f"unix://worker@{redis_server.socket}?password=pw"
        version = read_facts(admin).version  # the embedded Redis: 6.2
        found = access_findings(url, "Redis", version)
    finally:
        admin.acl_deluser("worker")
    problems = [f.problem for f in found]
    assert version.startswith("6.") and len(found) == 2, problems
    assert f"Redis {version} cannot load the ACL file" in problems[0] and "default user is on" in problems[1]
