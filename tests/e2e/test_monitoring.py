"""Monitoring end to end: a real Prometheus scrapes `edgetrain exporter` while a twin fleet
(real Redis, real worker processes logging JSON) runs a job, and reads back through its own
HTTP API the device's power and the job's progress; the alert rules and the dashboard's
queries evaluate on it."""

import json
import time
from pathlib import Path

import pytest

from edgetrain.common.presets import quick_job
from edgetrain.common.testing.prometheus import Exporter, Prometheus, prometheus_binary
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CAP_W = 3.0
# the proxy (digits) reaches 90 %, the device's data (a tenth of Fashion-MNIST) does not within the budget: the
# fine-tune runs its whole budget, long enough to be scraped while it runs
TARGET = [{"device_id": "nano-1", "power_cap_w": CAP_W, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}]
JOB = quick_job(TARGET, target_accuracy=0.9, max_samples=12000)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, require_dataset):
    if prometheus_binary() is None:
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus; .ci/run installs it where apt-get can)")
    require_dataset("fashion_mnist")
    folder = tmp_path_factory.mktemp("monitoring")
    with LocalCluster(folder / "cluster", devices={"nano-1": "sim:jetson-nano"}, env={"EDGETRAIN_LOG_FORMAT": "json"}) as cluster:
        exporter = Exporter(folder / "exporter", cluster.url).start()
        prometheus = Prometheus(folder / "prometheus", [f"127.0.0.1:{exporter.port}"], rules=[DEPLOY / "prometheus" / "alerts.yml"])
        try:
            prometheus.start()
            client = EdgeTrainClient(cluster.url)
            job_id = client.submit(JOB)
            yield cluster, client, prometheus, job_id
        finally:
            prometheus.stop()
            exporter.stop()


def sample(prometheus: Prometheus, expr: str) -> tuple[dict, float] | None:
    result = prometheus.query(expr)
    return (result[0]["metric"], float(result[0]["value"][1])) if result else None


def test_prometheus_reads_the_device_s_power_and_the_job_s_progress(fleet) -> None:
    cluster, client, prometheus, job_id = fleet
    started = time.time()
    power = poll_until(
        lambda: sample(prometheus, 'edgetrain_device_power_watts{device="nano-1"}'), 300, 1.0, "the device's power in Prometheus"
    )
    labels, watts = power
    assert labels["simulated"] == "true" and 0.3 < watts <= CAP_W * 1.1, power
    cap = sample(prometheus, 'edgetrain_device_power_cap_watts{device="nano-1"}')
    assert cap is not None and cap[1] == CAP_W
    batch = sample(prometheus, 'edgetrain_device_batch_size{device="nano-1"}')
    status = client.wait(job_id, timeout_s=300)
    assert status.state.value == "completed", [e.line() for e in status.events]
    part = status.parts["nano-1"]
    assert batch is not None and batch[1] == part.selection.batch_size
    samples = f'edgetrain_part_samples{{job_id="{job_id}", device="nano-1"}}'
    final = poll_until(lambda: (s := sample(prometheus, samples)) and s[1] == part.report.samples_processed or None, 30, 1.0,
                       "the final sample count scraped")  # fmt: skip
    assert final and part.report.samples_processed == JOB["max_samples"]
    history = prometheus.query_range(samples, started - 60, time.time(), 1.0)[0]["values"]
    counts = [float(v) for _, v in history]
    assert len(counts) >= 3 and counts == sorted(counts) and counts[0] < counts[-1], counts  # scraped while it ran
    accuracy = sample(prometheus, f'edgetrain_part_accuracy_ratio{{job_id="{job_id}"}}')
    assert accuracy is not None and accuracy[1] == pytest.approx(part.report.final_accuracy)
    # the part's report and the job's summary are written by different steps: a scrape may fall between them
    completed = poll_until(lambda: (s := sample(prometheus, 'edgetrain_jobs{state="completed"}')) and s[1] == 1 or None, 30, 1.0,
                           "the completed job scraped")  # fmt: skip
    assert completed


def test_alert_rules_and_dashboard_queries_evaluate_on_the_scraped_fleet(fleet) -> None:
    _, _, prometheus, _ = fleet

    def evaluated() -> list[dict] | None:  # every rule evaluated at least once (a loaded machine may lag a second or two)
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    rules = poll_until(evaluated, 60, 0.5, "every alert rule evaluated")
    assert len(rules) == 7 and all(r["health"] == "ok" for r in rules), [(r["name"], r["health"], r.get("lastError")) for r in rules]
    dashboard = json.loads((DEPLOY / "grafana" / "edgetrain-dashboard.json").read_text())
    answered = {t["expr"]: prometheus.query(t["expr"]) for p in dashboard["panels"] for t in p["targets"]}
    assert answered["edgetrain_workers"] and answered["edgetrain_queue_messages"]
    firing = [a["labels"] for a in prometheus.query('ALERTS{alertstate="firing"}')]
    assert not [a for a in firing if a["alertname"] in ("EdgetrainPartWaitingOnMissingWorker", "EdgetrainNoControlWorker")], firing


def test_worker_logs_are_json_lines_naming_job_device_and_task(fleet) -> None:
    cluster, client, _, job_id = fleet
    client.wait(job_id, timeout_s=300)
    lines = [json.loads(line) for line in (cluster.workdir / "logs" / "device-nano-1.log").read_text().splitlines()
             if line.startswith("{")]  # fmt: skip
    finetune = [entry for entry in lines if entry.get("task_name") == "edgetrain.finetune"]  # from its process and Celery's
    assert finetune and all(entry["device_id"] == "nano-1" and entry["task_id"] for entry in finetune)
    assert all(entry.get("job_id") == job_id for entry in finetune), finetune[:5]  # Celery's own lines about it too
    control = [json.loads(line) for line in (cluster.workdir / "logs" / "control.log").read_text().splitlines() if line.startswith("{")]
    assert any("planned b=" in entry["message"] and entry.get("job_id") == job_id for entry in control), [e["message"] for e in control][
        -20:
    ]
