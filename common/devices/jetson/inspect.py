"""What a Jetson offers, read-only: board family, GPU devfreq and rail power."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .family import board_family
from .sysfs import (
    SysfsIO,
    available_frequencies,
    board_power_w,
    find_gpu_devfreq,
    find_power_rails,
    read_attr,
    read_model,
    total_rail,
)


def inspect(root: str | Path = "/", io: SysfsIO | None = None) -> dict[str, Any]:
    """What a Jetson offers: board family, GPU devfreq (frequencies in Hz) and rail power (W)."""
    root, io = Path(root), io or SysfsIO()
    devfreq = find_gpu_devfreq(root, io)
    rails = find_power_rails(root, io)
    total = total_rail(rails)

    def read_int(name: str) -> int:
        return int(read_attr(io, devfreq / name))

    return {
        "sysfs_root": str(root),
        "board": board_family(root, devfreq, rails, io),
        "model": read_model(root, io),
        "devfreq_path": str(devfreq),
        "frequencies_hz": available_frequencies(devfreq, io),
        "current_frequency_hz": read_int("cur_freq"),
        "min_frequency_hz": read_int("min_freq"),
        "max_frequency_hz": read_int("max_freq"),
        "governor": read_attr(io, devfreq / "governor"),
        "writable": all(os.access(devfreq / name, os.W_OK) for name in ("min_freq", "max_freq")),
        "rails": [{"name": r.name, "power_w": r.power_w(io)} for r in rails],
        "total_rail": total.name if total else None,
        "total_power_w": board_power_w(rails, io) if rails else None,
    }
