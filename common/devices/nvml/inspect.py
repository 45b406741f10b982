"""What an NVIDIA GPU offers through NVML, read-only: name, driver, supported clocks,
power limit range and default, current power and clocks, energy counter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import MHZ, Nvml, text


def inspect_nvml(index: int = 0, module: Any = None) -> dict[str, Any]:
    """The GPU at `index`: clocks in Hz, power in W, energy in J, memory in bytes. A value
    this GPU or driver does not report is None, and its NVML function is listed under
    "not_supported"."""
    nvml = Nvml(module, index)
    missing: list[str] = []

    def optional(function: str, convert: Callable[[Any], Any], *args: Any) -> Any:
        if not nvml.supported(function, *args):
            missing.append(function)
            return None
        return convert(nvml.on_device(function, *args))

    def watts(mw: Any) -> float:
        return int(mw) / 1e3

    clock = nvml.module  # NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS
    memory_clocks = optional("nvmlDeviceGetSupportedMemoryClocks", lambda v: sorted(int(m) for m in v))
    graphics = None
    if memory_clocks:
        graphics = optional("nvmlDeviceGetSupportedGraphicsClocks", lambda v: sorted({int(f) * MHZ for f in v}), memory_clocks[-1])
    limits = optional("nvmlDeviceGetPowerManagementLimitConstraints", lambda v: [watts(v[0]), watts(v[1])])
    return {
        "index": index,
        "name": nvml.name,
        "gpu_count": int(nvml.call("nvmlDeviceGetCount")),
        "driver_version": text(nvml.call("nvmlSystemGetDriverVersion")),
        "memory_bytes": int(nvml.on_device("nvmlDeviceGetMemoryInfo").total),
        "supported_graphics_clocks_hz": graphics,
        "max_memory_clock_hz": memory_clocks[-1] * MHZ if memory_clocks else None,
        "sm_clock_hz": optional("nvmlDeviceGetClockInfo", lambda v: int(v) * MHZ, clock.NVML_CLOCK_SM),
        "graphics_clock_hz": optional("nvmlDeviceGetClockInfo", lambda v: int(v) * MHZ, clock.NVML_CLOCK_GRAPHICS),
        "power_w": optional("nvmlDeviceGetPowerUsage", watts),
        "power_limit_w": optional("nvmlDeviceGetPowerManagementLimit", watts),
        "power_limit_default_w": optional("nvmlDeviceGetPowerManagementDefaultLimit", watts),
        "power_limit_range_w": limits,
        "energy_counter_j": optional("nvmlDeviceGetTotalEnergyConsumption", lambda v: int(v) / 1e3),
        "not_supported": missing,
    }
