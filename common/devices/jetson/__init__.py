"""Jetson backend: the GPU clock through devfreq sysfs, board power from the INA3221 power
monitors (sysfs discovery and rails, board family, the device, read-only inspection)."""

from .device import JetsonDevice
from .inspect import inspect
from .sysfs import SysfsIO

__all__ = ["JetsonDevice", "SysfsIO", "inspect"]
