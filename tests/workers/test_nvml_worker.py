"""A device worker on an NVIDIA GPU (the fake NVML module) registers its control axis in the
fleet: read-only it offers the driver's choice, never the clock it read at start."""

import os
import signal
import subprocess
import sys
import time

import pytest

from edgetrain.common.control_axis import DRIVER_CHOICE, ControlAxis
from edgetrain.common.store import Store

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("flags", "control", "settings"),
    [
        ([], ControlAxis.DRIVER_CLOCK, [DRIVER_CHOICE]),
        (["--allow-power-limit"], ControlAxis.POWER_LIMIT_MW, [200_000 + 25_000 * i for i in range(21)]),
    ],
)
def test_nvml_worker_registers_its_control_axis(redis_server, flags: list[str], control: ControlAxis, settings: list[int]) -> None:
    store = Store.connect(redis_server.url)
    store.clear()
    env = {**os.environ, "EDGETRAIN_REDIS_URL": redis_server.url, "EDGETRAIN_NVML_MODULE": "edgetrain.common.testing.fake_nvml",
           "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "edgetrain.workers.cli", "worker", "device", "--device-id", "gpu-1", "--backend", "nvml", *flags]
    worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while store.fleet.device("gpu-1") is None and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
        info = store.fleet.device("gpu-1")
        assert info is not None, worker.stderr.read() if worker.poll() is not None else "not registered"
        assert (info.backend, info.device_type, info.simulated) == ("nvml", "nvidia-h100-80gb-hbm3", False)
        assert info.control is control and info.frequencies_hz == settings
        assert info.software["nvidia_driver"] == "580.65.06" and info.software["torch"]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
            pytest.fail(f"the worker did not stop within 60 s of SIGTERM:\n{worker.communicate(timeout=30)[1][-20000:]}")
        assert code in (0, 128 + signal.SIGTERM)
    assert store.fleet.device("gpu-1") is None
