import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.common.testing.fake_sysfs import NANO_FREQS, build_nano

REPO = Path(__file__).resolve().parents[3]

# Pins a frequency on the fake tree at argv[1], then ends as argv[3] says.
WORKER = """
import sys, time
from edgetrain.common.devices.jetson import JetsonDevice
from edgetrain.common.devices.lifecycle import restore_on_signals
from edgetrain.common.testing.fake_sysfs import KernelRulesIO

device = JetsonDevice(sysfs_root=sys.argv[1], io=KernelRulesIO())
restore_on_signals(device)
device.set_frequency(int(sys.argv[2]))
print("pinned", flush=True)
if sys.argv[3] == "exit":
    sys.exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "exit"])
def test_a_worker_process_restores_the_frequency_when_it_ends(ending: str, tmp_path: Path) -> None:
    fake = build_nano(tmp_path, min_hz=NANO_FREQS[4], max_hz=NANO_FREQS[9])
    original = fake.settings()
    pinned = NANO_FREQS[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), str(pinned), ending],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "pinned", proc.stderr.read()
        if ending != "exit":
            assert fake.settings()[:2] == (pinned, pinned)
            proc.send_signal(getattr(signal, ending))
        returncode = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert fake.settings() == original
    if ending == "SIGINT":  # chained to Python's handler, which raised KeyboardInterrupt
        assert returncode != 0 and "KeyboardInterrupt" in proc.stderr.read()
    else:  # SIGTERM: chained to the default action, which still kills; exit: restored by atexit
        assert returncode == {"SIGTERM": -signal.SIGTERM, "exit": 0}[ending]


# Sets the power limit of the fake GPU (EDGETRAIN_NVML_MODULE) to argv[1] mW, then ends as argv[2] says.
NVML_WORKER = """
import sys, time
from edgetrain.common.devices.lifecycle import restore_on_signals
from edgetrain.common.devices.nvml import NvmlDevice

device = NvmlDevice(allow_power_limit=True)
restore_on_signals(device)
device.set_frequency(int(sys.argv[1]))
print("limited", flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "exit"])
def test_a_worker_process_restores_the_power_limit_when_it_ends(ending: str, tmp_path: Path) -> None:
    log = tmp_path / "nvml-calls.log"
    env = {**os.environ, "EDGETRAIN_NVML_MODULE": "edgetrain.common.testing.fake_nvml", "EDGETRAIN_FAKE_NVML_LOG": str(log)}
    proc = subprocess.Popen(
        [sys.executable, "-c", NVML_WORKER, "300000", ending], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "limited", proc.stderr.read()
        if ending != "exit":
            proc.send_signal(getattr(signal, ending))
        proc.wait(timeout=20)
    finally:
        proc.kill()
    calls = log.read_text().splitlines()
    assert calls == ["nvmlDeviceSetPowerManagementLimit 300000", "nvmlDeviceSetPowerManagementLimit 700000"]
