"""`edgetrain evaluate` end to end: with no Redis configured it starts its own cluster (an
embedded Redis that keeps its data in --workdir, real worker processes), pre-trains, estimates
N_b on the server pool, profiles the twin, computes every method, writes the figures, and
shuts the cluster down; a second run reuses everything; --verify fine-tunes on the twin."""

import json
import os
import subprocess
import sys

import pytest

from edgetrain.common.evaluation import METHODS
from edgetrain.common.store import Store
from edgetrain.workers.processes.cluster import EmbeddedRedis

pytestmark = pytest.mark.e2e
TIMEOUT_S = 300
SPEC = {
    "name": "tiny",
    "model": "smallcnn",
    "weights": "init:0",
    "pretrain": {"dataset": {"name": "digits", "fraction": 0.5}, "max_samples": 2000},
    "proxy": {"dataset": {"name": "digits", "fraction": 0.5}, "target_accuracy": 0.8},
    "targets": [{"dataset": {"name": "mnist5k", "fraction": 0.2}, "target_accuracy": 0.8}],
    "devices": [{"twin": "jetson-nano", "power_caps_w": [4.0, None]}],
    "batch_sizes": [16, 64],
    "seeds": [0],
    "eval_every_samples": 128,
    "max_samples": 20000,
}
ROW_KEYS = {"device_type", "power_cap_w", "target", "proxy", "simulated", "speedup_vs_baseline1", "speedup_vs_baseline2",
            "gap_to_oracle_pct", *METHODS}  # fmt: skip


def evaluate(tmp, spec: dict, *argv: str) -> subprocess.CompletedProcess:
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("EDGETRAIN_REDIS_URL", "EDGETRAIN_REDIS_URL_FILE")}
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "evaluate", str(tmp / "spec.json"), "--workdir", str(tmp / "work"),
           "--server-workers", "1", *argv]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return done


def stored(tmp) -> dict[str, bytes]:
    """Every table and vector in the cluster's Redis (it keeps its data in the workdir)."""
    server = EmbeddedRedis(tmp / "work" / "redis", persistent=True)
    try:
        client = server_client(server)
        return {k.decode(): client.get(k) for pattern in ("edgetrain:table:*", "edgetrain:vector:*", "edgetrain:pretrained:*")
                for k in client.scan_iter(pattern)}  # fmt: skip
    finally:
        server.stop()


def server_client(server: EmbeddedRedis):
    import redis

    return redis.Redis(unix_socket_path=str(server.socket))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    done = evaluate(tmp, SPEC, "--json", "--out", str(tmp / "out"))
    return tmp, json.loads(done.stdout), done.stderr


def test_a_quick_evaluation_runs_through_the_workers_and_reports_every_method(first) -> None:
    tmp, document, progress = first
    assert document["dispatched"] == {"pretrain": 1, "estimations": 2, "profiles": 1, "finetunes": 0}
    assert [(r["power_cap_w"], r["target"], r["proxy"]) for r in document["rows"]] == [
        (4.0, "mnist5k (0.2)", "digits (0.5)"), (None, "mnist5k (0.2)", "digits (0.5)")
    ]  # fmt: skip
    for row in document["rows"]:
        assert set(row) == ROW_KEYS and row["device_type"] == "jetson-nano" and row["simulated"] is True
        for name in METHODS:
            assert set(row[name]) == {"batch_size", "frequency_hz", "time_to_accuracy_s", "energy_j", "reached"}
            assert row[name]["reached"] and set(row[name]["time_to_accuracy_s"]) == {"mean", "std"}
        oracle_s = row["oracle"]["time_to_accuracy_s"]["mean"]
        assert all(oracle_s <= row[m]["time_to_accuracy_s"]["mean"] for m in METHODS)
        assert row["gap_to_oracle_pct"] >= 0 and row["speedup_vs_baseline1"] > 0
    assert document["rows"][0]["baseline1"]["frequency_hz"] < document["rows"][0]["edgetrain"]["frequency_hz"]  # the cap binds B1
    [matrix] = [m for m in document["sensitivity"] if m["power_cap_w"] == 4.0]
    assert matrix["datasets"] == ["digits (0.5)", "mnist5k (0.2)"] and matrix["simulated"]
    robustness = document["robustness"]  # every cell of both matrices (2 caps x 2 proxies x 2 targets) is reached
    assert robustness["cells"] == 8 and robustness["edgetrain_worst"] > 0 and robustness["equation4_worst"] > 0
    for vector in document["vectors"].values():
        assert vector["resolution_samples"] <= 128 and all(n is not None for n in vector["samples_mean"])
    assert document["weights"].startswith("artifact:") and 0 < document["pretrain_test_accuracy"] < 1
    assert {p.name for p in (tmp / "out").iterdir()} == {
        "evaluation.json", "time-energy.png", "sensitivity.png",
        "profile-jetson-nano-4-W-mnist5k-0.2.png", "profile-jetson-nano-no-cap-mnist5k-0.2.png",
    }  # fmt: skip
    assert json.loads((tmp / "out" / "evaluation.json").read_text())["rows"] == document["rows"]
    for line in ("pre-training smallcnn on digits (2000 samples) on the server queue", "0/2 proxy runs done on the server pool",
                 "lookup table jetson-nano:smallcnn:1x28x28: ready", "N_b on mnist5k (0.2) (target, to 0.8): ready"):  # fmt: skip
        assert line in progress
    assert not (tmp / "work" / "redis" / "redis.sock").exists()  # the cluster was shut down


def test_a_second_evaluation_reuses_the_weights_tables_and_vectors(first) -> None:
    tmp, document, _ = first
    before = stored(tmp)
    assert len(before) == 4  # one table, two vectors, the pre-trained weights
    done = evaluate(tmp, SPEC, "--out", str(tmp / "again"))
    again = json.loads((tmp / "again" / "evaluation.json").read_text())
    assert again["dispatched"] == {"pretrain": 0, "estimations": 0, "profiles": 0, "finetunes": 0}
    assert again["rows"] == document["rows"] and again["vectors"] == document["vectors"]
    assert stored(tmp) == before
    assert done.stderr.count("stored, reused") == 4
    assert "| Baseline 1 | Baseline 2 | eq. (4) alone | edgetrain | least energy | oracle |" in done.stdout
    assert "jetson-nano (SIMULATED)" in done.stdout and "Against Baseline 1 over 8 cells" in done.stdout


def test_verify_fine_tunes_each_configuration_of_a_row_on_the_twin(first) -> None:
    tmp, document, _ = first
    one_cap = SPEC | {"devices": [{"twin": "jetson-nano", "power_caps_w": [4.0]}]}
    done = evaluate(tmp, one_cap, "--json", "--verify", "--out", str(tmp / "verified"))
    verified = json.loads(done.stdout)
    [row] = verified["rows"]
    assert row == document["rows"][0]
    configurations = {(row[m]["batch_size"], row[m]["frequency_hz"]) for m in METHODS}
    assert verified["dispatched"] == {"pretrain": 0, "estimations": 0, "profiles": 0, "finetunes": len(configurations) + 1}
    assert {(v["batch_size"], v["frequency_hz"]) for v in verified["verification"]} == configurations
    for v in verified["verification"]:
        assert v["reached"] and v["simulated"] and v["reason"] is None and v["power_cap_w"] == 4.0
        assert v["samples_to_accuracy"] == v["server_samples_to_accuracy"]  # N_b does not depend on the device
        assert v["samples_to_accuracy"] <= v["samples_processed"] < v["samples_to_accuracy"] + SPEC["eval_every_samples"] + v["batch_size"]
        assert v["computed_time_for_run_s"] == pytest.approx(v["computed_time_s"]["mean"])  # one seed
        assert abs(v["time_error_pct"]) < 5 and abs(v["energy_error_pct"]) < 5  # eq. (2) holds on the twin up to its noise
    assert "verify sim-jetson-nano, cap 4 W, mnist5k (0.2)" in done.stderr and "reached" in done.stderr
    [own] = verified["achieved"]  # edgetrain as a user's job runs it, through the device worker
    assert own["reached"] and own["simulated"] and own["power_cap_w"] == 4.0 and own["evidence"] in ("proxy", "learned", "closed_loop")
    assert own["configurations"] and len(own["switches"]) >= len(own["configurations"]) - 1
    assert own["time_to_accuracy_s"] > 0 and own["over_oracle_pct"] == pytest.approx(
        (own["time_to_accuracy_s"] / row["oracle"]["time_to_accuracy_s"]["mean"] - 1) * 100
    )
    assert "run edgetrain sim-jetson-nano, cap 4 W, mnist5k (0.2)" in done.stderr
    server = EmbeddedRedis(tmp / "work" / "redis", persistent=True)
    try:  # edgetrain's job had finished before any fixed configuration was sent: it learned nothing from them
        jobs = Store.connect(server.url).jobs
        finished = max(e.at for e in jobs.status(own["job_id"]).events)
        assert all(jobs.status(v["job_id"]).created_at >= finished for v in verified["verification"])
    finally:
        server.stop()
