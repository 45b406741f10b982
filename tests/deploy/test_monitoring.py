"""The monitoring recipes: alert rules that promtool accepts and whose unit tests pass, a
Prometheus config that scrapes the exporter, and a Grafana dashboard and rules that use only
metrics the exporter serves; compose and Kubernetes run the exporter as the monitor user."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from edgetrain.common.settings import Settings
from edgetrain.workers.processes.exporter import FleetCollector

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "edgetrain-dashboard.json"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself


def promtool(*argv: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return subprocess.run(["promtool", *argv], cwd=PROMETHEUS, capture_output=True, text=True)


def test_alert_rules_are_valid() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0 and "SUCCESS: 7 rules found" in checked.stdout, checked.stdout + checked.stderr


def test_alert_rules_fire_as_their_unit_tests_say() -> None:
    tested = promtool("test", "rules", "alerts-test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_prometheus_config_scrapes_the_exporter_and_loads_the_rules() -> None:
    checked = promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["exporter:9847"]


def exported_names(store) -> set[str]:
    names = set()
    for family in FleetCollector(store, Settings(redis_url="redis://unused:1/0")).collect():
        names.add(family.name)
    return names


def metric_names(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    return {m for m in re.findall(r"\b([a-z_][a-z0-9_]*)\b", without_labels) if m.startswith("edgetrain_") or m in PROMETHEUS_OWN}


def test_dashboard_and_alerts_use_only_exported_metrics(store) -> None:
    exported = exported_names(store) | PROMETHEUS_OWN
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert {p["title"] for p in panels} >= {"Fleet power against caps", "GPU clocks", "Progress to target",
                                             "Time to accuracy: estimated and achieved", "Jobs and parts by state"}  # fmt: skip
    used = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= metric_names(target["expr"])
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"][0]["rules"]
    for rule in rules:
        used |= metric_names(rule["expr"])
    assert used and used <= exported, sorted(used - exported)
    assert {"edgetrain_device_power_watts", "edgetrain_device_power_cap_watts", "edgetrain_part_waiting",
            "edgetrain_tasks_handed_on_total"} <= used  # fmt: skip


def test_compose_and_kubernetes_scrape_the_exporter_as_the_monitor_user() -> None:
    services = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())["services"]
    exporter = services["exporter"]
    assert exporter["command"][:2] == ["edgetrain", "exporter"] and "9847" in exporter["command"]
    assert exporter["environment"]["EDGETRAIN_REDIS_URL"] == "redis://monitor@redis:6379/0" and "ports" not in exporter
    assert "../prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"] and services["grafana"]["ports"] == ["127.0.0.1:3000:3000"]
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")
    documents = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "monitoring.yaml").read_text()) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "edgetrain-exporter")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["EDGETRAIN_REDIS_URL"] == "redis://monitor@redis:6379/0" and pod["metadata"]["labels"]["edgetrain/redis-client"] == "true"
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "edgetrain-exporter")
    assert service["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"] == 9847
