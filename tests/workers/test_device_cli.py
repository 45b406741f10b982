"""`edgetrain device inspect|twins` through the real command, on a fake Jetson sysfs tree
and with the fake NVML module (EDGETRAIN_NVML_MODULE)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from edgetrain.common.testing.fake_sysfs import build_orin_nano

FAKE_NVML = {"EDGETRAIN_NVML_MODULE": "edgetrain.common.testing.fake_nvml"}
NO_NVIDIA_DRIVER = FAKE_NVML | {"EDGETRAIN_FAKE_NVML_FAIL": "nvmlInit:12"}  # NVML_ERROR_LIBRARY_NOT_FOUND


def edgetrain(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.workers.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_device_inspect_on_a_fake_orin_nano(tmp: Path) -> None:
    build_orin_nano(tmp)
    inspect = ["device", "inspect", "--sysfs-root", str(tmp)]
    done = edgetrain(*inspect, "--json", env=NO_NVIDIA_DRIVER)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "jetson" and "--backend jetson" in report["next_step"]
    jetson = report["jetson"]
    assert jetson["board"].startswith("jetson-orin")
    assert jetson["total_rail"] == "VDD_IN" and jetson["total_power_w"] > 0
    assert "NC" not in {r["name"] for r in jetson["rails"]}
    assert "nvmlInit" in report["unavailable"]["nvml"]
    human = edgetrain(*inspect, env=NO_NVIDIA_DRIVER)
    assert human.returncode == 0 and "backend      jetson" in human.stdout
    assert "MHz" in human.stdout and "VDD_IN" in human.stdout


def test_device_inspect_with_nvml(tmp: Path) -> None:
    inspect = ["device", "inspect", "--sysfs-root", str(tmp)]
    done = edgetrain(*inspect, "--json", env=FAKE_NVML)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "nvml" and "no Jetson GPU devfreq entry" in report["unavailable"]["jetson"]
    nvml = report["nvml"]
    assert (nvml["name"], nvml["driver_version"]) == ("NVIDIA H100 80GB HBM3", "580.65.06")
    assert nvml["supported_graphics_clocks_hz"] == [f * 1_000_000 for f in (210, 1005, 1500, 1755, 1980)]
    assert nvml["power_limit_range_w"] == [200.0, 700.0] and nvml["power_limit_default_w"] == 700.0
    assert nvml["power_w"] == 70.0 and nvml["energy_counter_j"] >= 0
    human = edgetrain(*inspect, env=FAKE_NVML).stdout
    for line in (
        "backend      nvml",
        "gpu          0 of 1: NVIDIA H100 80GB HBM3",
        "driver       580.65.06",
        "supported    210 1005 1500 1755 1980 MHz (5)",
        "power limit  700 W (default 700 W, range 200..700 W)",
        "clock        SM 345 MHz now",
    ):
        assert line in human, human
    assert "--allow-power-limit" in human and "read-only by default" in human


def test_device_inspect_says_when_there_is_no_backend_and_what_to_do(tmp: Path) -> None:
    done = edgetrain("device", "inspect", "--sysfs-root", str(tmp / "nothing"), env=NO_NVIDIA_DRIVER)
    assert done.returncode == 2
    assert "backend      none" in done.stderr and "no Jetson GPU devfreq entry" in done.stderr
    assert "no nvml: nvmlInit on GPU 0 failed: NVML error 12" in done.stderr
    assert "nvidia-ml-py" in done.stderr and "--backend sim:jetson-orin-nano" in done.stderr
    missing_gpu = edgetrain("device", "inspect", "--sysfs-root", str(tmp), "--gpu-index", "3", "--json", env=FAKE_NVML)
    assert missing_gpu.returncode == 2
    assert "gpu_index=3: this machine has 1 NVIDIA GPU(s)" in json.loads(missing_gpu.stdout)["unavailable"]["nvml"]


def test_device_twins_lists_the_builtin_twins() -> None:
    done = edgetrain("device", "twins", "--json", env={})
    assert done.returncode == 0, done.stderr
    twins = {t["name"]: t for t in json.loads(done.stdout)}
    assert set(twins) == {"jetson-nano", "jetson-tx2-nx", "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"}
    orin = twins["jetson-orin-nano"]
    assert orin["device_type"] == "jetson-orin-nano" and orin["simulated"] is True
    assert orin["frequencies_hz"][-1] == 624750000 and len(orin["full_load_power_w"]) == len(orin["frequencies_hz"])
    assert orin["idle_power_w"] < orin["full_load_power_w"][0] and orin["l4t_release"].startswith("R35")
    assert orin["total_rail"] == "VDD_IN" and "VDD_CPU_GPU_CV" in orin["power_rails"]
    assert all(t["sources"] for t in twins.values())
    text = edgetrain("device", "twins", env={}).stdout
    blocks = text.split("\n\n")
    assert len(blocks) == 5 and all("SIMULATED" in b for b in blocks)
    assert "jetson-nano [jetson-nano] SIMULATED, models L4T R32.5.1" in text
    assert "76.8 153.6 230.4 307.2 384 460.8 537.6 614.4 691.2 768 844.8 921.6 MHz (12)" in text
    assert "full load 2.4 W at the lowest to 8.7 W at the highest clock (SIMULATED)" in text
    assert "github.com/emwjacobson/JetsonEfficiencyTesting" in text


def test_allow_power_limit_is_for_nvml_only() -> None:
    done = edgetrain("worker", "device", "--device-id", "n-1", "--backend", "sim:jetson-nano", "--allow-power-limit", env={})
    assert done.returncode == 2 and "--allow-power-limit applies to the nvml backend only" in done.stderr
