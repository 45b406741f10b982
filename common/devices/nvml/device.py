"""NVML backend for discrete NVIDIA GPUs, on one of three control axes:

- read-only (default): the driver chooses the clock; the device offers the single setting
  DRIVER_CHOICE and records the SM clock observed while each measurement ran.
- power limit (allow_power_limit=True): the settings are power limits (mW) from the
  lower bound of nvmlDeviceGetPowerManagementLimitConstraints up to its upper bound in
  steps of `power_limit_step_w`, plus the default limit; set with
  nvmlDeviceSetPowerManagementLimit (root needed), the original limit put back by restore().
  This is the knob of `nvidia-smi -pl` and of zeus's power-limit optimiser.
- locked clocks (allow_clock_control=True): the supported graphics clocks (Hz), locked
  with nvmlDeviceSetGpuLockedClocks (root needed), reset by restore().

Power in W (NVML: mW), energy in J (NVML: mJ), clocks in Hz (NVML: MHz).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...control_axis import DRIVER_CHOICE, ControlAxis
from ..base import DeviceError, DevicePermissionError, Measurement, Workload
from ..power_sampler import DEFAULT_RATE_HZ, measure_idle, measure_steps
from .api import MHZ, Nvml, text

DEFAULT_POWER_LIMIT_STEP_W = 25.0  # as zeus's power-limit optimiser steps


def slugify(name: str) -> str:
    """A device type from a GPU name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def power_limit_settings_mw(low_mw: int, high_mw: int, default_mw: int, step_mw: int) -> list[int]:
    """Power limits from `low_mw` up in steps of `step_mw`, with `high_mw` and the default
    limit (all mW), ascending."""
    return sorted({*range(low_mw, high_mw, step_mw), high_mw, min(max(default_mw, low_mw), high_mw)})


class NvmlDevice:
    """One NVIDIA GPU seen through NVML; `nvml` is the pynvml module or a stand-in for tests."""

    backend = "nvml"
    simulated = False
    power_resolution_w = 0.001  # nvmlDeviceGetPowerUsage reports mW

    def __init__(
        self,
        index: int = 0,
        allow_clock_control: bool = False,
        allow_power_limit: bool = False,
        nvml: Any = None,
        device_type: str | None = None,
        sample_rate_hz: float = DEFAULT_RATE_HZ,
        power_limit_step_w: float = DEFAULT_POWER_LIMIT_STEP_W,
    ):
        if allow_clock_control and allow_power_limit:
            raise DeviceError(
                "allow_clock_control and allow_power_limit each choose the control axis: give one "
                "(--allow-clock-control locks clocks, --allow-power-limit sets the power limit)"
            )
        if power_limit_step_w <= 0:
            raise DeviceError(f"power_limit_step_w={power_limit_step_w}: must be more than 0 W")
        self._nvml = Nvml(nvml, index)
        self.index = index
        self.name = self._nvml.name
        self.device_type = device_type or slugify(self.name)
        self.control = (
            ControlAxis.GPU_CLOCK_HZ
            if allow_clock_control
            else ControlAxis.POWER_LIMIT_MW
            if allow_power_limit
            else ControlAxis.DRIVER_CLOCK
        )
        self._sample_rate_hz = sample_rate_hz
        self._settings = {
            ControlAxis.GPU_CLOCK_HZ: self._supported_clocks_hz,
            ControlAxis.POWER_LIMIT_MW: lambda: self._power_limits_mw(power_limit_step_w),
            ControlAxis.DRIVER_CLOCK: lambda: [DRIVER_CHOICE],
        }[self.control]()
        self._has_energy_counter = self._nvml.supported("nvmlDeviceGetTotalEnergyConsumption")
        self._locked = False
        # the power limit as found at start: what restore() puts back, also from a worker
        # process whose pool child set a limit and died
        self._original_limit_mw = self._power_limit_mw() if self.control is ControlAxis.POWER_LIMIT_MW else None

    @property
    def frequencies_hz(self) -> list[int]:
        """The settings of the control axis, ascending: graphics clocks at the highest memory
        clock (Hz), power limits (mW), or [DRIVER_CHOICE] when read-only."""
        return list(self._settings)

    @property
    def software(self) -> dict[str, str]:
        """The NVIDIA driver version a table is made with."""
        return {"nvidia_driver": text(self._nvml.call("nvmlSystemGetDriverVersion"))}

    @property
    def memory_bytes(self) -> int:
        return int(self._nvml.on_device("nvmlDeviceGetMemoryInfo").total)

    @property
    def power_envelope_w(self) -> list[float] | None:
        return None

    def set_frequency(self, frequency_hz: int) -> None:
        """Apply one setting: lock the graphics clock (Hz) or set the power limit (mW);
        read-only, only DRIVER_CHOICE is accepted (and changes nothing)."""
        if frequency_hz not in self._settings:
            raise DeviceError(self._not_a_setting(frequency_hz))
        if self.control is ControlAxis.GPU_CLOCK_HZ:
            mhz = frequency_hz // MHZ
            self._nvml.on_device("nvmlDeviceSetGpuLockedClocks", mhz, mhz)
            self._locked = True
        elif self.control is ControlAxis.POWER_LIMIT_MW:
            self._nvml.on_device("nvmlDeviceSetPowerManagementLimit", frequency_hz)

    def current_frequency(self) -> int:
        """The SM clock now (Hz)."""
        return int(self._nvml.on_device("nvmlDeviceGetClockInfo", self._nvml.module.NVML_CLOCK_SM)) * MHZ

    def read_power_w(self) -> float:
        """Board power (W); NVML averages it over about 1 s on Ampere and newer."""
        return self._nvml.on_device("nvmlDeviceGetPowerUsage") / 1e3

    def bind_workload(self, workload: Workload) -> None:
        """Nothing to do: the hardware measures the real workload."""

    def fits(self, batch_size: int) -> bool | None:
        return None

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        """Time, power and the SM clock observed while the steps ran; energy from NVML's
        energy counter when the GPU has one, else from the power samples."""
        energy = self._energy_j if self._has_energy_counter else None
        return measure_steps(
            step, batch_size, steps, self.read_power_w, self._sample_rate_hz, read_energy_j=energy, read_clock_hz=self.current_frequency
        )

    def idle(self, seconds: float) -> Measurement:
        return measure_idle(seconds, self.read_power_w, self._sample_rate_hz)

    def restore(self) -> None:
        """Reset locked clocks and put the power limit found at start back. With clock control
        the reset is always asked for (another process of the worker may have locked them),
        and a refusal matters only if this process locked them."""
        if self.control is ControlAxis.GPU_CLOCK_HZ:
            try:
                self._nvml.on_device("nvmlDeviceResetGpuLockedClocks")
            except DevicePermissionError:
                if self._locked:
                    raise
            self._locked = False
        if self._original_limit_mw is not None and self._power_limit_mw() != self._original_limit_mw:
            self._nvml.on_device("nvmlDeviceSetPowerManagementLimit", self._original_limit_mw)

    def __enter__(self) -> NvmlDevice:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def _not_a_setting(self, value: int) -> str:
        label = self._nvml.label
        if self.control is ControlAxis.DRIVER_CLOCK:
            return (
                f"frequency_hz={value}: {label} is read-only, the driver chooses its clock (the one setting is "
                f"{DRIVER_CHOICE}, the driver's choice); start the worker with --allow-power-limit to set its "
                "power limit, or --allow-clock-control to lock its clocks (both need root)"
            )
        return f"frequency_hz={value} is not a setting of {label} ({self.control.label}): allowed {self._settings}"

    def _supported_clocks_hz(self) -> list[int]:
        memory_mhz = max(self._nvml.on_device("nvmlDeviceGetSupportedMemoryClocks"))
        graphics_mhz = self._nvml.on_device("nvmlDeviceGetSupportedGraphicsClocks", memory_mhz)
        return sorted({int(f) * MHZ for f in graphics_mhz})

    def _power_limits_mw(self, step_w: float) -> list[int]:
        low, high = self._nvml.on_device("nvmlDeviceGetPowerManagementLimitConstraints")
        default = self._nvml.on_device("nvmlDeviceGetPowerManagementDefaultLimit")
        return power_limit_settings_mw(int(low), int(high), int(default), max(1, round(step_w * 1e3)))

    def _power_limit_mw(self) -> int:
        return int(self._nvml.on_device("nvmlDeviceGetPowerManagementLimit"))

    def _energy_j(self) -> float:
        return self._nvml.on_device("nvmlDeviceGetTotalEnergyConsumption") / 1e3
