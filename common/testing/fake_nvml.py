"""A fake NVML: the part of pynvml the nvml backend uses, with pynvml's names and error
codes, for machines without an NVIDIA GPU.

In-process, pass a `FakeNvml` instance as `NvmlDevice(nvml=...)`. Across processes, set
EDGETRAIN_NVML_MODULE=edgetrain.common.testing.fake_nvml: the module itself then stands in
for pynvml, its functions served by one default FakeNvml configured from the environment:

- EDGETRAIN_FAKE_NVML_FAIL: "function:code,..." makes those functions raise NVMLError(code)
  (e.g. "nvmlInit:12" for a machine without the driver's library);
- EDGETRAIN_FAKE_NVML_LOG: a file to which every call that changes a setting is appended
  as a line "function arg ..." (what a test in another process checks).

The GPU idles at 345 MHz and 70 W; while `busy` (a context manager, or a step function
that a test wraps with it) it boosts to 1980 MHz and draws 250 W, both held down by the
power limit: the clock scales with the square root of limit / 700 W (the upper bound).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1

FAIL_ENV = "EDGETRAIN_FAKE_NVML_FAIL"
LOG_ENV = "EDGETRAIN_FAKE_NVML_LOG"


class NVMLError(Exception):
    """pynvml.NVMLError: `value` is the NVML return code."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """One fake GPU (an H100 by default). `fail` maps a function name to the NVML error code
    it raises; `log` is a file that records every call changing a setting."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    GRAPHICS_MHZ = {2619: [1980, 1755, 1500, 1005, 210], 1593: [1500, 210]}  # descending, as NVML lists them
    IDLE_MHZ, BOOST_MHZ = 345, 1980
    IDLE_MW, BUSY_MW = 70_000, 250_000
    LIMIT_RANGE_MW = (200_000, 700_000)
    ENERGY_RATE_MW = 200_000  # the energy counter's rate, apart from the power readings

    def __init__(
        self, name: str | bytes = "NVIDIA H100 80GB HBM3", fail: dict[str, int] | None = None, log: str | None = None, gpus: int = 1
    ):
        self.name, self.fail, self.log, self.gpus = name, dict(fail or {}), log, gpus
        self.locked: tuple[int, int] | None = None
        self.limit_mw = self.LIMIT_RANGE_MW[1]
        self.t0 = time.monotonic()
        self._busy = threading.Event()

    def __getattribute__(self, attr: str) -> Any:
        fail = object.__getattribute__(self, "fail")
        if attr in fail:

            def failing(*args: Any) -> Any:
                raise NVMLError(fail[attr])

            return failing
        return object.__getattribute__(self, attr)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The GPU runs kernels inside the block."""
        self._busy.set()
        try:
            yield
        finally:
            self._busy.clear()

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if not 0 <= index < self.gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
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
        assert clock in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM)
        if self.locked:
            return self.locked[0]
        if not self._busy.is_set():
            return self.IDLE_MHZ
        return round(self.BOOST_MHZ * (self.limit_mw / self.LIMIT_RANGE_MW[1]) ** 0.5)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return min(self.BUSY_MW, self.limit_mw) if self._busy.is_set() else self.IDLE_MW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        return round(self.ENERGY_RATE_MW * (time.monotonic() - self.t0))  # mJ

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, free=79 * 2**30, used=2**30)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: str) -> list[int]:
        return list(self.LIMIT_RANGE_MW)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: str) -> int:
        return self.LIMIT_RANGE_MW[1]

    def nvmlDeviceGetPowerManagementLimit(self, handle: str) -> int:
        return self.limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: str, limit_mw: int) -> None:
        low, high = self.LIMIT_RANGE_MW
        if not low <= limit_mw <= high:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._record("nvmlDeviceSetPowerManagementLimit", limit_mw)
        self.limit_mw = limit_mw

    def nvmlDeviceSetGpuLockedClocks(self, handle: str, low_mhz: int, high_mhz: int) -> None:
        self._record("nvmlDeviceSetGpuLockedClocks", low_mhz, high_mhz)
        self.locked = (low_mhz, high_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: str) -> None:
        self._record("nvmlDeviceResetGpuLockedClocks")
        self.locked = None

    def _record(self, function: str, *args: int) -> None:
        if self.log:
            with open(self.log, "a") as f:
                f.write(" ".join([function, *map(str, args)]) + "\n")


def _from_environment() -> FakeNvml:
    pairs = [p.split(":") for p in os.environ.get(FAIL_ENV, "").split(",") if p.strip()]
    return FakeNvml(fail={name.strip(): int(code) for name, code in pairs}, log=os.environ.get(LOG_ENV))


DEFAULT = _from_environment()


def __getattr__(name: str) -> Any:
    """Module-level pynvml functions: those of DEFAULT."""
    if name.startswith("nvml"):
        return getattr(DEFAULT, name)
    raise AttributeError(name)
