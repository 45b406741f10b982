"""End to end: a real Redis and real worker processes run whole jobs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.common.jobs.state import EventKind
from edgetrain.common.keys import table_id, vector_key
from edgetrain.common.models import get_model
from edgetrain.common.presets import QUICK_JOB, quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.common.testing.tables import brute_force
from edgetrain.tasks.client import EdgeTrainClient, JobSpecError
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEVICES = {"nano-1": "sim:jetson-nano", "nano-2": "sim:jetson-nano", "tx2nx-1": "sim:jetson-tx2-nx"}
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cluster"), devices=DEVICES) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster) -> EdgeTrainClient:
    return EdgeTrainClient(cluster.redis_url)


@pytest.fixture(scope="module")
def first_job(client):
    job_id = client.submit(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}, {"device_id": "tx2nx-1", "power_cap_w": 5.0}]))
    return job_id, client.wait(job_id, timeout_s=TIMEOUT_S)


def test_two_device_job_selects_the_brute_force_argmin_and_reaches_the_target(cluster, first_job) -> None:
    job_id, status = first_job
    assert status.state.value == "completed", status.events
    store = cluster.store()
    spec = JobSpec.model_validate(QUICK_JOB)
    vector = store.resources.vector(vector_key(spec.estimation_request()))
    assert vector is not None and vector.ratios[-1] == 1.0
    for part in status.parts.values():
        table = store.resources.table(table_id(part.device_type, spec.model, get_model(spec.model).input_shape))
        assert table.simulated and table.mode == "grid"
        value, b, f = brute_force(table, vector, part.power_cap_w)
        assert (part.selection.batch_size, part.selection.frequency_hz) == (b, f)
        assert part.selection.peak_power_w <= part.power_cap_w
        report = part.report
        assert report.reached and report.final_accuracy >= spec.target_accuracy
        assert report.simulated and report.device_time_s > 0 and report.energy_j > 0
        assert (report.batch_size, report.frequency_hz) == (b, f)
        assert part.baseline1.batch_size == table.max_batch_size == 128
    assert {p.device_type for p in status.parts.values()} == {"jetson-nano", "jetson-tx2-nx"}


def test_identical_job_profiles_and_estimates_nothing_again(cluster, client, first_job) -> None:
    store = cluster.store()
    tables_before = {t.device_type: t.created_at for t in store.resources.tables()}
    job_id = client.submit(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}, {"device_id": "tx2nx-1", "power_cap_w": 5.0}]))
    status = client.wait(job_id, timeout_s=TIMEOUT_S)
    assert status.state.value == "completed"
    assert not {e.kind for e in status.events} & {EventKind.profiling, EventKind.estimating}, status.events
    assert {t.device_type: t.created_at for t in store.resources.tables()} == tables_before
    first = client.status(first_job[0])
    for device_id, part in status.parts.items():
        assert part.selection == first.parts[device_id].selection


def test_second_device_of_a_type_reuses_its_table_and_starts_from_what_earlier_fine_tunes_measured(cluster, client, first_job) -> None:
    status = client.wait(client.submit(quick_job([{"device_id": "nano-2", "power_cap_w": 3.0}])), timeout_s=TIMEOUT_S)
    assert status.state.value == "completed"
    assert EventKind.profiling not in {e.kind for e in status.events}, status.events
    first = first_job[1]
    tried = sorted({first.parts[d].report.batch_size for d in ("nano-1", "tx2nx-1")})
    learned = status.parts["nano-2"].report.learned  # the first job's fine-tunes on the MNIST subset are its evidence
    assert len(tried) == 2 and learned is not None and learned.source == "learned", (tried, learned)
    assert set(tried) <= set(learned.measured_batch_sizes) and len(learned.records) >= 2


def test_unknown_device_and_infeasible_cap_fail_alone(client, first_job) -> None:
    job_id = client.submit(
        quick_job([
            {"device_id": "nano-1", "power_cap_w": 3.0},
            {"device_id": "ghost-7", "power_cap_w": 5.0},
            {"device_id": "tx2nx-1", "power_cap_w": 1.0},
        ], device_grace_s=0)  # ghost-7 is not waited for
    )  # fmt: skip
    status = client.wait(job_id, timeout_s=TIMEOUT_S)
    parts = status.parts
    assert status.state.value == "partial"
    assert parts["nano-1"].state.value == "completed"
    assert parts["ghost-7"].state.value == "failed" and "unknown device 'ghost-7'" in parts["ghost-7"].reason
    assert parts["tx2nx-1"].state.value == "failed"
    assert "power cap 1.00 W" in parts["tx2nx-1"].reason and "lowest cap that would work" in parts["tx2nx-1"].reason


def test_malformed_job_is_rejected_before_anything_is_enqueued(cluster, client) -> None:
    before = cluster.store().jobs.job_ids()
    with pytest.raises(JobSpecError, match="target_accuracy"):
        client.submit(quick_job([{"device_id": "nano-1"}]) | {"target_accuracy": 2})
    assert cluster.store().jobs.job_ids() == before


def _cli(cluster, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "--redis-url", cluster.redis_url, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_cli_fleet_submit_and_status(cluster, tmp, first_job) -> None:
    fleet = json.loads(_cli(cluster, "fleet", "--json").stdout)
    assert sorted(d["device_id"] for d in fleet["devices"]) == sorted(DEVICES)
    assert all(d["simulated"] for d in fleet["devices"])
    assert sorted(w["role"] for w in fleet["workers"]) == ["control", "device", "device", "device", "server"]
    assert {q for w in fleet["workers"] for q in w["queues"]} >= {"control", "server", *(f"device.{d}" for d in DEVICES)}
    spec_file = tmp / "job.json"
    spec_file.write_text(json.dumps(quick_job([{"device_id": "tx2nx-1", "power_cap_w": 5.0}])))
    submitted = _cli(cluster, "submit", str(spec_file), "--wait", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.splitlines()[0]
    report = json.loads(_cli(cluster, "status", job_id, "--json").stdout)
    assert report["state"] == "completed"
    assert report["devices"][0]["achieved"]["simulated"] is True
    bad = tmp / "bad.json"
    bad.write_text(json.dumps({"model": "smallcnn"}))
    rejected = _cli(cluster, "submit", str(bad))
    assert rejected.returncode == 2 and "dataset: Field required" in rejected.stderr


def test_stale_table_is_not_silently_reused(cluster, client, first_job) -> None:
    store = cluster.store()
    tid = table_id("jetson-tx2-nx", "smallcnn", get_model("smallcnn").input_shape)
    stale = store.resources.table(tid)
    stale.produced_by["torch"] = "1.10.0"
    store.resources.put_table(stale)
    status = client.wait(client.submit(quick_job([{"device_id": "tx2nx-1", "power_cap_w": 5.0}])), timeout_s=TIMEOUT_S)
    assert status.state.value == "completed"
    assert any(e.kind == EventKind.table_not_reused and "torch" in e.message for e in status.events), status.events
    assert EventKind.profiling in {e.kind for e in status.events}
    assert store.resources.table(tid).produced_by["torch"] != "1.10.0"


def test_force_profiles_again(cluster, client, first_job) -> None:
    store = cluster.store()
    tid = table_id("jetson-nano", "smallcnn", get_model("smallcnn").input_shape)
    before = store.resources.table(tid).created_at
    spec = quick_job([{"device_id": "nano-2", "power_cap_w": 3.0}])
    spec["profiling"] = {"force": True}
    status = client.wait(client.submit(spec), timeout_s=TIMEOUT_S)
    assert status.state.value == "completed"
    assert store.resources.table(tid).created_at > before


def mapped_torch(pid: int) -> list[str]:
    """The files of PyTorch or torchvision mapped into process `pid`."""
    return sorted({line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/torch" in line})


def test_the_control_worker_maps_no_pytorch(cluster, first_job) -> None:
    """Its main process and pool children advanced whole jobs, with the cluster's default
    EDGETRAIN_TORCH_THREADS, and never loaded PyTorch."""
    control = cluster.worker("control").process
    children = subprocess.run(["pgrep", "-P", str(control.pid)], capture_output=True, text=True).stdout.split()
    pids = [control.pid, *map(int, children)]
    assert len(pids) >= 2, "the control worker has a pool child"
    assert {pid: mapped_torch(pid) for pid in pids} == {pid: [] for pid in pids}


def test_cli_submit_wait_exits_3_when_no_configuration_meets_the_cap(cluster, tmp, first_job) -> None:
    spec_file = tmp / "infeasible.json"
    spec_file.write_text(json.dumps(quick_job([{"device_id": "nano-1", "power_cap_w": 0.5}])))  # the table and vector are stored
    submitted = _cli(cluster, "submit", str(spec_file), "--wait", "--timeout", "120")
    assert submitted.returncode == 3, (submitted.stdout, submitted.stderr)
    assert "nano-1 [jetson-nano] power cap 0.5 W" in submitted.stdout
    assert "failed: power cap 0.50 W is below what any configuration needs: the lowest cap that would work is" in submitted.stdout
