import time
from types import SimpleNamespace
from typing import Any

import pytest

from edgetrain.common.devices.base import Device, DeviceError, DevicePermissionError
from edgetrain.common.devices.nvml import NvmlDevice, slugify


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The part of pynvml the backend uses, with pynvml's names; `fail` maps a function name
    to the NVML error code it raises."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_CLOCK_GRAPHICS = 0
    GRAPHICS_MHZ = {2619: [1980, 1755, 1500, 1005, 210], 1593: [1500, 210]}  # descending, as NVML lists them

    def __init__(self, name: str | bytes = "NVIDIA H100 80GB HBM3", fail: dict[str, int] | None = None):
        self.name, self.fail = name, fail or {}
        self.locked: tuple[int, int] | None = None
        self.t0 = time.monotonic()

    def __getattribute__(self, attr: str) -> Any:
        fail = object.__getattribute__(self, "fail")
        if attr in fail:
            def failing(*args: Any) -> Any:
                raise FakeNVMLError(fail[attr])
            return failing
        return object.__getattribute__(self, attr)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetName(self, handle: str) -> str | bytes:
        return self.name

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.65.06"

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: str) -> list[int]:
        return list(self.GRAPHICS_MHZ)[::-1]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: str, memory_mhz: int) -> list[int]:
        return self.GRAPHICS_MHZ[memory_mhz]

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.NVML_CLOCK_GRAPHICS
        return self.locked[0] if self.locked else 1755

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 250_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        return round(200_000 * (time.monotonic() - self.t0))  # mJ at 200 W

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, free=79 * 2**30, used=2**30)

    def nvmlDeviceSetGpuLockedClocks(self, handle: str, low_mhz: int, high_mhz: int) -> None:
        self.locked = (low_mhz, high_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: str) -> None:
        self.locked = None


def test_slugify() -> None:
    assert slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slugify("NVIDIA GeForce RTX 4090 (D)") == "nvidia-geforce-rtx-4090-d"


def test_read_only_offers_the_current_clock_only() -> None:
    nvml = FakeNvml(name=b"NVIDIA H100 80GB HBM3")
    device = NvmlDevice(nvml=nvml)
    assert isinstance(device, Device)
    assert (device.device_type, device.backend, device.simulated) == ("nvidia-h100-80gb-hbm3", "nvml", False)
    assert device.frequencies_hz == [1755_000_000]
    assert device.current_frequency() == 1755_000_000
    assert device.read_power_w() == 250.0
    assert device.memory_bytes == 80 * 2**30
    device.set_frequency(1755_000_000)  # the one offered frequency: nothing to do
    with pytest.raises(DeviceError, match=r"frequency_hz=1500000000.*--allow-clock-control"):
        device.set_frequency(1500_000_000)
    assert nvml.locked is None


def test_clock_control_locks_and_restore_resets() -> None:
    nvml = FakeNvml()
    with NvmlDevice(nvml=nvml, allow_clock_control=True) as device:
        assert device.frequencies_hz == [f * 1_000_000 for f in (210, 1005, 1500, 1755, 1980)]
        device.set_frequency(1005_000_000)
        assert nvml.locked == (1005, 1005) and device.current_frequency() == 1005_000_000
        with pytest.raises(DeviceError, match=r"frequency_hz=1234000000 .*allowed \[210000000"):
            device.set_frequency(1234_000_000)
    assert nvml.locked is None
    device.restore()  # idempotent
    assert nvml.locked is None


def test_no_permission_maps_to_device_permission_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceSetGpuLockedClocks": FakeNvml.NVML_ERROR_NO_PERMISSION})
    device = NvmlDevice(nvml=nvml, allow_clock_control=True)
    with pytest.raises(DevicePermissionError, match=r"nvmlDeviceSetGpuLockedClocks.*GPU 0 .*needs root"):
        device.set_frequency(1980_000_000)
    device.restore()  # nothing was locked
    assert device.read_power_w() == 250.0


def test_not_supported_maps_to_device_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceSetGpuLockedClocks": FakeNvml.NVML_ERROR_NOT_SUPPORTED})
    device = NvmlDevice(nvml=nvml, allow_clock_control=True)
    with pytest.raises(DeviceError, match="nvmlDeviceSetGpuLockedClocks is not supported on GPU 0") as caught:
        device.set_frequency(1980_000_000)
    assert not isinstance(caught.value, DevicePermissionError)


def test_energy_comes_from_the_counter_when_supported() -> None:
    device = NvmlDevice(nvml=FakeNvml())
    m = device.run_steps(lambda: time.sleep(0.05), batch_size=32, steps=3)
    assert (m.steps, m.batch_size, m.simulated) == (3, 32, False)
    assert m.mean_power_w == pytest.approx(200.0, rel=0.05)  # the counter, not the 250 W samples
    assert m.peak_power_w == 250.0


def test_energy_falls_back_to_power_samples() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetTotalEnergyConsumption": FakeNvml.NVML_ERROR_NOT_SUPPORTED})
    m = NvmlDevice(nvml=nvml).run_steps(lambda: time.sleep(0.05), batch_size=1, steps=2)
    assert m.mean_power_w == 250.0 and m.energy_j == pytest.approx(250.0 * m.elapsed_s)


def test_driver_version_is_reported_for_tables() -> None:
    assert NvmlDevice(nvml=FakeNvml()).software == {"nvidia_driver": "580.65.06"}
