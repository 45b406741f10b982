"""A spec nested far too deep (JSON or YAML, from a file or given to the client) is refused with
one clear message and exit status 2, never a RecursionError."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgetrain.common.documents import DocumentError, nesting_problem, parse_document
from edgetrain.common.limits import MAX_NESTING
from edgetrain.common.presets import quick_job
from edgetrain.tasks.client import JobSpecError, validate_job
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]
DEEP_JSON = '{"model": ' + "[" * 10_000 + "]" * 10_000 + "}"
DEEP_YAML = "name: " + "[" * 10_000 + "]" * 10_000 + "\n"
SHALLOW_BUT_TOO_DEEP = '{"model": ' + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + "}"


def deep_dict(levels: int) -> dict:
    top = current = {}
    for _ in range(levels):
        current["model"] = {}
        current = current["model"]
    return top


@pytest.mark.parametrize("text", [DEEP_JSON, SHALLOW_BUT_TOO_DEEP])
def test_submit_refuses_a_deep_spec_file_with_exit_status_2(tmp, text: str) -> None:
    (tmp / "job.json").write_text(text)
    done = subprocess.run([*CLI, "submit", str(tmp / "job.json"), "--redis-url", "redis://127.0.0.1:1/0"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == ExitCode.usage, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr  # one line
    assert done.stderr.startswith(f"cannot read job spec {tmp / 'job.json'}: nested ")
    assert f"at most {MAX_NESTING} levels of lists and objects" in done.stderr and "Recursion" not in done.stderr


def test_evaluate_refuses_a_deep_spec_file(tmp, capsys) -> None:
    (tmp / "spec.json").write_text(DEEP_JSON)
    assert main(["evaluate", str(tmp / "spec.json"), "--workdir", str(tmp / "work"), "--out", str(tmp / "out")]) == ExitCode.usage
    assert f"cannot read the evaluation spec {tmp / 'spec.json'}: nested too deep to parse" in capsys.readouterr().err
    assert not (tmp / "work").exists()


def test_a_deep_yaml_twin_spec_is_refused_where_it_is_named(tmp, capsys) -> None:
    (tmp / "twin.yaml").write_text(DEEP_YAML)
    spec = {"model": "smallcnn", "proxy": {"dataset": {"name": "digits"}, "target_accuracy": 0.8},
            "targets": [{"dataset": {"name": "mnist5k"}, "target_accuracy": 0.8}],
            "devices": [{"twin": str(tmp / "twin.yaml")}], "batch_sizes": [16, 64], "seeds": [0]}  # fmt: skip
    (tmp / "spec.json").write_text(json.dumps(spec))
    assert main(["evaluate", str(tmp / "spec.json"), "--workdir", str(tmp / "work"), "--out", str(tmp / "out")]) == ExitCode.usage
    err = capsys.readouterr().err
    assert "devices.0.twin: twin spec" in err and "nested too deep to parse" in err
    argv = ["worker", "device", "--device-id", "sim-1", "--backend", f"sim:{tmp / 'twin.yaml'}", "--redis-url", "redis://127.0.0.1:1/0"]
    assert main(argv) == ExitCode.usage
    assert "nested too deep to parse" in capsys.readouterr().err


def test_the_client_refuses_a_deep_spec() -> None:
    with pytest.raises(JobSpecError, match=f"nested more than {MAX_NESTING} levels deep"):
        validate_job(deep_dict(10_000))
    assert validate_job(quick_job([{"device_id": "nano-1", "power_cap_schedule": [[0.0, 3.0], [60.0, None]]}]))


def test_nesting_is_measured_without_recursion() -> None:
    assert nesting_problem(deep_dict(100_000)) is not None
    assert nesting_problem(deep_dict(MAX_NESTING - 1)) is None
    assert nesting_problem([[1, 2], {"a": [3]}]) is None
    with pytest.raises(DocumentError, match="not valid YAML"):
        parse_document("a: [", as_yaml=True)
