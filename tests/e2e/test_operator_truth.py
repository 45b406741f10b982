"""What an operator reads is what the fleet does, with real processes (a Nano twin's worker, a
control worker, the exporter, Flower, the CLI): a fine-tune waiting behind another job's on its
device is queued there, not running; a cap set with `edgetrain cap` shows in `fleet` and in the
report of the run it changed; the report heads with the configuration the device trained at and
puts the plan beside it; `jobs` names a failed part; `cancel` says what the job does now.

No proxy runs: each job's relation vector is stored beforehand as its proxy's (SIMULATED twin,
real training). One cluster serves the module, its tests in order on one device."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgetrain.common.finetune.trust import ProxyCheck, proxy_family
from edgetrain.common.jobs.reports import JobReport
from edgetrain.common.jobs.state import EventKind, JobState, PartState
from edgetrain.common.keys import vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec, RelationVector
from edgetrain.common.testing.flower import flower
from edgetrain.common.testing.prometheus import Exporter
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.processes.cluster import LocalCluster
from edgetrain.workers.rendering.output import format_report

pytestmark = pytest.mark.e2e
DEVICE = "nano-t"
B = [4, 128]
# a tenth of Fashion-MNIST does not reach 90 % within 12000 samples: the fine-tune runs its whole budget
LONG = quick_job([{"device_id": DEVICE, "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.1}}],
                 target_accuracy=0.9, max_samples=16000, batch_sizes=B)  # fmt: skip
QUEUED = quick_job([{"device_id": DEVICE, "power_cap_w": 3.0, "dataset": {"name": "fashion_mnist", "fraction": 0.2}}],
                   target_accuracy=0.95, max_samples=12000, batch_sizes=B)  # fmt: skip
FAILING = quick_job([{"device_id": DEVICE, "power_cap_w": 1.0}], batch_sizes=B)  # a cap below every configuration
# the proxy says b=4 needs a twentieth of b=128's samples: the plan is b=4; the same proxy was far off
# on three other data (its learned trust), no run on this data backs it, and b=4 is far slower per
# sample than b=128: the device trains at b=128 from its first step
GUARDED = quick_job([{"device_id": DEVICE, "power_cap_w": 6.0, "dataset": {"name": "mnist5k", "fraction": 0.5}}],
                    max_samples=6000, batch_sizes=B)  # fmt: skip
TIMEOUT_S = 300


def store_proxy_vector(cluster: LocalCluster, job: dict, ratios: list[float]) -> None:
    """The relation vector of `job`'s estimation request, as its proxy runs would store it."""
    request = JobSpec.model_validate(job).estimation_request()
    vector = RelationVector(
        batch_sizes=B, ratios=ratios, samples_mean=[r * 20000 for r in ratios], key=vector_key(request), request=request
    )
    cluster.store().resources.put_vector(vector)


def distrust_proxy(cluster: LocalCluster, job: dict) -> None:
    """Checks of `job`'s proxy on three other data, each a factor e^3 off (common/finetune/trust.py)."""
    family = proxy_family(JobSpec.model_validate(job).estimation_request())
    assert family is not None
    for data in ("other-1", "other-2", "other-3"):
        cluster.store().learned.put_check(family, ProxyCheck(data=data, error=3.0, pairs=1))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, require_dataset):
    require_dataset("fashion_mnist")
    with LocalCluster(tmp_path_factory.mktemp("truth"), devices={DEVICE: "sim:jetson-nano"}, server_workers=0) as cluster:
        for job, ratios in ((LONG, [1.0, 1.0]), (QUEUED, [1.0, 1.0]), (FAILING, [1.0, 1.0]), (GUARDED, [0.05, 1.0])):
            store_proxy_vector(cluster, job, ratios)
        distrust_proxy(cluster, GUARDED)
        yield cluster, EdgeTrainClient(cluster.url)


@pytest.fixture(scope="module")
def busy(fleet):
    """A long fine-tune running on the device, and another job's queued behind it."""
    _, client = fleet
    running = client.submit(LONG)
    poll_until(lambda: client.status(running).progress.get(DEVICE), TIMEOUT_S, 0.3, "the long fine-tune's progress")
    waiting = client.submit(QUEUED)
    poll_until(lambda: client.status(waiting).parts[DEVICE].dispatch, 60, 0.2, "the short job's fine-tune dispatched")
    return running, waiting


def cli(capsys, url: str, *argv: str) -> tuple[int, str]:
    code = main(["--redis-url", url, *argv])
    return code, capsys.readouterr().out


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_cap_set_with_edgetrain_cap_shows_in_fleet(fleet, busy, capsys) -> None:
    cluster, client = fleet
    running, _ = busy
    assert cli(capsys, cluster.url, "cap", DEVICE, "2.6")[0] == ExitCode.ok
    code, out = cli(capsys, cluster.url, "fleet")
    line = next(line for line in out.splitlines() if DEVICE in line)
    assert code == ExitCode.ok and "cap 2.6 W set" in line, out

    def followed():  # a switch (or a pause) for the new cap
        events = [e for e in client.status(running).events if e.kind == EventKind.reconfigured and "cap 2.6 W" in e.message]
        return events or None

    poll_until(followed, 60, 0.2, "the running fine-tune to follow the 2.6 W cap")
    assert cli(capsys, cluster.url, "cap", DEVICE, "none")[0] == ExitCode.ok  # lifted again: it may have paused


def test_flower_started_after_a_task_names_it_with_its_setting_in_mhz(fleet, busy) -> None:
    cluster, client = fleet
    running, _ = busy
    token = client.status(running).parts[DEVICE].dispatch.token
    with flower(cluster.url) as api:

        def named() -> str | None:
            try:
                with urllib.request.urlopen(f"{api}/task/info/{token}", timeout=5) as answer:
                    return json.loads(answer.read()).get("name")
            except OSError:
                return None

        name = poll_until(named, 120, 1.0, "Flower's name of the fine-tune started before it")
    assert name.startswith(f"edgetrain.finetune[{running}/{DEVICE} planned b=") and name.endswith(" MHz]"), name


def test_a_fine_tune_behind_another_job_s_on_its_device_is_queued_there_in_status_report_and_metrics(fleet, busy, capsys, tmp_path) -> None:
    cluster, client = fleet
    running, waiting = busy
    status = client.status(waiting)
    assert status.parts[DEVICE].state == PartState.queued, [e.line() for e in status.events]
    assert client.status(running).parts[DEVICE].state == PartState.finetuning
    code, out = cli(capsys, cluster.url, "status", waiting)
    assert code == ExitCode.ok and f"{DEVICE}: queued on the device behind job {running} (fine-tuning there now)" in out, out
    assert "1 part: 1 queued" in out, out
    assert f"queued on the device behind job {running}" in format_report(client.report(waiting))
    exporter = Exporter(tmp_path / "exporter", cluster.url).start()
    try:
        metrics = scrape(exporter.port)
    finally:
        exporter.stop()
    mine = {"job_id": waiting, "device": DEVICE, "simulated": "true"}
    assert metrics.get(("edgetrain_part_state", tuple(sorted({**mine, "state": "queued"}.items())))) == 1, sorted(metrics)[:40]
    assert ("edgetrain_part_state", tuple(sorted({**mine, "state": "finetuning"}.items()))) not in metrics
    assert metrics[("edgetrain_parts_waiting", (("reason", "device_queue"),))] == 1
    assert metrics[("edgetrain_device_job_info", (("device", DEVICE), ("job_id", running)))] == 1  # what the board runs


def test_the_report_of_a_run_whose_cap_changed_names_the_caps_in_force(fleet, busy) -> None:
    _, client = fleet
    running, _ = busy
    status = client.wait(running, timeout_s=TIMEOUT_S)
    part = status.parts[DEVICE]
    assert part.state == PartState.completed, [e.line() for e in status.events]
    text = format_report(client.report(running))
    assert "power cap 3 W, then 2.6 W from" in text and ", none from" in text, text
    assert "ABOVE the 3" not in text, text  # a reading over the cap in force was over 2.6 W, not the job's 3 W


def test_cancel_says_what_the_job_does_now(fleet, busy, capsys) -> None:
    cluster, client = fleet
    _, waiting = busy
    code, out = cli(capsys, cluster.url, "cancel", waiting)
    assert code == ExitCode.ok and out.startswith(f"job {waiting} cancel"), out  # cancelling, or cancelled
    assert "running" not in out.split(":")[0], out
    assert client.wait(waiting, timeout_s=120).state == JobState.cancelled


def test_the_report_heads_with_what_the_device_trained_at_and_puts_the_plan_beside_it(fleet, capsys, tmp_path) -> None:
    cluster, client = fleet
    job_id = client.submit(GUARDED)
    status = client.wait(job_id, timeout_s=TIMEOUT_S)
    part = status.parts[DEVICE]
    events = [e.line() for e in status.events]
    assert part.state == PartState.completed and part.selection.batch_size == 4, events  # the plan
    assert part.started is not None and part.started.selection.batch_size == 128, events  # what it trained at
    assert part.report.configurations[0].batch_size == 128
    assert any(e.kind == EventKind.started and "trains at b=128" in e.message and "planned b=4" in e.message for e in status.events)
    selected = next(e.message for e in status.events if e.kind == EventKind.selected)
    assert "MHz" in selected and " Hz" not in selected, selected
    lines = format_report(client.report(job_id)).splitlines()
    headline = next(line for line in lines if line.startswith("  edgetrain :"))
    assert headline.startswith("  edgetrain : b=128"), lines
    assert any(line.strip().startswith("planned b=4") for line in lines), lines
    assert lines[-1].startswith("baseline 1: what runs without edgetrain: the largest batch that fits in memory"), lines
    report = JobReport.from_status(client.status(job_id))
    assert report.devices[0].estimated_speedup_vs_baseline1 == pytest.approx(
        part.started.baseline1_estimated_time_to_accuracy_s / part.started.estimated_time_to_accuracy_s
    )
    exporter = Exporter(tmp_path / "exporter", cluster.url).start()
    try:
        metrics = scrape(exporter.port)
    finally:
        exporter.stop()
    labels = (("device", DEVICE), ("job_id", job_id), ("method", "edgetrain"), ("simulated", "true"))
    assert metrics[("edgetrain_part_estimated_time_to_accuracy_seconds", labels)] == pytest.approx(
        part.started.estimated_time_to_accuracy_s
    )
    log = (cluster.workdir / "logs" / "control.log").read_text()
    assert f"job {job_id}, {DEVICE} under a 6 W cap: planned b=4 f=" in log  # the plan, named as such
    device_log = (cluster.workdir / "logs" / f"device-{DEVICE}.log").read_text()
    assert f"finetune {job_id}/{DEVICE} trains at b=128" in device_log


def test_jobs_names_a_failed_part_and_why_and_sorts_federated_jobs_by_time(fleet, capsys) -> None:
    cluster, client = fleet
    failed = client.submit(FAILING)
    status = client.wait(failed, timeout_s=TIMEOUT_S)
    reason = status.parts[DEVICE].reason
    assert status.state == JobState.failed and reason, [e.line() for e in status.events]
    federated = client.submit({
        "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
        "target_accuracy": 0.8, "batch_sizes": [16], "devices": [{"device_id": "ghost-f", "power_cap_w": 5.0}], "max_rounds": 2,
    })  # fmt: skip
    client.cancel_federated(federated)
    newest = client.submit(FAILING)
    code, out = cli(capsys, cluster.url, "jobs")
    order = [line.split()[0] for line in out.splitlines()]
    assert code == ExitCode.ok and order.index(newest) < order.index(federated) < order.index(failed), out
    line = next(line for line in out.splitlines() if line.startswith(failed))
    assert f"failed: {DEVICE}: {reason}" in line, out
    client.wait(newest, timeout_s=TIMEOUT_S)
