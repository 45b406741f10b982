"""A program that runs a local cluster (`edgetrain demo`, `edgetrain evaluate`, a bench) and is
ended with SIGTERM (`kill`, `timeout`, a service manager) takes its cluster down with it: no
worker or Redis is left running."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from edgetrain.workers.processes.cluster import EmbeddedRedis

pytestmark = pytest.mark.e2e

RUN_A_CLUSTER = """
import json, sys, time
from pathlib import Path
from edgetrain.workers.processes.cluster import LocalCluster
with LocalCluster(Path(sys.argv[1]), server_workers=1) as cluster:
    pids = [w.process.pid for w in cluster.workers] + [cluster._redis.process.pid]
    print(json.dumps(pids), flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_the_program_stops_every_process_of_its_cluster(tmp_path) -> None:
    program = subprocess.Popen([sys.executable, "-c", RUN_A_CLUSTER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert program.stdout is not None
        pids = json.loads(program.stdout.readline())
        assert len(pids) == 3 and all(alive(p) for p in pids)  # control, one server worker, Redis
        program.send_signal(signal.SIGTERM)
        assert program.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in pids if alive(p)] == []
    finally:
        program.kill()
        for pid in filter(alive, pids):  # what a failure left behind
            os.killpg(pid, signal.SIGKILL)


def test_an_embedded_redis_in_a_relative_folder_starts(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # `edgetrain evaluate --workdir work` names its folder relative to here
    server = EmbeddedRedis(Path("work") / "redis")
    try:
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()
