"""A device worker on a (fake) Jetson board registers its real backend in the fleet."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from edgetrain.common.settings import Settings
from edgetrain.common.store import Store
from edgetrain.common.testing.fake_sysfs import build_nano
from edgetrain.tasks.app import producer_app

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("when", ["starting", "ready"])
def test_jetson_worker_registers_and_leaves_the_fleet_on_sigterm(tmp, redis_server, when: str) -> None:
    board = tmp / "board"
    build_nano(board)
    store = Store.connect(redis_server.url)
    store.clear()
    env = {**os.environ, "EDGETRAIN_REDIS_URL": redis_server.url}
    cmd = [
        sys.executable,
        "-m",
        "edgetrain.workers.cli",
        "worker",
        "device",
        "--device-id",
        "jn-1",
        "--backend",
        "jetson",
        "--sysfs-root",
        str(board),
    ]
    worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while store.fleet.device("jn-1") is None and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
        info = store.fleet.device("jn-1")
        assert info is not None, worker.stderr.read() if worker.poll() is not None else "not registered"
        assert (info.backend, info.simulated, info.device_type) == ("jetson", False, "jetson-nano")
        assert info.frequencies_hz[0] == 76800000 and info.frequencies_hz[-1] >= 921600000
        assert info.software["torch"]
        if when == "ready":
            app = producer_app(Settings(redis_url=redis_server.url))
            while not app.control.ping(destination=[f"device-jn-1@{socket.gethostname()}"], timeout=1.0, limit=1):
                assert time.monotonic() < deadline and worker.poll() is None
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        assert worker.returncode in (0, 128 + signal.SIGTERM), err[-4000:]
    assert store.fleet.device("jn-1") is None


def test_unknown_backend_is_a_clear_error(redis_server) -> None:
    env = {**os.environ, "EDGETRAIN_REDIS_URL": redis_server.url}
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "worker", "device", "--device-id", "x", "--backend", "tpu"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown backend 'tpu'" in done.stderr and "sim:<twin" in done.stderr
