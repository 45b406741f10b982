"""NVML backend for discrete NVIDIA GPUs (package nvidia-ml-py, `import pynvml`).

Read-only unless constructed with allow_clock_control=True: then set_frequency locks the
graphics clock (nvmlDeviceSetGpuLockedClocks, root needed) and restore() resets it.
Frequencies in Hz (NVML speaks MHz), power in W (NVML: mW), energy in J (NVML: mJ).
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

from .base import DeviceError, DevicePermissionError, Measurement, Workload
from .power_sampler import DEFAULT_RATE_HZ, measure_steps

MHZ = 1_000_000


def slugify(name: str) -> str:
    """A device type from a GPU name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _load_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise DeviceError("the nvml backend needs the package nvidia-ml-py (import pynvml): pip install nvidia-ml-py") from exc


class NvmlDevice:
    """One NVIDIA GPU seen through NVML; `nvml` is the pynvml module or a stand-in for tests."""

    backend = "nvml"
    simulated = False

    def __init__(self, index: int = 0, allow_clock_control: bool = False, nvml: Any = None,
                 device_type: str | None = None, sample_rate_hz: float = DEFAULT_RATE_HZ):
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self.index = index
        self.allow_clock_control = allow_clock_control
        self._label = f"GPU {index}"
        self._call("nvmlInit")
        self._handle = self._call("nvmlDeviceGetHandleByIndex", index)
        name = self._call("nvmlDeviceGetName", self._handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self._label = f"GPU {index} ({self.name})"
        self.device_type = device_type or slugify(self.name)
        self._sample_rate_hz = sample_rate_hz
        self._frequencies = self._supported_clocks_hz() if allow_clock_control else [self.current_frequency()]
        self._has_energy_counter = self._energy_counter_supported()
        self._locked = False

    @property
    def frequencies_hz(self) -> list[int]:
        """Supported graphics clocks at the highest memory clock (Hz); with clock control
        off, only the graphics clock at construction."""
        return list(self._frequencies)

    @property
    def software(self) -> dict[str, str]:
        """The NVIDIA driver version a table is made with."""
        version = self._call("nvmlSystemGetDriverVersion")
        return {"nvidia_driver": version.decode() if isinstance(version, bytes) else str(version)}

    @property
    def memory_bytes(self) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", self._handle).total)

    @property
    def power_envelope_w(self) -> list[float] | None:
        return None

    def set_frequency(self, frequency_hz: int) -> None:
        """Lock the graphics clock to `frequency_hz` (Hz); needs allow_clock_control=True."""
        if not self.allow_clock_control:
            if frequency_hz == self._frequencies[0]:
                return
            raise DeviceError(
                f"frequency_hz={frequency_hz}: clock control is off on {self._label}, which only offers its current "
                f"graphics clock {self._frequencies[0]} Hz; start the worker with --allow-clock-control (as root) "
                "to lock clocks"
            )
        if frequency_hz not in self._frequencies:
            raise DeviceError(f"frequency_hz={frequency_hz} is not a supported graphics clock of {self._label}: "
                              f"allowed {self._frequencies} (Hz)")
        mhz = frequency_hz // MHZ
        self._call("nvmlDeviceSetGpuLockedClocks", self._handle, mhz, mhz)
        self._locked = True

    def current_frequency(self) -> int:
        return int(self._call("nvmlDeviceGetClockInfo", self._handle, self._nvml.NVML_CLOCK_GRAPHICS)) * MHZ

    def read_power_w(self) -> float:
        """Board power (W); NVML averages it over about 1 s on Ampere and newer."""
        return self._call("nvmlDeviceGetPowerUsage", self._handle) / 1e3

    def bind_workload(self, workload: Workload) -> None:
        """Nothing to do: the hardware measures the real workload."""

    def fits(self, batch_size: int) -> bool | None:
        return None

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        """Energy from NVML's energy counter when the GPU has one, else from power samples."""
        energy = self._energy_j if self._has_energy_counter else None
        return measure_steps(step, batch_size, steps, self.read_power_w, self._sample_rate_hz, read_energy_j=energy)

    def restore(self) -> None:
        """Reset locked clocks; a no-op when none were locked."""
        if self._locked:
            self._call("nvmlDeviceResetGpuLockedClocks", self._handle)
            self._locked = False

    def __enter__(self) -> "NvmlDevice":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def _supported_clocks_hz(self) -> list[int]:
        memory_mhz = max(self._call("nvmlDeviceGetSupportedMemoryClocks", self._handle))
        graphics_mhz = self._call("nvmlDeviceGetSupportedGraphicsClocks", self._handle, memory_mhz)
        return sorted({int(f) * MHZ for f in graphics_mhz})

    def _energy_j(self) -> float:
        return self._call("nvmlDeviceGetTotalEnergyConsumption", self._handle) / 1e3

    def _energy_counter_supported(self) -> bool:
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except self._nvml.NVMLError as exc:
            if exc.value == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return False
            raise self._error("nvmlDeviceGetTotalEnergyConsumption", exc) from exc
        return True

    def _call(self, function: str, *args: Any) -> Any:
        """nvml.<function>(*args), its NVMLError mapped to DeviceError."""
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as exc:
            raise self._error(function, exc) from exc

    def _error(self, function: str, exc: Any) -> DeviceError:
        if exc.value == self._nvml.NVML_ERROR_NO_PERMISSION:
            return DevicePermissionError(f"{function} on {self._label}: insufficient permissions; locking GPU clocks "
                                         "needs root: run the worker as root (sudo)")
        if exc.value == self._nvml.NVML_ERROR_NOT_SUPPORTED:
            return DeviceError(f"{function} is not supported on {self._label} with this driver")
        return DeviceError(f"{function} on {self._label} failed: {exc}")
