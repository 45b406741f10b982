import time

import pytest

from edgetrain.common.control_axis import DRIVER_CHOICE, ControlAxis
from edgetrain.common.devices.base import Device, DeviceError, DevicePermissionError
from edgetrain.common.devices.nvml import (
    NvmlDevice,
    inspect_nvml,
    power_limit_settings_mw,
    slugify,
)
from edgetrain.common.testing.fake_nvml import (
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    FakeNvml,
)

MW = 1000


def test_slugify() -> None:
    assert slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slugify("NVIDIA GeForce RTX 4090 (D)") == "nvidia-geforce-rtx-4090-d"


def test_read_only_the_driver_chooses_and_the_observed_clock_is_recorded() -> None:
    """Read-only, the one setting is the driver's choice, never the clock read at start
    (the idle clock); what ran is the SM clock sampled during the steps."""
    nvml = FakeNvml(name=b"NVIDIA H100 80GB HBM3")
    device = NvmlDevice(nvml=nvml)
    assert isinstance(device, Device)
    assert (device.device_type, device.backend, device.simulated) == ("nvidia-h100-80gb-hbm3", "nvml", False)
    assert device.control is ControlAxis.DRIVER_CLOCK
    assert device.frequencies_hz == [DRIVER_CHOICE]
    assert device.current_frequency() == FakeNvml.IDLE_MHZ * 1_000_000  # idle: not what training runs at
    assert device.memory_bytes == 80 * 2**30
    device.set_frequency(DRIVER_CHOICE)  # the one setting: nothing to do
    with pytest.raises(DeviceError, match=r"frequency_hz=1500000000.*read-only.*--allow-power-limit.*--allow-clock-control"):
        device.set_frequency(1500_000_000)

    def step() -> None:
        with nvml.busy():
            time.sleep(0.1)

    m = device.run_steps(step, batch_size=8, steps=4)
    assert m.clock is not None and m.clock.max_hz == FakeNvml.BOOST_MHZ * 1_000_000
    # The region's first and last samples bound it (idle); those between were taken in the steps
    # (a loaded machine may starve the sampling thread of a few), so most samples are busy.
    assert m.clock.mean_hz > (FakeNvml.IDLE_MHZ + FakeNvml.BOOST_MHZ) / 2 * 1_000_000
    assert m.peak_power_w == FakeNvml.BUSY_MW / MW
    assert nvml.locked is None and nvml.limit_mw == FakeNvml.LIMIT_RANGE_MW[1]  # nothing was changed


def test_clock_control_locks_and_restore_resets() -> None:
    nvml = FakeNvml()
    with NvmlDevice(nvml=nvml, allow_clock_control=True) as device:
        assert device.control is ControlAxis.GPU_CLOCK_HZ
        assert device.frequencies_hz == [f * 1_000_000 for f in (210, 1005, 1500, 1755, 1980)]
        device.set_frequency(1005_000_000)
        assert nvml.locked == (1005, 1005) and device.current_frequency() == 1005_000_000
        with pytest.raises(DeviceError, match=r"frequency_hz=1234000000 .*allowed \[210000000"):
            device.set_frequency(1234_000_000)
    assert nvml.locked is None
    device.restore()  # idempotent
    assert nvml.locked is None


def test_power_limit_settings_span_the_constraints_in_steps() -> None:
    assert power_limit_settings_mw(200_000, 700_000, 700_000, 100_000) == [200_000, 300_000, 400_000, 500_000, 600_000, 700_000]
    assert power_limit_settings_mw(100_000, 350_000, 310_000, 100_000) == [100_000, 200_000, 300_000, 310_000, 350_000]
    assert power_limit_settings_mw(150_000, 150_000, 150_000, 25_000) == [150_000]


def test_power_limit_is_the_control_axis_and_restore_puts_the_original_back() -> None:
    nvml = FakeNvml()
    nvml.limit_mw = 600_000  # set by the administrator before the worker started
    with NvmlDevice(nvml=nvml, allow_power_limit=True, power_limit_step_w=100) as device:
        assert device.control is ControlAxis.POWER_LIMIT_MW
        assert device.frequencies_hz == [200_000, 300_000, 400_000, 500_000, 600_000, 700_000]  # ascending, mW
        device.set_frequency(300_000)
        assert nvml.limit_mw == 300_000
        device.set_frequency(500_000)
        assert nvml.limit_mw == 500_000
        with pytest.raises(DeviceError, match=r"frequency_hz=250000 is not a setting .*power limit \(mW\).*allowed \[200000"):
            device.set_frequency(250_000)
    assert nvml.limit_mw == 600_000  # the original, not the default
    device.restore()  # idempotent
    assert nvml.limit_mw == 600_000


def test_power_limit_without_root_explains_itself() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceSetPowerManagementLimit": NVML_ERROR_NO_PERMISSION})
    device = NvmlDevice(nvml=nvml, allow_power_limit=True)
    with pytest.raises(
        DevicePermissionError, match=r"nvmlDeviceSetPowerManagementLimit on GPU 0 .*changing the GPU power limit needs root"
    ):
        device.set_frequency(device.frequencies_hz[0])
    device.restore()  # the limit never changed: nothing to put back
    assert nvml.limit_mw == FakeNvml.LIMIT_RANGE_MW[1]


def test_power_limit_constraints_not_supported_is_a_clear_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetPowerManagementLimitConstraints": NVML_ERROR_NOT_SUPPORTED})
    with pytest.raises(DeviceError, match="nvmlDeviceGetPowerManagementLimitConstraints is not supported on GPU 0"):
        NvmlDevice(nvml=nvml, allow_power_limit=True)
    assert NvmlDevice(nvml=nvml).control is ControlAxis.DRIVER_CLOCK  # read-only does not need it


def test_one_control_axis_at_a_time_and_a_positive_step() -> None:
    with pytest.raises(DeviceError, match="--allow-clock-control locks clocks, --allow-power-limit sets the power limit"):
        NvmlDevice(nvml=FakeNvml(), allow_clock_control=True, allow_power_limit=True)
    with pytest.raises(DeviceError, match="power_limit_step_w=0"):
        NvmlDevice(nvml=FakeNvml(), allow_power_limit=True, power_limit_step_w=0)


def test_a_missing_gpu_index_names_the_ones_there() -> None:
    with pytest.raises(DeviceError, match=r"gpu_index=2: this machine has 1 NVIDIA GPU\(s\), indices 0..0"):
        NvmlDevice(index=2, nvml=FakeNvml())


def test_no_permission_maps_to_device_permission_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceSetGpuLockedClocks": NVML_ERROR_NO_PERMISSION})
    device = NvmlDevice(nvml=nvml, allow_clock_control=True)
    with pytest.raises(DevicePermissionError, match=r"nvmlDeviceSetGpuLockedClocks.*GPU 0 .*locking GPU clocks needs root"):
        device.set_frequency(1980_000_000)
    device.restore()  # nothing was locked
    assert device.read_power_w() == FakeNvml.IDLE_MW / MW


def test_not_supported_maps_to_device_error() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceSetGpuLockedClocks": NVML_ERROR_NOT_SUPPORTED})
    device = NvmlDevice(nvml=nvml, allow_clock_control=True)
    with pytest.raises(DeviceError, match="nvmlDeviceSetGpuLockedClocks is not supported on GPU 0") as caught:
        device.set_frequency(1980_000_000)
    assert not isinstance(caught.value, DevicePermissionError)


def test_energy_comes_from_the_counter_when_supported() -> None:
    nvml = FakeNvml()
    device = NvmlDevice(nvml=nvml)

    def step() -> None:
        with nvml.busy():
            time.sleep(0.05)

    m = device.run_steps(step, batch_size=32, steps=3)
    assert (m.steps, m.batch_size, m.simulated) == (3, 32, False)
    assert m.mean_power_w == pytest.approx(FakeNvml.ENERGY_RATE_MW / MW, rel=0.05)  # the counter, not the samples
    assert m.peak_power_w == FakeNvml.BUSY_MW / MW


def test_energy_falls_back_to_power_samples() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetTotalEnergyConsumption": NVML_ERROR_NOT_SUPPORTED})
    m = NvmlDevice(nvml=nvml).run_steps(lambda: time.sleep(0.05), batch_size=1, steps=2)
    assert m.mean_power_w == FakeNvml.IDLE_MW / MW and m.energy_j == pytest.approx(FakeNvml.IDLE_MW / MW * m.elapsed_s)


def test_driver_version_is_reported_for_tables() -> None:
    assert NvmlDevice(nvml=FakeNvml()).software == {"nvidia_driver": "580.65.06"}


def test_inspect_reports_clocks_power_limits_and_energy() -> None:
    info = inspect_nvml(0, FakeNvml())
    assert (info["name"], info["driver_version"], info["gpu_count"]) == ("NVIDIA H100 80GB HBM3", "580.65.06", 1)
    assert info["supported_graphics_clocks_hz"] == [f * 1_000_000 for f in (210, 1005, 1500, 1755, 1980)]
    assert info["power_limit_range_w"] == [200.0, 700.0] and info["power_limit_default_w"] == 700.0
    assert info["power_w"] == 70.0 and info["sm_clock_hz"] == 345_000_000
    assert info["energy_counter_j"] >= 0 and info["not_supported"] == []
    partial = inspect_nvml(
        0,
        FakeNvml(
            fail={
                "nvmlDeviceGetTotalEnergyConsumption": NVML_ERROR_NOT_SUPPORTED,
                "nvmlDeviceGetPowerManagementLimitConstraints": NVML_ERROR_NOT_SUPPORTED,
            }
        ),
    )
    assert partial["energy_counter_j"] is None and partial["power_limit_range_w"] is None
    assert partial["not_supported"] == ["nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetTotalEnergyConsumption"]


def test_the_worker_process_restores_what_its_pool_child_changed() -> None:
    nvml = FakeNvml()
    nvml.limit_mw = 600_000
    parent = NvmlDevice(nvml=nvml, allow_power_limit=True, power_limit_step_w=100)
    NvmlDevice(nvml=nvml, allow_power_limit=True, power_limit_step_w=100).set_frequency(300_000)  # the child, which dies
    parent.restore()
    assert nvml.limit_mw == 600_000
    clocks = FakeNvml()
    NvmlDevice(nvml=clocks, allow_clock_control=True).set_frequency(1005_000_000)
    NvmlDevice(nvml=clocks, allow_clock_control=True).restore()
    assert clocks.locked is None
