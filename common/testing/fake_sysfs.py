"""Fake Jetson sysfs trees in a temporary folder, laid out as on the boards: devfreq
directories linked from sys/class/devfreq, INA3221 chips linked from sys/bus/i2c/devices,
with a distracting non-GPU devfreq entry and a non-INA3221 chip. The GPU frequency lists
are those of the built-in twins (each cites the L4T release it comes from).

Plain files cannot refuse a write, so KernelRulesIO applies the devfreq rules the kernel
enforces; the backend does all sysfs I/O through such an object.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import override

from edgetrain.common.devices.jetson import SysfsIO
from edgetrain.common.devices.twin_spec import builtin_twins

_TWINS = builtin_twins()
NANO_FREQS = _TWINS["jetson-nano"].frequencies_hz
TX2_FREQS = _TWINS["jetson-tx2-nx"].frequencies_hz
ORIN_NANO_FREQS = _TWINS["jetson-orin-nano"].frequencies_hz
AGX_ORIN_FREQS = _TWINS["jetson-agx-orin"].frequencies_hz


@dataclass(frozen=True)
class Chip:
    """An INA3221 at `address` (e.g. "6-0040"): rails as (label, W) by channel; layout
    "iio" (JetPack 4, channels from 0) or "hwmon" (JetPack 5/6, channels from 1)."""

    address: str
    layout: str
    rails: tuple[tuple[str, float], ...]


@dataclass
class FakeBoard:
    """A built tree: `root` for sysfs_root, `devfreq` the real devfreq directory, rails_w the
    connected rails (W)."""

    root: Path
    devfreq: Path
    frequencies_hz: list[int]
    rails_w: dict[str, float] = field(default_factory=dict)

    def read(self, name: str) -> str:
        """The text of the devfreq attribute `name`."""
        return (self.devfreq / name).read_text().strip()

    def write(self, name: str, value: object) -> None:
        """Set the devfreq attribute `name`, as the kernel would accept it, at once (a reader in
        another thread never sees it half written, as with the kernel's attributes)."""
        staged = self.devfreq / f".{name}.new"
        staged.write_text(f"{value}\n")
        os.replace(staged, self.devfreq / name)

    def settings(self) -> tuple[int, int, str]:
        """(min_freq, max_freq, governor) now."""
        return int(self.read("min_freq")), int(self.read("max_freq")), self.read("governor")


class KernelRulesIO(SysfsIO):
    """SysfsIO that applies devfreq's write rules: min_freq above the current max_freq or
    max_freq below the current min_freq fails with EINVAL; after a write cur_freq becomes the
    old cur_freq clamped to [min_freq, max_freq] and to cap_hz (an nvpmodel-like cap)."""

    def __init__(self, cap_hz: int | None = None):
        self.cap_hz = cap_hz
        self.writes: list[tuple[str, str]] = []

    @override
    def write(self, path: Path, value: str) -> None:
        if path.name in ("min_freq", "max_freq"):
            self._check(path, int(value))
        super().write(path, value)
        self.writes.append((path.name, value))
        if path.name in ("min_freq", "max_freq"):
            low, high = int(self.read(path.parent / "min_freq")), int(self.read(path.parent / "max_freq"))
            current = min(max(int(self.read(path.parent / "cur_freq")), low), high)
            super().write(path.parent / "cur_freq", str(min(current, self.cap_hz or current)))

    def _check(self, path: Path, value: int) -> None:
        low, high = int(self.read(path.parent / "min_freq")), int(self.read(path.parent / "max_freq"))
        if (path.name == "min_freq" and value > high) or (path.name == "max_freq" and value < low):
            raise OSError(errno.EINVAL, f"{path.name}={value} outside [min {low}, max {high}]", str(path))


class ReadOnlyIO(SysfsIO):
    """SysfsIO of a process without root: every write fails with EACCES."""

    @override
    def write(self, path: Path, value: str) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _devfreq(
    root: Path, device_rel: str, entry: str, node_name: str, frequencies: list[int], min_hz: int, max_hz: int, cur_hz: int
) -> Path:
    """A devfreq entry of the device at `device_rel`, its of_node and its class link."""
    device = root / device_rel
    devfreq = device / "devfreq" / entry
    of_node = root / "sys/firmware/devicetree/base" / f"{node_name}@{entry.split('.')[0]}"
    _put(of_node / "name", f"{node_name}\x00")
    _link(device / "of_node", of_node)
    _link(devfreq / "device", device)
    for name, value in {
        "available_frequencies": " ".join(map(str, frequencies)),
        "available_governors": "nvhost_podgov userspace performance simple_ondemand",
        "governor": "nvhost_podgov",
        "min_freq": min_hz,
        "max_freq": max_hz,
        "cur_freq": cur_hz,
    }.items():
        _put(devfreq / name, f"{value}\n")
    _link(root / "sys/class/devfreq" / entry, devfreq)
    return devfreq


def _chip(root: Path, chip: Chip) -> None:
    bus = chip.address.split("-")[0]
    device = root / f"sys/devices/platform/i2c@{bus}/i2c-{bus}" / chip.address
    _put(device / "name", "ina3221x\n" if chip.layout == "iio" else "ina3221\n")
    _link(root / "sys/bus/i2c/devices" / chip.address, device)
    if chip.layout == "iio":
        folder = device / "iio:device0"
        for channel, (label, watts) in enumerate(chip.rails):
            _put(folder / f"rail_name_{channel}", f"{label}\n")
            _put(folder / f"in_power{channel}_input", f"{round(watts * 1000)}\n")
            _put(folder / f"in_voltage{channel}_input", "5000\n")
            _put(folder / f"in_current{channel}_input", f"{round(watts * 200)}\n")
        return
    folder = device / "hwmon/hwmon3"
    for channel, (label, watts) in enumerate(chip.rails, start=1):
        _hwmon_channel(folder, channel, label, watts)


def _hwmon_channel(folder: Path, channel: int, label: str, watts: float) -> None:
    """A channel at 5000 mV drawing `watts` (W): inX_input mV, currX_input mA."""
    _put(folder / f"in{channel}_label", f"{label}\n")
    _put(folder / f"in{channel}_input", "5000\n")
    _put(folder / f"curr{channel}_input", f"{round(watts * 200)}\n")


def _distractors(root: Path) -> None:
    """A non-GPU devfreq entry and a temperature sensor on the i2c bus."""
    _devfreq(root, "sys/devices/15340000.vic", "15340000.vic", "vic", [115200000, 729600000], 115200000, 729600000, 115200000)
    _put(root / "sys/devices/platform/i2c@1/i2c-1/1-004c/name", "tmp451\n")
    _link(root / "sys/bus/i2c/devices/1-004c", root / "sys/devices/platform/i2c@1/i2c-1/1-004c")


def build_board(
    root: Path,
    device_rel: str,
    entry: str,
    node_name: str,
    frequencies: list[int],
    chips: list[Chip],
    model: str | None,
    meminfo_kb: int | None = None,
    min_hz: int | None = None,
    max_hz: int | None = None,
) -> FakeBoard:
    """A Jetson tree under `root`: GPU devfreq (range min_hz..max_hz, default the full list,
    cur_freq = max), INA3221 chips, optional device-tree model and meminfo."""
    low, high = min_hz or frequencies[0], max_hz or frequencies[-1]
    devfreq = _devfreq(root, device_rel, entry, node_name, frequencies, low, high, high)
    for chip in chips:
        _chip(root, chip)
    _distractors(root)
    if model is not None:
        _put(root / "proc/device-tree/model", f"{model}\x00")
    if meminfo_kb is not None:
        _put(root / "proc/meminfo", f"MemTotal:       {meminfo_kb} kB\nMemFree:         1000000 kB\n")
    rails = {label: w for c in chips for label, w in c.rails if label != "NC"}
    return FakeBoard(root=root, devfreq=devfreq, frequencies_hz=frequencies, rails_w=rails)


def build_nano(
    root: Path, model: str | None = "NVIDIA Jetson Nano Developer Kit", min_hz: int | None = None, max_hz: int | None = None
) -> FakeBoard:
    """Jetson Nano, JetPack 4: T210 GPU, IIO INA3221 at 6-0040 with POM_5V_IN as the total."""
    chip = Chip("6-0040", "iio", (("POM_5V_IN", 4.8), ("POM_5V_GPU", 1.6), ("POM_5V_CPU", 1.2)))
    return build_board(
        root, "sys/devices/57000000.gpu", "57000000.gpu", "gpu", NANO_FREQS, [chip], model, meminfo_kb=4051060, min_hz=min_hz, max_hz=max_hz
    )


def build_tx2_nx(
    root: Path, model: str | None = "NVIDIA Jetson TX2 NX Developer Kit", min_hz: int | None = None, max_hz: int | None = None
) -> FakeBoard:
    """Jetson TX2 NX, JetPack 4: gp10b GPU, IIO INA3221 at 2-0040 with VDD_IN as the total."""
    chip = Chip("2-0040", "iio", (("VDD_IN", 6.4), ("VDD_CPU_GPU", 2.8), ("VDD_SOC", 1.0)))
    return build_board(
        root,
        "sys/devices/17000000.gp10b",
        "17000000.gp10b",
        "gp10b",
        TX2_FREQS,
        [chip],
        model,
        meminfo_kb=3952940,
        min_hz=min_hz,
        max_hz=max_hz,
    )


def build_orin_nano(
    root: Path, model: str | None = "NVIDIA Jetson Orin Nano Developer Kit", min_hz: int | None = None, max_hz: int | None = None
) -> FakeBoard:
    """Jetson Orin Nano, JetPack 6: GPU devfreq under platform/bus@0, hwmon INA3221 at 1-0040
    (VDD_IN total, VDD_CPU_GPU_CV, VDD_SOC, the channel 7 sum) and a second chip at 1-0041
    whose only channel is not connected (NC)."""
    board = build_board(
        root,
        "sys/devices/platform/bus@0/17000000.gpu",
        "17000000.gpu",
        "gpu",
        ORIN_NANO_FREQS,
        [Chip("1-0040", "hwmon", (("VDD_IN", 7.5), ("VDD_CPU_GPU_CV", 3.0), ("VDD_SOC", 1.5))), Chip("1-0041", "hwmon", (("NC", 0.9),))],
        model,
        meminfo_kb=7802784,
        min_hz=min_hz,
        max_hz=max_hz,
    )
    # The sum channel carries a current file here so that only the channel-7 rule keeps it out.
    _hwmon_channel(board.root / "sys/devices/platform/i2c@1/i2c-1/1-0040/hwmon/hwmon3", 7, "sum of shunt voltages", 12.0)
    return board


def build_agx_orin(root: Path, model: str | None = None, min_hz: int | None = None, max_hz: int | None = None) -> FakeBoard:
    """AGX Orin, JetPack 5: ga10b GPU, hwmon INA3221 at 1-0040 without a total rail."""
    chip = Chip("1-0040", "hwmon", (("VDD_GPU_SOC", 9.0), ("VDD_CPU_CV", 4.0), ("VIN_SYS_5V0", 3.5)))
    return build_board(
        root, "sys/devices/17000000.ga10b", "17000000.ga10b", "ga10b", AGX_ORIN_FREQS, [chip], model, min_hz=min_hz, max_hz=max_hz
    )
