"""Jetson sysfs: reading and writing attribute files, finding the GPU's devfreq node and
the INA3221 power rails, and reading board power. Every path is resolved under a root
("/" on a board), so a fake tree can stand in for one.

Discovery works across L4T R32 to R36 as rbonghi/jetson_stats (jtop) does: devfreq
entries by their device-tree node name, INA3221 chips by their driver name (IIO `ina3221x`
on R32, hwmon `ina3221` on R35/R36).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..base import DeviceError

GPU_NODE_NAMES = ("gp10b", "gv11b", "ga10b", "gb10b")
KNOWN_DEVFREQ_DIRS = (
    "sys/devices/57000000.gpu/devfreq/57000000.gpu",
    "sys/devices/gpu.0/devfreq/57000000.gpu",
    "sys/devices/17000000.gp10b/devfreq/17000000.gp10b",
    "sys/devices/17000000.gv11b/devfreq/17000000.gv11b",
    "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
    "sys/class/devfreq/gpu-gpc-0",
)
INA3221_NAMES = ("ina3221", "ina3221x")  # hwmon driver (JetPack 5/6), IIO driver (JetPack 4)
TOTAL_RAILS = ("POM_5V_IN", "VDD_IN")
SUM_CHANNEL = 7  # hwmon "sum of shunt voltages", not a rail


class SysfsIO:
    """Text reads and writes of sysfs attribute files."""

    def read(self, path: Path) -> str:
        """The file's text without surrounding whitespace or device-tree NULs."""
        return path.read_text().replace("\x00", "").strip()

    def write(self, path: Path, value: str) -> None:
        """Write `value` to the attribute file `path`."""
        with open(path, "w") as f:
            f.write(value)


def read_attr(io: SysfsIO, path: Path) -> str:
    """An attribute's text; DeviceError naming the file when it cannot be read."""
    try:
        return io.read(path)
    except OSError as exc:
        raise DeviceError(f"cannot read {path}: {exc}") from exc


@dataclass(frozen=True)
class Rail:
    """One INA3221 channel: IIO gives power_file (mW); hwmon gives voltage_file (mV) and
    current_file (mA)."""

    name: str
    power_file: Path | None = None
    voltage_file: Path | None = None
    current_file: Path | None = None

    def power_w(self, io: SysfsIO) -> float:
        """The rail's power now (W)."""
        if self.power_file is not None:
            return float(read_attr(io, self.power_file)) / 1e3
        assert self.voltage_file is not None and self.current_file is not None
        return float(read_attr(io, self.voltage_file)) * float(read_attr(io, self.current_file)) / 1e6


def find_gpu_devfreq(root: Path, io: SysfsIO) -> Path:
    """The GPU's devfreq directory: a sys/class/devfreq entry whose device/of_node/name is a
    Jetson GPU node, else the first known directory that exists."""
    for entry in sorted((root / "sys/class/devfreq").glob("*")):
        node = entry / "device/of_node/name"
        if node.is_file() and _is_gpu_node(read_attr(io, node)):
            return entry
    for rel in KNOWN_DEVFREQ_DIRS:
        if (root / rel / "available_frequencies").is_file():
            return root / rel
    raise DeviceError(
        f"no Jetson GPU devfreq entry under {root}: looked for sys/class/devfreq/* whose device/of_node/name "
        f"is one of {GPU_NODE_NAMES} or contains 'gpu', and for {list(KNOWN_DEVFREQ_DIRS)}; "
        "is this a Jetson, and is the sysfs root right?"
    )


def _is_gpu_node(name: str) -> bool:
    return name in GPU_NODE_NAMES or "gpu" in name


def available_frequencies(devfreq: Path, io: SysfsIO) -> list[int]:
    """The GPU frequencies devfreq offers, ascending (Hz)."""
    return sorted({int(v) for v in read_attr(io, devfreq / "available_frequencies").split()})


def find_power_rails(root: Path, io: SysfsIO) -> list[Rail]:
    """The connected rails of every INA3221 under sys/bus/i2c/devices, in bus and channel order."""
    rails: list[Rail] = []
    for name_file in sorted((root / "sys/bus/i2c/devices").glob("*/name")):
        if read_attr(io, name_file) in INA3221_NAMES:
            rails += _hwmon_rails(name_file.parent, io) + _iio_rails(name_file.parent, io)
    return rails


def _is_connected(label: str) -> bool:
    return label.upper() not in ("", "NC")


def _channels(folder: Path, pattern: str) -> list[tuple[int, Path]]:
    """(channel, file) for files of `folder` matching `pattern` (one group: the channel)."""
    found = [(m, p) for p in folder.iterdir() if (m := re.fullmatch(pattern, p.name))]
    return sorted((int(m.group(1)), p) for m, p in found)


def _hwmon_rails(chip: Path, io: SysfsIO) -> list[Rail]:
    rails = []
    for hwmon in sorted(chip.glob("hwmon/hwmon*")):
        for channel, label_file in _channels(hwmon, r"in(\d+)_label"):
            label = read_attr(io, label_file)
            voltage, current = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
            if channel != SUM_CHANNEL and _is_connected(label) and voltage.is_file() and current.is_file():
                rails.append(Rail(label, voltage_file=voltage, current_file=current))
    return rails


def _iio_rails(chip: Path, io: SysfsIO) -> list[Rail]:
    rails = []
    for iio in sorted(chip.glob("iio:device*")):
        for channel, label_file in _channels(iio, r"rail_name_(\d+)"):
            label = read_attr(io, label_file)
            power = iio / f"in_power{channel}_input"
            if _is_connected(label) and power.is_file():
                rails.append(Rail(label, power_file=power))
    return rails


def total_rail(rails: list[Rail]) -> Rail | None:
    """The rail that measures the whole board (POM_5V_IN or VDD_IN), if there is one."""
    return next((r for r in rails if r.name in TOTAL_RAILS), None)


def board_power_w(rails: list[Rail], io: SysfsIO) -> float:
    """Board power now (W): the total rail, else the sum of the rails."""
    total = total_rail(rails)
    return total.power_w(io) if total else sum(r.power_w(io) for r in rails)


def read_model(root: Path, io: SysfsIO) -> str | None:
    """The board's /proc/device-tree/model, if present."""
    path = root / "proc/device-tree/model"
    return read_attr(io, path) if path.is_file() else None
