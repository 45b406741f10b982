"""The deployment recipes start secure: Redis unpublished with a user per role and the default
user off, passwords only from secrets, Flower behind a login, workers unprivileged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from edgetrain.common.settings import Settings
from edgetrain.workers.commands.redis_acl import ROLES, acl_file, password_hash

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_compose_redis_is_unpublished_and_every_client_has_a_role() -> None:
    compose = documents(DEPLOY / "compose" / "docker-compose.yml")[0]
    services = compose["services"]
    assert "ports" not in services["redis"] and "--aclfile" in services["redis"]["command"]
    assert services["redis-acl"]["command"][-1].startswith("umask 077 && edgetrain redis-acl --passwords /run/secrets")
    for name in ("control", "server", "flower"):
        env = services[name]["environment"]
        user = "monitor" if name == "flower" else "worker"
        assert env["EDGETRAIN_REDIS_URL"] == f"redis://{user}@redis:6379/0"
        assert env["EDGETRAIN_REDIS_PASSWORD_FILE"] == f"/run/secrets/{user}.password"
    flower = services["flower"]
    assert flower["environment"]["EDGETRAIN_FLOWER_BASIC_AUTH_FILE"] == "/run/secrets/flower-auth"
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    tls = documents(DEPLOY / "compose" / "docker-compose.tls.yml")[0]["services"]["redis"]
    assert tls["ports"] == ["6380:6380"] and "--tls-port" in tls["command"]


def test_kubernetes_redis_is_internal_and_clients_read_passwords_from_secrets() -> None:
    redis_docs = {d["kind"]: d for d in documents(DEPLOY / "kubernetes" / "redis.yaml")}
    assert redis_docs["Service"]["spec"]["type"] == "ClusterIP"
    assert redis_docs["NetworkPolicy"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {"edgetrain/redis-client": "true"}
    deployments = [
        d for f in ("control.yaml", "server-workers.yaml") for d in documents(DEPLOY / "kubernetes" / f) if d["kind"] == "Deployment"
    ]
    assert len(deployments) == 3
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        assert pod["metadata"]["labels"]["edgetrain/redis-client"] == "true"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        env = env_of(pod["spec"]["containers"][0])
        assert env["EDGETRAIN_REDIS_URL"].split("@")[0] in ("redis://worker", "redis://monitor")
        assert env["EDGETRAIN_REDIS_PASSWORD_FILE"].startswith("/secrets/")
    flower = next(d for d in deployments if d["metadata"]["name"] == "edgetrain-flower")
    assert env_of(flower["spec"]["template"]["spec"]["containers"][0])["EDGETRAIN_FLOWER_BASIC_AUTH_FILE"] == "/flower/flower-auth"


def test_jetson_unit_reads_the_password_from_a_file() -> None:
    unit = (DEPLOY / "jetson" / "edgetrain-device.service").read_text()
    assert "EDGETRAIN_REDIS_URL=rediss://worker@" in unit and "EDGETRAIN_REDIS_PASSWORD_FILE=/etc/edgetrain/" in unit
    assert "--redis-url" not in unit


def test_redis_acl_command_writes_hashes_only(tmp_path: Path) -> None:
    passwords = {role: f"{role}-secret" for role in ROLES}
    for role, password in passwords.items():
        (tmp_path / f"{role}.password").write_text(password + "\n")
    out = subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", "redis-acl", "--passwords", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out == acl_file(passwords)
    assert out.splitlines()[0] == "user default off resetkeys resetchannels -@all"
    assert all(f"#{password_hash(pw)}" in out and pw not in out for pw in passwords.values())


def test_every_recipe_restarts_a_stopped_worker_and_runs_redis_without_eviction() -> None:
    unit = (DEPLOY / "jetson" / "edgetrain-device.service").read_text().splitlines()
    assert "Restart=always" in unit  # whatever the exit status: a worker stopped by an error exits non-zero anyway
    compose = documents(DEPLOY / "compose" / "docker-compose.yml")[0]["services"]
    assert all(compose[name]["restart"] == "unless-stopped" for name in ("redis", "control", "server", "flower"))
    for name in ("control.yaml", "server-workers.yaml"):
        for deployment in (d for d in documents(DEPLOY / "kubernetes" / name) if d["kind"] == "Deployment"):
            assert deployment["spec"]["template"]["spec"].get("restartPolicy", "Always") == "Always"
    tls = documents(DEPLOY / "compose" / "docker-compose.tls.yml")[0]["services"]["redis"]["command"]
    k8s = next(d for d in documents(DEPLOY / "kubernetes" / "redis.yaml") if d["kind"] == "Deployment")
    for argv in (compose["redis"]["command"], tls, k8s["spec"]["template"]["spec"]["containers"][0]["args"]):
        assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction" and argv[argv.index("--appendonly") + 1] == "yes"


def test_the_training_workers_recipes_replace_a_pool_process_that_grew_past_a_limit() -> None:
    unit = (DEPLOY / "jetson" / "edgetrain-device.service").read_text().splitlines()
    [device] = [line.split("=")[-1] for line in unit if line.startswith("Environment=EDGETRAIN_WORKER_MAX_MEMORY_MB=")]
    compose = documents(DEPLOY / "compose" / "docker-compose.yml")[0]["services"]
    server = next(d for d in documents(DEPLOY / "kubernetes" / "server-workers.yaml") if d["kind"] == "Deployment")
    limits = {
        "jetson device": device,
        "compose server": compose["server"]["environment"].get("EDGETRAIN_WORKER_MAX_MEMORY_MB"),
        "kubernetes server": env_of(server["spec"]["template"]["spec"]["containers"][0]).get("EDGETRAIN_WORKER_MAX_MEMORY_MB"),
    }
    assert [name for name, mb in limits.items() if mb is None or Settings(worker_max_memory_mb=mb).worker_max_memory_mb <= 0] == [], limits
    assert "EDGETRAIN_WORKER_MAX_MEMORY_MB" not in compose["control"]["environment"]  # the control worker runs no training
