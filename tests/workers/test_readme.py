"""The README's "Running a fleet" says what the system does: its Redis line is run and checked,
its job.json validates, every command and option it lists exists, the exit-status table is the
CLI's, and the labels and progress lines it quotes are the ones edgetrain makes."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from edgetrain.common.jobs.state import FinetuneProgress, PartState
from edgetrain.common.payloads import ProxyRunRequest, finetune_request, job_profile_request
from edgetrain.common.presets import quick_job
from edgetrain.common.progress import ProfilingProgress, ProxyRunProgress, estimation_progress, finetune_line
from edgetrain.common.schemas import DeviceInfo, JobSpec, Selection, TrainingOutcome, utc_now
from edgetrain.common.store import Store, claim_token
from edgetrain.common.testing.parts import drive_part
from edgetrain.common.testing.redis_server import free_port
from edgetrain.tasks.client import validate_job
from edgetrain.tasks.contract import TaskName, label
from edgetrain.workers.cli import build_parser
from edgetrain.workers.cli_args import ExitCode

README = (Path(__file__).parents[2] / "README.md").read_text()
CLI = [sys.executable, "-m", "edgetrain.workers.cli"]


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


FLEET = section("Running a fleet")


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def commands() -> list[str]:
    """The command lines of the fleet's bash block, without their comments."""
    return [line.split("  #")[0].strip() for line in blocks(FLEET, "bash")[0].splitlines() if line and not line.startswith("#")]


def flat(text: str) -> str:
    return " ".join(text.split())


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def test_the_job_json_example_is_a_valid_job_for_the_devices_started_above() -> None:
    (example,) = blocks(FLEET, "json")
    spec = validate_job(json.loads(example))
    started = set(re.findall(r"--device-id (\S+)", blocks(FLEET, "bash")[0]))
    assert {d.device_id for d in spec.devices} <= started


def test_every_listed_command_and_option_exists(capsys) -> None:
    root = build_parser()
    listed = [c for c in commands() if c.startswith("edgetrain ")]
    assert len(listed) >= 20
    for line in listed:
        words = [w.strip("[]") for w in line.split()[1:]]
        parser, path = root, []
        while words and words[0] in subparsers(parser):
            path.append(words[0])
            parser = subparsers(parser)[words.pop(0)]
        assert path, line
        known = {option for action in parser._actions for option in action.option_strings}
        for option in (w.split("=")[0] for w in words if w.startswith("--")):
            assert option in known, f"{line}: {option} is not an option of `edgetrain {' '.join(path)}`"
        with pytest.raises(SystemExit) as done:
            root.parse_args([*path, "--help"])
        assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: edgetrain")


def test_the_exit_status_table_is_the_cli_s() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", FLEET, re.M))
    assert {int(code) for code in rows} == {int(code) for code in ExitCode}
    meaning = {ExitCode.ok: "done", ExitCode.failed: "target", ExitCode.usage: "bad input", ExitCode.infeasible: "power cap",
               ExitCode.unreachable: "Redis unreachable", ExitCode.not_found: "no such job", ExitCode.timed_out: "--timeout",
               ExitCode.interrupted: "interrupted", ExitCode.broken_pipe: "went away"}  # fmt: skip
    for code, words in meaning.items():
        assert words in rows[str(int(code))], (code, rows[str(int(code))])


def test_the_labels_and_progress_lines_quoted_are_the_ones_edgetrain_makes() -> None:
    job = "3f2a9c4d1e07"
    spec = JobSpec.model_validate(quick_job([{"device_id": "nano-7", "power_cap_w": 3.0}]))
    nano = DeviceInfo(device_id="nano-7", device_type="jetson-nano", backend="sim", frequencies_hz=[844_800_000],
                      memory_bytes=2**32, simulated=True)  # fmt: skip
    choice = Selection(batch_size=16, frequency_hz=844_800_000, estimated_time_s=1.0, peak_power_w=2.9)
    labels = [
        label(TaskName.train_proxy, ProxyRunRequest(request=spec.estimation_request(), batch_size=8, seed=1, job_id=job).model_dump()),
        label(TaskName.profile_device, job_profile_request(claim_token(job), spec, spec.devices[0], nano).model_dump()),
        label(
            TaskName.finetune,
            finetune_request(job, spec, spec.devices[0], choice, "table", "vector").model_dump(mode="json"),
            setting=nano.control.describe(choice.frequency_hz),
        ),
        label(TaskName.advance_job, job),
    ]
    progress = FinetuneProgress(samples=1024, accuracy=0.712, device_time_s=1.0, energy_j=2.0, target_accuracy=0.85,
                                max_samples=40000, batch_size=16, frequency_hz=844_800_000, power_cap_w=3.0)  # fmt: skip
    start = utc_now()
    profiling = ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=12, points_planned=72,
                                  started_at=start, updated_at=start + timedelta(seconds=6), device_id="nano-7")  # fmt: skip
    done = [TrainingOutcome(batch_size=b, seed=0, samples_to_accuracy=900, reached=True, final_accuracy=0.9, samples_processed=1024,
                            evaluations=5, wall_s=20.0) for b in (4, 8)]  # fmt: skip
    running = [ProxyRunProgress(batch_size=b, seed=0, samples=0, accuracy=0.1, target_accuracy=0.85, max_samples=40000,
                                started_at=start, updated_at=start) for b in (16, 32)]  # fmt: skip
    estimation = estimation_progress("k", spec.estimation_request(), done, running)
    for quoted in [*labels, finetune_line(progress), profiling.line(), estimation.line()]:
        assert f"`{flat(quoted)}`" in flat(FLEET) or flat(quoted) in flat(FLEET), quoted


def run_line(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A README command line run in `cwd`, `edgetrain` being this checkout's."""
    command = line.replace("edgetrain ", f"{shlex.join(CLI)} ", 1) if line.startswith("edgetrain ") else line
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_redis_line_runs_with_the_settings_edgetrain_needs_and_its_users_work(tmp_path: Path) -> None:
    lines = commands()
    acl = next(line for line in lines if line.startswith("edgetrain redis-acl"))
    server = next(line for line in lines if line.startswith("redis-server"))
    exported = dict(pair.split("=", 1) for pair in next(line for line in lines if line.startswith("export ")).split()[1:])
    (tmp_path / "secrets").mkdir()
    passwords = {role: f"{role}-secret-{os.getpid()}" for role in ("worker", "submitter", "monitor")}
    for role, password in passwords.items():
        (tmp_path / "secrets" / f"{role}.password").write_text(password + "\n")
    made = run_line(acl, tmp_path, dict(os.environ))
    assert made.returncode == 0 and (tmp_path / "users.acl").read_text().startswith("user default off"), made.stderr
    binary = shutil.which("redis-server", path="/usr/local/bin:/usr/bin")  # the system's: Redis 7 (the virtualenv's is 6)
    assert binary, "the README's Redis line needs redis-server 7 or later (Debian: apt-get install redis-server)"
    port = free_port()
    argv = shlex.split(server.replace("--port 6379", f"--port {port}").replace("--bind 0.0.0.0", "--bind 127.0.0.1"))
    process = subprocess.Popen([binary, *argv[1:], "--dir", str(tmp_path)], cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        url = exported["EDGETRAIN_REDIS_URL"].replace("redis-host:6379", f"127.0.0.1:{port}")
        worker = redis.Redis.from_url(url.replace("worker@", f"worker:{passwords['worker']}@"), decode_responses=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                worker.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
                time.sleep(0.1)
        assert worker.info("persistence")["aof_enabled"] == 1
        assert worker.info("memory")["maxmemory_policy"] == "noeviction"
        with pytest.raises(redis.AuthenticationError):  # the default user is off
            redis.Redis(port=port).ping()
        store = Store(worker)
        store.jobs.create("j1", JobSpec.model_validate(quick_job([{"device_id": "nano-7", "power_cap_w": 3.0}])))
        drive_part(store, "j1", "nano-7", PartState.profiling)
        store.progress.put_profiling(ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=3,
                                                       points_planned=72, started_at=utc_now()))  # fmt: skip
        env = {**os.environ, "EDGETRAIN_REDIS_URL": url,
               "EDGETRAIN_REDIS_PASSWORD_FILE": exported["EDGETRAIN_REDIS_PASSWORD_FILE"].replace("$PWD", str(tmp_path))}  # fmt: skip
        fleet = run_line("edgetrain fleet --json", tmp_path, env)
        assert fleet.returncode == 0 and json.loads(fleet.stdout) == {"devices": [], "workers": [], "caps": {}}, fleet.stderr
        submitter = env | {"EDGETRAIN_REDIS_URL": url.replace("worker@", "submitter@"),
                           "EDGETRAIN_REDIS_PASSWORD_FILE": str(tmp_path / "secrets" / "submitter.password")}  # fmt: skip
        status = run_line("edgetrain status j1 --json", tmp_path, submitter)  # a submitter reads the progress too
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["preparation"]["profiling"]["jetson-nano"]["points_measured"] == 3
    finally:
        process.terminate()
        process.wait(timeout=10)
