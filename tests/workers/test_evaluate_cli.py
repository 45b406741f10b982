"""`edgetrain evaluate` refuses what cannot run before anything runs: exit status 2 and one
message naming the field."""

import json
import subprocess
import sys

import pytest

from edgetrain.common.settings import get_settings
from edgetrain.workers.cli import main as edgetrain_main

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
    get_settings.cache_clear()
    try:
        spec = TINY | {"devices": [{"device_id": "orin-1"}], "targets": [{"dataset": {"name": "cifar10"}, "target_accuracy": 0.5}]}
        assert evaluate(tmp, spec) == 2
    finally:
        get_settings.cache_clear()
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
