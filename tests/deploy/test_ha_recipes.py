"""The high-availability variants of the recipes: a primary, a replica and three sentinels that
log in as their own Redis users, and every edgetrain process naming the sentinels with an
address edgetrain accepts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from edgetrain.common.redis_address import sentinel_address

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def shell_syntax_ok(script: str) -> None:
    checked = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_compose_ha_variant_runs_three_sentinels_and_every_client_follows_them() -> None:
    services = yaml.safe_load((DEPLOY / "compose" / "docker-compose.ha.yml").read_text())["services"]
    sentinels = [name for name in services if name.startswith("sentinel-")]
    assert len(sentinels) == 3
    for name, user in (("control", "worker"), ("server", "worker"), ("flower", "monitor"), ("exporter", "monitor")):
        url = services[name]["environment"]["EDGETRAIN_REDIS_URL"]
        address = sentinel_address(url)
        assert address is not None and address.username == user and address.master_name == "edgetrain", url
        assert [host for host, _ in address.sentinels] == sentinels
    script = services["sentinel-1"]["command"][2].replace("$$", "$")
    shell_syntax_ok(script)
    assert "sentinel monitor edgetrain redis 6379 2" in script and "sentinel auth-user edgetrain sentinel" in script
    for name in ("redis", "redis-replica"):
        script = services[name]["command"][2].replace("$$", "$")
        shell_syntax_ok(script)
        assert "masteruser replica" in script and "appendonly yes" in script and services[name]["environment"]["ME"] == name
    secrets = {s["target"] for s in services["redis-acl"]["secrets"]}
    assert {"replica.password", "sentinel.password"} <= secrets
    assert "replica sentinel" in (DEPLOY / "compose" / "make-secrets").read_text()


def test_kubernetes_ha_variant_runs_two_data_servers_and_three_sentinels() -> None:
    text = (DEPLOY / "kubernetes" / "redis-ha.yaml").read_text()
    sets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d and d["kind"] == "StatefulSet"}
    assert sets["edgetrain-redis"]["spec"]["replicas"] == 2 and sets["edgetrain-sentinel"]["spec"]["replicas"] == 3
    for stateful in sets.values():
        shell_syntax_ok(stateful["spec"]["template"]["spec"]["containers"][0]["command"][2])
    url = re.search(r"EDGETRAIN_REDIS_URL=(\S+)", text)[1]
    address = sentinel_address(url)
    assert address is not None and len(address.sentinels) == 3 and address.master_name == "edgetrain"
    assert all(host.endswith(".edgetrain-sentinel") and port == 26379 for host, port in address.sentinels)
