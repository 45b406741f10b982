"""A device worker: binds a device backend, registers in the fleet with a heartbeat, and
consumes only `device.<id>`, one task at a time; original settings are restored on exit."""

from __future__ import annotations

import signal
import socket
import zlib
from pathlib import Path

from edgetrain.common.devices.base import Device, DeviceError
from edgetrain.common.profiling import software_versions
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import Settings
from edgetrain.common.store import DeviceIdTaken
from edgetrain.tasks import context
from edgetrain.tasks.contract import device_queue

from .celery_worker import consume

DEVICE_TASKS = ("edgetrain.tasks.workflow", "edgetrain.tasks.device", "edgetrain.tasks.federated_work")

BACKENDS = "sim:<twin name or spec file>, jetson, nvml"


def make_device(
    backend: str,
    device_id: str,
    sysfs_root: Path | None = None,
    allow_clock_control: bool = False,
    gpu_index: int = 0,
    allow_power_limit: bool = False,
) -> Device:
    """The device backend named by `backend`; allow_clock_control and allow_power_limit
    choose the nvml backend's control axis (read-only without either)."""
    if allow_power_limit and backend != "nvml":
        raise DeviceError(f"--allow-power-limit applies to the nvml backend only, not to {backend!r}")
    if backend.startswith("sim:"):
        from edgetrain.common.devices.simulated import SimulatedDevice, load_twin

        return SimulatedDevice(load_twin(backend.removeprefix("sim:")), seed=zlib.crc32(device_id.encode()))
    if backend == "jetson":
        from edgetrain.common.devices.jetson import JetsonDevice

        return JetsonDevice(sysfs_root=sysfs_root or Path("/"))
    if backend == "nvml":
        from edgetrain.common.devices.nvml import NvmlDevice

        return NvmlDevice(index=gpu_index, allow_clock_control=allow_clock_control, allow_power_limit=allow_power_limit)
    raise DeviceError(f"backend: unknown backend {backend!r}; use one of: {BACKENDS}")


def device_info(device_id: str, device: Device) -> DeviceInfo:
    """What a device worker announces in the fleet for `device`."""
    return DeviceInfo(
        device_id=device_id,
        device_type=device.device_type,
        backend=device.backend,
        frequencies_hz=device.frequencies_hz,
        memory_bytes=device.memory_bytes,
        simulated=device.simulated,
        power_envelope_w=device.power_envelope_w,
        software=software_versions() | device.software,
        control=device.control,
        hostname=socket.gethostname(),
    )


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_device_worker(settings: Settings, device_id: str, device: Device, loglevel: str = "INFO") -> int:
    """Register `device` in the fleet and run its tasks from `device.<id>`, one at a time, in
    a pool child the worker survives; the device's original settings are restored on exit.
    Returns the worker's exit status."""
    from edgetrain.common.devices.lifecycle import restore_on_signals

    context.init(settings, DEVICE_TASKS)
    context.bind_device(device_id, device)
    # Until Celery installs its own handlers, SIGTERM/SIGINT restore and exit through the
    # `finally` below; afterwards a SIGTERM is a warm shutdown (a running fine-tune checkpoints
    # and stops at its next step, a profile finishes) before that `finally` restores; an exit
    # hook covers the rest.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_on_signal)
    restore_on_signals(device)
    replaced = False
    try:
        return consume([device_queue(device_id)], f"device-{device_id}", "device", 1, loglevel, device_info(device_id, device))
    except DeviceIdTaken:
        replaced = True  # the worker that serves the device now owns its settings
        raise
    finally:
        if not replaced:
            device.restore()
