"""`edgetrain demo` as a user runs it, with a fleet's Redis configured in the environment: it
keeps to a Redis of its own, names its report by job, and writes progress one line per event."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPOSITORY = Path(__file__).parents[2]


def test_the_demo_leaves_the_configured_redis_alone_and_names_its_report_by_job(tmp, redis_server) -> None:
    import redis

    fleet = redis.Redis(unix_socket_path=str(redis_server.socket), decode_responses=True)
    fleet.flushdb()
    fleet.set("a-fleet-record", "1")
    (tmp / "url").write_text(redis_server.url)
    env = {**os.environ, "EDGETRAIN_REDIS_URL": redis_server.url, "EDGETRAIN_REDIS_URL_FILE": str(tmp / "url"),
           "EDGETRAIN_REDIS_PASSWORD_FILE": "secrets/worker.password"}  # a fleet's setting the demo does not read  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", "demo"], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    job_id = re.search(r"^job (\w+): completed$", done.stdout, re.M).group(1)
    assert done.stdout.rstrip().endswith(f"full report: edgetrain-demo-{job_id}.json")
    assert json.loads((tmp / f"edgetrain-demo-{job_id}.json").read_text())["job_id"] == job_id
    assert fleet.keys("*") == ["a-fleet-record"]  # no record, queue or event of the demo's
    lines = done.stderr.splitlines()  # stderr is a pipe: one event, one line, however long
    assert all(line.startswith(("[", "starting ", "stopping ", "submitted job ")) for line in lines), done.stderr
    assert any(len(line) > 80 for line in lines)
    ignored = subprocess.run(["git", "check-ignore", "-q", f"edgetrain-demo-{job_id}.json"], cwd=REPOSITORY)
    assert ignored.returncode == 0  # a report written in the checkout stays out of `git status`
