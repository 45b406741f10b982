"""Jetson backend: the GPU frequency through devfreq sysfs, board power from the INA3221
power monitors. Every path is resolved under `sysfs_root` ("/" on a board), so a fake
tree can stand in for one; all attribute reads and writes go through one SysfsIO object.

Frequencies are in Hz as devfreq reports them; rail power in W.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .base import DeviceError, DevicePermissionError, Measurement, Workload
from .power_sampler import DEFAULT_RATE_HZ, measure_steps

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

# The SoC by devfreq entry name; the family comes from the device-tree model where it names
# one of that SoC's boards, else from a rail only that family has (exact names:
# VDD_CPU_GPU_CV must not count as VDD_CPU_GPU).
SOC_BY_DEVFREQ = {
    "57000000.gpu": "t210",
    "17000000.gp10b": "t186",
    "17000000.gv11b": "t194",
    "17000000.ga10b": "t234",
    "17000000.gpu": "t234",
    "gpu-gpc-0": "t264",
}
FAMILY_BY_MODEL = (  # (SoC, substring of the lower-cased model, family), most specific first
    ("t210", "tx1", "jetson-tx1"),
    ("t210", "nano", "jetson-nano"),
    ("t186", "tx2 nx", "jetson-tx2-nx"),
    ("t186", "tx2", "jetson-tx2"),
    ("t194", "xavier nx", "jetson-xavier-nx"),
    ("t194", "agx xavier", "jetson-agx-xavier"),
    ("t194", "jetson-agx", "jetson-agx-xavier"),
    ("t194", "jetson-xavier", "jetson-agx-xavier"),
    ("t234", "orin nano", "jetson-orin-nano"),
    ("t234", "orin nx", "jetson-orin-nx"),
    ("t234", "agx orin", "jetson-agx-orin"),
    ("t264", "thor", "jetson-thor"),
)
FAMILY_BY_RAIL = (  # (SoC, rail or None for any, family), first match wins
    ("t210", None, "jetson-nano"),
    ("t186", "VDD_CPU_GPU", "jetson-tx2-nx"),
    ("t186", None, "jetson-tx2"),
    ("t194", "VDD_CPU_GPU_CV", "jetson-xavier-nx"),
    ("t194", None, "jetson-agx-xavier"),
    ("t234", "VDD_GPU_SOC", "jetson-agx-orin"),
    ("t234", None, "jetson-orin"),  # Orin Nano and Orin NX share rails: only the model tells them apart
    ("t264", None, "jetson-thor"),
)


class SysfsIO:
    """Text reads and writes of sysfs attribute files."""

    def read(self, path: Path) -> str:
        """The file's text without surrounding whitespace or device-tree NULs."""
        return path.read_text().replace("\x00", "").strip()

    def write(self, path: Path, value: str) -> None:
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


def board_family(root: Path, devfreq: Path, rails: list[Rail], io: SysfsIO) -> str:
    """A stable board family name such as "jetson-nano", from the GPU's devfreq node (the
    SoC), then the device-tree model or, failing that, the rail names."""
    soc = SOC_BY_DEVFREQ.get(devfreq.name)
    model = (read_model(root, io) or "").lower()
    for family_soc, needle, family in FAMILY_BY_MODEL:
        if needle in model and soc in (family_soc, None):
            return family
    names = {r.name for r in rails}
    for family_soc, rail, family in FAMILY_BY_RAIL:
        if soc == family_soc and (rail is None or rail in names):
            return family
    return "jetson"

class JetsonDevice:
    """A Jetson GPU pinned through devfreq (root needed to write) and measured with the
    INA3221 monitors. Use it as a context manager so restore() runs on errors too."""

    backend = "jetson"
    simulated = False

    def __init__(self, sysfs_root: str | Path = "/", device_type: str | None = None, io: SysfsIO | None = None,
                 sample_rate_hz: float = DEFAULT_RATE_HZ, settle_s: float = 0.5):
        """settle_s: how long set_frequency waits for cur_freq to reach the pinned value (s)."""
        self.root = Path(sysfs_root)
        self._io = io or SysfsIO()
        self.devfreq = find_gpu_devfreq(self.root, self._io)
        self.rails = find_power_rails(self.root, self._io)
        if not self.rails:
            raise DeviceError(
                f"no INA3221 power monitor under {self.root / 'sys/bus/i2c/devices'} "
                f"(looked for a 'name' file reading one of {INA3221_NAMES}): board power cannot be measured"
            )
        self.device_type = device_type or board_family(self.root, self.devfreq, self.rails, self._io)
        self._frequencies = available_frequencies(self.devfreq, self._io)
        self._sample_rate_hz = sample_rate_hz
        self._settle_s = settle_s
        self._original: tuple[int, int, str] | None = None  # min_freq, max_freq (Hz), governor

    @property
    def frequencies_hz(self) -> list[int]:
        return list(self._frequencies)

    @property
    def memory_bytes(self) -> int:
        """RAM shared by CPU and GPU, from proc/meminfo MemTotal (bytes; 0 when unknown)."""
        meminfo = self.root / "proc/meminfo"
        if not meminfo.is_file():
            return 0
        for line in read_attr(self._io, meminfo).splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
        return 0

    @property
    def power_envelope_w(self) -> list[float] | None:
        return None

    @property
    def software(self) -> dict[str, str]:
        """The board's L4T (JetPack) release from etc/nv_tegra_release, e.g. {"l4t": "R32.7.1"}."""
        release = self.root / "etc/nv_tegra_release"
        if not release.is_file():
            return {}
        match = re.match(r"#\s*(R\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", read_attr(self._io, release))
        return {"l4t": f"{match[1]}.{match[2]}"} if match else {}

    def set_frequency(self, frequency_hz: int) -> None:
        """Pin the GPU by writing `frequency_hz` (Hz) to min_freq and max_freq, then check cur_freq."""
        if frequency_hz not in self._frequencies:
            raise DeviceError(f"frequency_hz={frequency_hz} is not available on this {self.device_type}: "
                              f"allowed {self._frequencies} (Hz)")
        if self._original is None:
            self._original = (self._read_int("min_freq"), self._read_int("max_freq"), self._read("governor"))
        self._write_range(frequency_hz, frequency_hz)
        self._check_pinned(frequency_hz)

    def current_frequency(self) -> int:
        return self._read_int("cur_freq")

    def read_power_w(self) -> float:
        return board_power_w(self.rails, self._io)

    def bind_workload(self, workload: Workload) -> None:
        """Nothing to do: the hardware measures the real workload."""

    def fits(self, batch_size: int) -> bool | None:
        return None

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        return measure_steps(step, batch_size, steps, self.read_power_w, self._sample_rate_hz)

    def restore(self) -> None:
        """Put the original min_freq, max_freq and governor back; a no-op when nothing changed."""
        if self._original is None:
            return
        low, high, governor = self._original
        if (self._read_int("min_freq"), self._read_int("max_freq")) != (low, high):
            self._write_range(low, high)
        if self._read("governor") != governor:
            self._write("governor", governor)
        self._original = None

    def __enter__(self) -> "JetsonDevice":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def _write_range(self, low: int, high: int) -> None:
        """Write min_freq=low and max_freq=high (Hz, low <= high) in an order that keeps
        min <= max after each write, as the kernel requires."""
        if low > self._read_int("max_freq"):
            self._write("max_freq", str(high))
            self._write("min_freq", str(low))
        else:
            self._write("min_freq", str(low))
            self._write("max_freq", str(high))

    def _check_pinned(self, frequency_hz: int) -> None:
        deadline = time.monotonic() + self._settle_s
        while (now := self.current_frequency()) != frequency_hz and time.monotonic() < deadline:
            time.sleep(0.01)
        if now != frequency_hz:
            raise DeviceError(
                f"the GPU runs at {now} Hz after pinning min_freq and max_freq to {frequency_hz} Hz: a power mode "
                f"(check `nvpmodel -q`) or a thermal cap limits it; see {self.devfreq / 'cur_freq'}"
            )

    def _read(self, name: str) -> str:
        return read_attr(self._io, self.devfreq / name)

    def _read_int(self, name: str) -> int:
        return int(self._read(name))

    def _write(self, name: str, value: str) -> None:
        path = self.devfreq / name
        try:
            self._io.write(path, value)
        except PermissionError as exc:
            raise DevicePermissionError(
                f"cannot write {value} to {path}: permission denied. Pinning the GPU frequency needs root: "
                f"run the device worker as root (sudo), or add a udev rule that lets its user write "
                f"min_freq, max_freq and governor in {self.devfreq}"
            ) from exc
        except OSError as exc:
            raise DeviceError(f"the kernel rejected {name}={value} at {path}: {exc}") from exc


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


def format_inspect(info: dict[str, Any]) -> str:
    """inspect()'s result as lines for people (frequencies in MHz, power in W)."""

    def mhz(hz: int) -> str:
        return f"{hz / 1e6:g}"

    model = f" ({info['model']})" if info["model"] else ""
    lines = [
        f"board        {info['board']}{model}",
        f"devfreq      {info['devfreq_path']}",
        f"governor     {info['governor']}",
        f"frequency    {mhz(info['current_frequency_hz'])} MHz now; "
        f"range {mhz(info['min_frequency_hz'])}..{mhz(info['max_frequency_hz'])} MHz",
        f"available    {' '.join(mhz(f) for f in info['frequencies_hz'])} MHz ({len(info['frequencies_hz'])})",
        f"pinning      {'allowed' if info['writable'] else 'needs root (sudo) or a udev rule'}",
    ]
    if not info["rails"]:
        return "\n".join(lines + ["power        no INA3221 power monitor found"])
    source = f"rail {info['total_rail']}" if info["total_rail"] else "sum of rails"
    lines.append(f"power        {info['total_power_w']:.3f} W ({source})")
    lines += [f"  {r['name']:<16} {r['power_w']:.3f} W" for r in info["rails"]]
    return "\n".join(lines)
