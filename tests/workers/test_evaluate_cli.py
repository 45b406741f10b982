"""`edgetrain evaluate` refuses what cannot run before anything runs: exit status 2 and one
message naming the field; its board says how far profiling and estimation are."""

import io
import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
import redis
from rich.console import Console

from edgetrain.common.evaluation import EvaluationSpec
from edgetrain.common.keys import vector_key
from edgetrain.common.progress import ProfilingProgress, ProxyRunProgress
from edgetrain.common.schemas import DeviceInfo, utc_now
from edgetrain.common.settings import reload_settings
from edgetrain.tasks.client import EdgeTrainClient, validate_job
from edgetrain.workers.cli import main as edgetrain_main
from edgetrain.workers.commands.evaluation_runner import _Evaluation
from edgetrain.workers.rendering.evaluation_progress import EvaluationProgress

TINY = {
    "model": "smallcnn",
    "proxy": {"dataset": {"name": "digits"}, "target_accuracy": 0.8},
    "targets": [{"dataset": {"name": "mnist5k", "fraction": 0.2}, "target_accuracy": 0.8}],
    "devices": [{"twin": "jetson-nano", "power_caps_w": [4.0, None]}],
    "batch_sizes": [16, 64],
    "seeds": [0],
}


@pytest.fixture
def no_redis(monkeypatch) -> None:
    for name in ("EDGETRAIN_REDIS_URL", "EDGETRAIN_REDIS_URL_FILE"):
        monkeypatch.delenv(name, raising=False)


def evaluate(tmp, spec: dict | None, *argv: str) -> int:
    args = ["evaluate", "--workdir", str(tmp / "work"), "--out", str(tmp / "out"), *argv]
    if spec is not None:
        (tmp / "spec.json").write_text(json.dumps(spec))
        args.insert(1, str(tmp / "spec.json"))
    return edgetrain_main(args)


def test_a_malformed_spec_exits_2_naming_the_field_and_runs_nothing(tmp, no_redis, capsys) -> None:
    bad = TINY | {"targets": [{"dataset": {"name": "mnist5k"}, "target_accuracy": 1.5}], "seeds": [0, -1]}
    assert evaluate(tmp, bad) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"edgetrain evaluate: invalid evaluation spec {tmp / 'spec.json'}:\n")
    assert "targets.0.target_accuracy: Input should be less than 1" in captured.err
    assert "seeds.1: Input should be greater than or equal to 0" in captured.err
    assert not (tmp / "work").exists() and not (tmp / "out").exists()


@pytest.mark.parametrize(
    "spec, words",
    [
        (TINY | {"devices": [{"twin": "jetson-nano"}, {"twin": "jetson-nano"}]}, "devices: each twin or device_id may appear once"),
        (TINY | {"devices": [{"twin": "no-such-board"}]}, "devices.0.twin: "),
        (TINY | {"proxy": {"dataset": {"name": "austen"}, "target_accuracy": 0.5}}, "proxy.dataset: 'austen' is a text dataset"),
        (TINY | {"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
    ],
)
def test_the_spec_models_refusals_name_the_field(tmp, no_redis, capsys, spec, words) -> None:
    assert evaluate(tmp, spec) == 2
    assert words in capsys.readouterr().err


def test_a_registered_device_without_a_cluster_and_missing_data_are_refused(tmp, no_redis, capsys, monkeypatch) -> None:
    monkeypatch.setenv("EDGETRAIN_DATA_DIR", str(tmp / "no-data"))
    reload_settings()
    try:
        spec = TINY | {"devices": [{"device_id": "orin-1"}], "targets": [{"dataset": {"name": "cifar10"}, "target_accuracy": 0.5}]}
        assert evaluate(tmp, spec) == 2
    finally:
        reload_settings()
    err = capsys.readouterr().err
    assert "devices.0.device_id: 'orin-1' is a registered device, which needs a running cluster" in err
    assert "targets.0.dataset: dataset 'cifar10': not found" in err
    assert not (tmp / "work").exists()


def test_spec_and_scale_are_one_or_the_other(tmp, no_redis, capsys) -> None:
    assert evaluate(tmp, TINY, "--scale", "quick") == 2
    assert evaluate(tmp, None) == 2
    assert capsys.readouterr().err.count("give a spec file (SPEC.json) or --scale quick|paper, not both") == 2
    (tmp / "broken.json").write_text("{")
    assert edgetrain_main(["evaluate", str(tmp / "broken.json")]) == 2
    assert "cannot read the evaluation spec" in capsys.readouterr().err


def test_twins_must_be_served_by_the_configured_clusters_workers(tmp, redis_server, store) -> None:
    (tmp / "spec.json").write_text(json.dumps(TINY))
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "--redis-url", redis_server.url, "evaluate", str(tmp / "spec.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)
    assert done.returncode == 2 and done.stdout == ""
    assert "devices.0.twin: no registered device simulates 'jetson-nano'" in done.stderr
    assert "--backend sim:jetson-nano" in done.stderr


def test_a_stored_table_or_vector_that_no_longer_loads_is_one_progress_line_and_made_again(store, redis_server) -> None:
    spec = EvaluationSpec.model_validate(TINY)
    info = DeviceInfo(device_id="sim-nano", device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1, 2],
                      memory_bytes=4, simulated=True)  # fmt: skip
    raw = redis.Redis(unix_socket_path=str(redis_server.socket))
    raw.set(store.keys.table("jetson-nano:smallcnn:1x28x28"), b'{"batch_sizes": [16, 32, 64]}')
    for goal in spec.goals():
        raw.set(store.keys.vector(vector_key(spec.estimation_request(goal, spec.weights))), b"[")
    out = io.StringIO()
    evaluation = _Evaluation(EdgeTrainClient(redis_server.url), spec, [info], EvaluationProgress(Console(file=out)), 60)
    _, tables = evaluation.request_tables()
    _, vectors = evaluation.request_vectors(spec.weights)
    assert list(tables) == ["jetson-nano:smallcnn:1x28x28"] and len(vectors) == 2  # profiled and estimated again
    lines = [line for line in out.getvalue().splitlines() if "no longer loads" in line]
    assert len(lines) == 3 and all("set aside under edgetrain:set-aside:" in line for line in lines), out.getvalue()
    assert len(store.resources.set_asides()) == 3


def test_the_board_says_how_far_estimation_and_profiling_are(tmp, redis_server, store) -> None:
    spec = EvaluationSpec.model_validate(TINY)
    nano = DeviceInfo(device_id="nano-9", device_type="jetson-nano", backend="sim", frequencies_hz=[76_800_000, 921_600_000],
                      memory_bytes=2**32, simulated=True)  # fmt: skip
    board = _Evaluation(EdgeTrainClient(redis_server.url), spec, [nano], EvaluationProgress(Console(file=StringIO())), 60.0)
    _, tables = board.request_tables()  # sent to queues no worker consumes here: nothing runs
    _, vectors = board.request_vectors(spec.weights)
    start = utc_now()
    store.progress.put_profiling(ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=6,
                                                   points_planned=24, started_at=start, updated_at=start + timedelta(seconds=3),
                                                   device_id="nano-9"))  # fmt: skip
    (table,) = tables.values()
    assert table.describe() == ("lookup table jetson-nano:smallcnn:1x28x28: profiling grid of batch sizes [16, 64] on nano-9: "
                                "6 of 24 points measured on nano-9, about 9 s left")  # fmt: skip
    key = vector_key(spec.estimation_request(spec.proxy, spec.weights))
    store.progress.put_proxy_run(key, ProxyRunProgress(batch_size=64, seed=0, samples=768, accuracy=0.41, target_accuracy=0.8,
                                                       max_samples=spec.max_samples, started_at=start,
                                                       updated_at=start + timedelta(seconds=2)))  # fmt: skip
    assert vectors["digits"].describe() == ("N_b on digits (proxy, to 0.8): proxy runs 0/2 done, 1 running, 1 waiting on the "
                                            "server pool; b=64 seed=0: running, 768 samples, accuracy 0.410 (target 0.8), 2 s")  # fmt: skip


def test_edgetrain_s_own_job_estimates_the_proxy_at_the_proxy_s_target_as_the_computed_methods_do(redis_server) -> None:
    # the target is fine-tuned to 0.85 and the proxy trained to 0.8: the job shares the proxy's vector
    spec = EvaluationSpec.model_validate(TINY | {"targets": [{"dataset": {"name": "mnist5k", "fraction": 0.2}, "target_accuracy": 0.85}]})
    info = DeviceInfo(device_id="sim-nano", device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1, 2],
                      memory_bytes=4, simulated=True)  # fmt: skip
    evaluation = _Evaluation(EdgeTrainClient(redis_server.url), spec, [info], EvaluationProgress(Console(file=io.StringIO())), 60)
    [target] = spec.targets
    own = validate_job(evaluation.job(spec.weights, info, target, 4.0, None))
    assert own.target_accuracy == 0.85
    assert vector_key(own.estimation_request()) == vector_key(spec.estimation_request(spec.proxy, spec.weights))
