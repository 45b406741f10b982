"""Whether this process may set a device's control axis, asked before any task needs it: a
worker records what it found at start (`edgetrain doctor` shows it), instead of a fine-tune
failing on its first pinned frequency.

- Jetson: writing devfreq's min_freq, max_freq and governor needs root (or a udev rule that
  lets the worker's user write them).
- NVML: locking clocks (--allow-clock-control) or setting the power limit
  (--allow-power-limit) needs root (the driver asks for CAP_SYS_ADMIN); read-only use needs
  nothing.
- Simulated twins: nothing."""

from __future__ import annotations

import os
from pathlib import Path

from ..control_axis import ControlAxis
from .base import Device

CAP_SYS_ADMIN = 21  # linux/capability.h


def control_problems(device: Device) -> list[tuple[str, str]]:
    """(problem, fix) for each setting this process may not change on `device`."""
    from .jetson import JetsonDevice
    from .nvml import NvmlDevice

    if isinstance(device, JetsonDevice):
        blocked = [name for name in ("min_freq", "max_freq", "governor") if not os.access(device.devfreq / name, os.W_OK)]
        if not blocked:
            return []
        return [(
            f"this worker (uid {os.geteuid()}) cannot write {', '.join(blocked)} in {device.devfreq}: it cannot pin the GPU clock",
            f"run the device worker as root (sudo, or User=root in its systemd unit), or add a udev rule that lets its user "
            f"write min_freq, max_freq and governor in {device.devfreq}",
        )]  # fmt: skip
    if isinstance(device, NvmlDevice) and device.control is not ControlAxis.DRIVER_CLOCK and not administrator():
        what = "lock GPU clocks" if device.control is ControlAxis.GPU_CLOCK_HZ else "set the GPU power limit"
        return [(
            f"this worker (uid {os.geteuid()}) lacks root's CAP_SYS_ADMIN: NVML refuses to {what} (NO_PERMISSION)",
            "run the device worker as root, or without --allow-clock-control/--allow-power-limit for read-only use",
        )]  # fmt: skip
    return []


def administrator() -> bool:
    """Whether this process holds CAP_SYS_ADMIN, what NVIDIA's driver asks of a caller that sets
    clocks or power limits (Linux: /proc/self/status; elsewhere: whether it runs as root)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return os.geteuid() == 0
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> CAP_SYS_ADMIN & 1)
