"""NVML backend for discrete NVIDIA GPUs (package nvidia-ml-py): the device on its control
axis (read-only, power limit or locked clocks) and read-only inspection."""

from .api import NVML_MODULE_ENV
from .device import NvmlDevice, power_limit_settings_mw, slugify
from .inspect import inspect_nvml

__all__ = ["NVML_MODULE_ENV", "NvmlDevice", "inspect_nvml", "power_limit_settings_mw", "slugify"]
