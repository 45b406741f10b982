"""Test doubles for hardware this machine may lack: a fake Jetson sysfs tree and a fake NVML module."""
