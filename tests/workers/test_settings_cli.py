"""Settings as a command reads them: a path must be absolute (a variable holds no folder of its
own), an unusable setting is one line naming its variable with exit status 2 and no traceback,
and a command reads only the settings it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.common.presets import quick_job
from edgetrain.common.settings import DataSettings, Settings, SettingsError
from edgetrain.workers.cli_args import ExitCode

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]


def run(argv: list[str], cwd: Path, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("EDGETRAIN_") or k == "EDGETRAIN_DATA_DIR"}
    return subprocess.run([*CLI, *argv], cwd=cwd, env=inherited | env, capture_output=True, text=True, timeout=timeout_s)


def one_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_a_relative_password_file_is_refused_in_one_line_naming_the_variable_and_the_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "worker.password").write_text("pw\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run(["fleet"], elsewhere, EDGETRAIN_REDIS_URL="redis://worker@127.0.0.1:1/0",
               EDGETRAIN_REDIS_PASSWORD_FILE="secrets/worker.password")  # fmt: skip
    assert done.returncode == ExitCode.usage
    line = one_line(done)
    assert line.startswith("edgetrain: EDGETRAIN_REDIS_PASSWORD_FILE: 'secrets/worker.password' is a relative path"), line
    assert f"give an absolute path (from here: {elsewhere / 'secrets' / 'worker.password'})" in line


@pytest.mark.parametrize("variable", ["EDGETRAIN_REDIS_PASSWORD_FILE", "EDGETRAIN_REDIS_URL_FILE", "EDGETRAIN_ARTIFACT_DIR"])
def test_an_empty_path_setting_says_it_is_empty(tmp_path: Path, variable: str) -> None:
    done = run(["jobs"], tmp_path, **{variable: ""})
    assert done.returncode == ExitCode.usage
    assert one_line(done) == f"edgetrain: {variable}: set but empty: give an absolute path, or unset it\n"


def test_a_password_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    done = run(["fleet"], tmp_path, EDGETRAIN_REDIS_PASSWORD_FILE=str(tmp_path / "absent"))
    assert done.returncode == ExitCode.usage
    assert one_line(done) == f"edgetrain: EDGETRAIN_REDIS_PASSWORD_FILE: cannot read {tmp_path / 'absent'}: No such file or directory\n"


def test_a_bad_number_is_one_line_per_problem_naming_each_variable(tmp_path: Path) -> None:
    done = run(["fleet"], tmp_path, EDGETRAIN_HEARTBEAT_S="-1", EDGETRAIN_PAGE_SIZE="many")
    assert done.returncode == ExitCode.usage and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("edgetrain: EDGETRAIN_HEARTBEAT_S: Input should be greater than 0"), lines
    assert lines[1].startswith("edgetrain: EDGETRAIN_PAGE_SIZE: Input should be a valid integer"), lines


def test_submit_shows_the_spec_s_errors_whatever_the_redis_settings_hold(tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(quick_job([{"device_id": "nano-7", "power_cap_w": 3.0}], target_acuracy=0.9)))
    done = run(["submit", str(spec)], tmp_path, EDGETRAIN_REDIS_PASSWORD_FILE="secrets/worker.password")
    assert done.returncode == ExitCode.usage, done.stderr
    assert done.stderr.startswith("invalid job spec:\n  target_acuracy: Extra inputs are not permitted"), done.stderr


def test_data_settings_are_read_without_the_redis_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What `evaluate --federated`, spec validation and dataset loading read: not Redis's settings."""
    monkeypatch.setenv("EDGETRAIN_REDIS_PASSWORD_FILE", "secrets/worker.password")
    monkeypatch.setenv("EDGETRAIN_DATA_DIR", str(tmp_path))
    assert DataSettings().data_dir == tmp_path
    with pytest.raises(SettingsError, match="EDGETRAIN_REDIS_PASSWORD_FILE: 'secrets/worker.password' is a relative path"):
        Settings()
    monkeypatch.setenv("EDGETRAIN_DATA_ROOTS", f"{tmp_path}{os.pathsep}data")
    with pytest.raises(SettingsError, match="EDGETRAIN_DATA_ROOTS: 'data' is a relative path"):
        DataSettings()


def test_evaluate_federated_runs_whatever_the_redis_settings_hold(tmp_path: Path) -> None:
    spec = {
        "name": "tiny", "seeds": [0], "twins": {"nano-1": "jetson-nano", "orin-1": "jetson-agx-orin"},
        "job": {"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
                "target_accuracy": 0.3, "devices": [{"device_id": "nano-1", "power_cap_w": 5.0}, {"device_id": "orin-1"}],
                "batch_sizes": [32], "local": {"local_steps": 1}, "max_rounds": 1},
    }  # fmt: skip
    (tmp_path / "fed.json").write_text(json.dumps(spec))
    done = run(["evaluate", "--federated", "fed.json", "--out", "out"], tmp_path, 600,
               EDGETRAIN_REDIS_URL="redis://worker@redis-host:6379/0", EDGETRAIN_REDIS_PASSWORD_FILE="secrets/worker.password")  # fmt: skip
    assert done.returncode == ExitCode.ok, done.stderr
    assert done.stdout.startswith("## tiny\n") and (tmp_path / "out" / "federated.json").is_file()


def test_data_status_reads_no_redis_setting(tmp_path: Path) -> None:
    done = run(["data", "status", "--json"], tmp_path, EDGETRAIN_REDIS_PASSWORD_FILE="secrets/worker.password")
    assert done.returncode == ExitCode.ok and "digits" in json.loads(done.stdout), done.stderr
