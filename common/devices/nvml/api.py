"""NVML (package nvidia-ml-py, `import pynvml`) for one GPU, with its errors as DeviceError.

The module is `pynvml` unless the environment variable EDGETRAIN_NVML_MODULE names another
one with the same functions: the tests point it at edgetrain.common.testing.fake_nvml, so
that commands run in a subprocess (`edgetrain device inspect`, a device worker) see a fake
GPU. Units as NVML speaks them: MHz, mW, mJ.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..base import DeviceError, DevicePermissionError

NVML_MODULE_ENV = "EDGETRAIN_NVML_MODULE"
MHZ = 1_000_000

# What a write that NVML refuses without root was meant to do, for the error message.
PRIVILEGED = {
    "nvmlDeviceSetGpuLockedClocks": "locking GPU clocks",
    "nvmlDeviceResetGpuLockedClocks": "resetting locked GPU clocks",
    "nvmlDeviceSetPowerManagementLimit": "changing the GPU power limit",
}


def load_nvml() -> Any:
    """The NVML module: $EDGETRAIN_NVML_MODULE, else pynvml."""
    name = os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise DeviceError(
            f"the nvml backend needs the package nvidia-ml-py (import {name} failed: {exc}): pip install nvidia-ml-py"
        ) from exc


class Nvml:
    """NVML calls on the GPU at `index`; `module` is pynvml or a stand-in with its names."""

    def __init__(self, module: Any = None, index: int = 0):
        self.module = module if module is not None else load_nvml()
        self.index = index
        self.label = f"GPU {index}"
        self.call("nvmlInit")
        count = int(self.call("nvmlDeviceGetCount"))
        if not 0 <= index < count:
            raise DeviceError(f"gpu_index={index}: this machine has {count} NVIDIA GPU(s), indices 0..{count - 1}")
        self.handle = self.call("nvmlDeviceGetHandleByIndex", index)
        self.name = text(self.call("nvmlDeviceGetName", self.handle))
        self.label = f"GPU {index} ({self.name})"

    def call(self, function: str, *args: Any) -> Any:
        """module.<function>(*args), its NVMLError mapped to DeviceError."""
        try:
            return getattr(self.module, function)(*args)
        except self.module.NVMLError as exc:
            raise self.error(function, exc) from exc

    def on_device(self, function: str, *args: Any) -> Any:
        """A call whose first argument is this GPU's handle."""
        return self.call(function, self.handle, *args)

    def supported(self, function: str, *args: Any) -> bool:
        """Whether an on-device call works here (False when NVML says NOT_SUPPORTED)."""
        try:
            getattr(self.module, function)(self.handle, *args)
        except self.module.NVMLError as exc:
            if exc.value == self.module.NVML_ERROR_NOT_SUPPORTED:
                return False
            raise self.error(function, exc) from exc
        return True

    def error(self, function: str, exc: Any) -> DeviceError:
        """An NVMLError of `function` as a DeviceError saying what is needed."""
        if exc.value == self.module.NVML_ERROR_NO_PERMISSION:
            what = PRIVILEGED.get(function, "this call")
            return DevicePermissionError(
                f"{function} on {self.label}: insufficient permissions; {what} needs root: run the worker as root (sudo)"
            )
        if exc.value == self.module.NVML_ERROR_NOT_SUPPORTED:
            return DeviceError(f"{function} is not supported on {self.label} with this driver")
        return DeviceError(f"{function} on {self.label} failed: {exc}")


def text(value: str | bytes) -> str:
    """NVML strings come as bytes from older pynvml releases."""
    return value.decode() if isinstance(value, bytes) else str(value)
