"""Which device backend this machine has: Jetson sysfs, NVML, or none, and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import DeviceError
from .jetson import inspect as inspect_jetson
from .nvml import inspect_nvml

NEXT_STEP = {
    "jetson": "start a device worker with --backend jetson, as root to pin the GPU clock (reading power and clocks works without root)",
    "nvml": "start a device worker with --backend nvml: read-only by default (the driver chooses the clock); "
    "--allow-power-limit sets the GPU's power limit, --allow-clock-control locks its clocks (both need root)",
    "none": "no Jetson sysfs tree and no NVIDIA GPU were found: on a Jetson, point --sysfs-root at its root "
    "(default /); on a machine with an NVIDIA GPU, install the driver and the package nvidia-ml-py; "
    "anywhere else, run a simulated twin: --backend sim:jetson-orin-nano (edgetrain device twins lists them)",
}


def inspect_machine(sysfs_root: str | Path = "/", gpu_index: int = 0) -> dict[str, Any]:
    """Both backends, read-only: each one's inspection, or why it is not available.

    `backend` is the one a device worker should use: jetson when the sysfs tree has a
    Jetson GPU (also where NVML exists, as on Jetson Thor), else nvml, else none.
    """
    found: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for name, probe in (("jetson", lambda: inspect_jetson(sysfs_root)), ("nvml", lambda: inspect_nvml(gpu_index))):
        try:
            found[name] = probe()
        except DeviceError as exc:
            unavailable[name] = str(exc)
    backend = next(iter(found), "none")
    return {"backend": backend, "next_step": NEXT_STEP[backend], **found, "unavailable": unavailable}
