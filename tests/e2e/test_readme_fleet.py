"""The README's "Running a fleet", run as written from an empty folder with nothing but the
package: the secrets and the ACL file made, the system's redis-server (7) started with them, the
workers started from another folder with the exported settings, a job submitted and waited for,
`doctor` as the user the README names; then what an operator meets next on that fleet: a board
whose worker starts after the job was submitted, one that never does, Ctrl-C on `submit --wait`,
and Flower as the monitor user. The only departures from the text: a free port on 127.0.0.1 for
Redis (and `redis-host`), a twin for the board `orin-1` (`--backend jetson` needs the board), no
`--gpus` server (no GPU here), the artifact store in the test's folder."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgetrain.tasks.client import poll_until
from edgetrain.workers.cli_args import ExitCode
from tests.workers.test_readme import FLEET, blocks, commands, flat

pytestmark = pytest.mark.e2e
CLI = shlex.join([sys.executable, "-m", "edgetrain.workers.cli"])
JOB_TIMEOUT_S = 600


def as_written(line: str) -> str:
    """A README command line without its optional `[...]` parts, `edgetrain` being this checkout's."""
    line = re.sub(r"\s*\[[^\]]*\]", "", line)
    return line.replace("edgetrain ", f"{CLI} ", 1) if line.startswith("edgetrain ") else line


@dataclass
class Fleet:
    root: Path  # the folder the README's commands run in
    port: int
    env: dict[str, str]  # the environment after the README's `export`
    workers: list[subprocess.Popen] = field(default_factory=list)

    def shell(self, line: str, env: dict[str, str] | None = None, timeout_s: float = JOB_TIMEOUT_S) -> subprocess.CompletedProcess:
        """A README command line run by bash in the fleet's folder."""
        return subprocess.run(as_written(self.local(line)), shell=True, executable="/bin/bash", cwd=self.root, env=env or self.env,
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip

    def local(self, text: str) -> str:
        return text.replace("redis-host:6379", f"127.0.0.1:{self.port}")

    def start(self, line: str, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A README command line started in another folder than the fleet's (as a systemd unit
        would), its output in logs/NAME.log."""
        (self.root.parent / "elsewhere").mkdir(exist_ok=True)
        log = open(self.root.parent / "logs" / f"{name}.log", "ab")
        process = subprocess.Popen(as_written(self.local(line)), shell=True, executable="/bin/bash", cwd=self.root.parent / "elsewhere",
                                   env=env or self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.workers.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.root.parent / "logs" / f"{name}.log").read_text()

    def devices(self) -> set[str]:
        done = self.shell("edgetrain fleet --json", timeout_s=60)
        return {d["device_id"] for d in json.loads(done.stdout)["devices"]} if done.returncode == 0 else set()

    def job_file(self, name: str, **changes: object) -> str:
        """The README's job.json, with `changes`, written to NAME in the fleet's folder."""
        spec = json.loads(blocks(FLEET, "json")[0]) | changes
        (self.root / name).write_text(json.dumps(spec))
        return name


def system_redis() -> str:
    binary = shutil.which("redis-server", path="/usr/local/bin:/usr/bin")
    if binary is None:
        pytest.skip("the README's fleet needs redis-server 7 or later (Debian: apt-get install redis-server)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    if int(re.search(r"v=(\d+)", version)[1]) < 7:
        pytest.skip(f"the README's ACL file needs Redis 7 or later; this is {version}")
    return binary


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    binary = system_redis()
    base = tmp_path_factory.mktemp("readme-fleet")
    (base / "logs").mkdir()
    root = base / "fleet"
    root.mkdir()  # empty
    from edgetrain.common.testing.redis_server import free_port

    inherited = {k: v for k, v in os.environ.items() if not k.startswith("EDGETRAIN_")}
    env = inherited | {"EDGETRAIN_ARTIFACT_DIR": str(base / "artifacts"), "EDGETRAIN_TORCH_THREADS": "1"}
    lines = commands()
    f = Fleet(root, free_port(), env)
    made = f.shell(next(line for line in lines if line.startswith("edgetrain redis-acl")), env)
    assert made.returncode == 0, made.stderr
    redis_line = next(line for line in lines if line.startswith("redis-server"))
    argv = shlex.split(redis_line.replace("--port 6379", f"--port {f.port}").replace("--bind 0.0.0.0", "--bind 127.0.0.1"))
    redis = subprocess.Popen([binary, *argv[1:]], cwd=root, stdout=open(base / "logs" / "redis.log", "ab"), stderr=subprocess.STDOUT)
    try:
        export = next(line for line in lines if line.startswith("export "))
        names = [pair.split("=")[0] for pair in export.split()[1:]]
        shown = subprocess.run(f"{export} && printf '%s\\0' {' '.join(f'${n}' for n in names)}", shell=True, executable="/bin/bash",
                               cwd=root, env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
        f.env = env | {n: f.local(v) for n, v in zip(names, shown.split("\0"))}
        for k, line in enumerate(line for line in lines if line.startswith("edgetrain worker ")):
            if "--gpus" in line:
                continue  # no GPU on this machine
            f.start(line.replace("--backend jetson", "--backend sim:jetson-agx-orin"), f"worker-{k}")
        poll_until(lambda: f.devices() >= {"nano-7", "orin-1"} or None, 180, 1.0, "the README's devices in the fleet")
        yield f
    finally:
        for process in f.workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in f.workers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        redis.terminate()
        redis.wait(timeout=30)


def test_the_fleet_section_runs_as_written_from_an_empty_folder(fleet: Fleet) -> None:
    secrets = fleet.root / "secrets"
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in secrets.iterdir()) == sorted(f"{r}.password" for r in ("worker", "submitter", "monitor", "replica",
                                                                                          "sentinel"))  # fmt: skip
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets.iterdir())
    assert (fleet.root / "users.acl").read_text().startswith("user default off")
    assert fleet.env["EDGETRAIN_REDIS_PASSWORD_FILE"] == str(secrets / "worker.password")  # absolute: the workers ran elsewhere

    fleet.job_file("job.json")
    submit = next(line for line in commands() if line.startswith("edgetrain submit job.json"))
    done = fleet.shell(submit.replace("[--wait]", "--wait"))
    assert done.returncode == ExitCode.ok, (done.stdout[-3000:], done.stderr[-3000:])
    assert "nano-7 [jetson-nano]" in done.stdout and "orin-1 [jetson-agx-orin]" in done.stdout

    doctor = next(line for line in commands() if line.startswith("edgetrain doctor"))
    as_worker = fleet.shell(doctor, timeout_s=120)
    assert as_worker.returncode == ExitCode.ok and "all well" in as_worker.stdout, as_worker.stdout + as_worker.stderr
    as_monitor = re.search(r"`(EDGETRAIN_REDIS_URL=redis://monitor@\S+ EDGETRAIN_REDIS_PASSWORD_FILE=\S+ edgetrain doctor)`", flat(FLEET))
    assert as_monitor, "the README names the user doctor runs as"
    monitor = fleet.shell(as_monitor[1], env={k: v for k, v in fleet.env.items() if not k.startswith("EDGETRAIN_REDIS")}, timeout_s=120)
    assert monitor.returncode == ExitCode.ok and "all well" in monitor.stdout, monitor.stdout + monitor.stderr


def test_a_board_whose_worker_starts_after_the_submission_is_waited_for(fleet: Fleet) -> None:
    job = fleet.job_file("late.json", devices=[{"device_id": "nano-8", "power_cap_w": 3.0}])
    submit = subprocess.Popen(as_written(f"edgetrain submit {job} --wait"), shell=True, executable="/bin/bash", cwd=fleet.root,
                              env=fleet.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        job_id = submit.stdout.readline().strip()
        assert re.fullmatch(r"[0-9a-f]{12}", job_id), submit.stderr.read() if submit.poll() is not None else job_id
        note = submit.stderr.readline()
        assert note.startswith("note: not registered in the fleet (yet): nano-8; its part waits up to the job's device_grace_s "
                               "(120 s)"), note  # fmt: skip
        waiting = "'nano-8' is not registered in the fleet (yet)"
        shown: list[str] = []  # what --wait prints, line by line

        def read_lines() -> None:
            for line in iter(submit.stderr.readline, ""):
                shown.append(line)

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        poll_until(lambda: any(waiting in line for line in shown) or None, 60, 0.2, "--wait showing the part waiting for the board")
        fleet.start("edgetrain worker device --device-id nano-8 --backend sim:jetson-nano", "worker-nano-8")
        submit.wait(timeout=JOB_TIMEOUT_S)
        reader.join(timeout=10)
        out, err = submit.stdout.read(), "".join(shown)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == ExitCode.ok, (out[-2000:], err[-3000:])


def test_a_board_that_never_registers_fails_when_its_grace_ends_and_wait_exits_2(fleet: Fleet) -> None:
    job = fleet.job_file("ghost.json", devices=[{"device_id": "ghost-9", "power_cap_w": 3.0}], device_grace_s=3)
    started = time.monotonic()
    done = fleet.shell(f"edgetrain submit {job} --wait")
    assert done.returncode == ExitCode.usage, (done.stdout, done.stderr)
    assert "unknown device 'ghost-9': not registered in the fleet within the job's grace period of 3 s" in done.stdout, done.stdout
    assert time.monotonic() - started >= 3


def test_ctrl_c_on_submit_wait_says_the_job_goes_on_and_how_to_follow_or_cancel_it(fleet: Fleet) -> None:
    job = fleet.job_file("long.json", devices=[{"device_id": "nano-7", "power_cap_w": 3.0}], max_samples=200_000, target_accuracy=0.99)
    submit = subprocess.Popen([*shlex.split(CLI), "submit", job, "--wait"], cwd=fleet.root, env=fleet.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    job_id = submit.stdout.readline().strip()
    time.sleep(1)  # let it wait
    submit.send_signal(signal.SIGINT)
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == ExitCode.interrupted, err
    assert (f"edgetrain: job {job_id} not waited for: interrupted; it goes on: `edgetrain status {job_id}` follows it, "
            f"`edgetrain cancel {job_id}` stops it") in err, err  # fmt: skip
    status = fleet.shell(f"edgetrain status {job_id} --json", timeout_s=60)
    assert json.loads(status.stdout)["state"] in ("queued", "running"), status.stdout  # it goes on
    assert fleet.shell(f"edgetrain cancel {job_id}", timeout_s=60).returncode == ExitCode.ok


def test_flower_as_the_monitor_says_its_permission_warnings_are_expected(fleet: Fleet) -> None:
    from edgetrain.common.testing.redis_server import free_port

    flower_line = next(line for line in commands() if line.startswith("edgetrain flower"))
    as_monitor = fleet.env | {"EDGETRAIN_REDIS_URL": f"redis://monitor@127.0.0.1:{fleet.port}/0",
                              "EDGETRAIN_REDIS_PASSWORD_FILE": str(fleet.root / "secrets" / "monitor.password")}  # fmt: skip
    flower = fleet.start(flower_line.replace("--port 5555", f"--port {free_port()}"), "flower", as_monitor)
    try:
        warnings = poll_until(lambda: (w := [line for line in fleet.log("flower").splitlines() if "Inspect method" in line])
                              and len(w) >= 4 and w or None, 120, 0.5, "Flower's inspections refused")  # fmt: skip
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(timeout=30)
    assert all("no permissions" in w and "(expected with the Redis user 'monitor', which has no remote control" in w
               for w in warnings), warnings  # fmt: skip
