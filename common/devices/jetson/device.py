"""The Jetson device: the GPU clock pinned through devfreq (root needed to write), board
power from the INA3221 monitors. Frequencies in Hz as devfreq reports them; power in W."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from ...control_axis import ControlAxis
from ..base import DeviceError, DevicePermissionError, Measurement, Workload
from ..power_sampler import DEFAULT_RATE_HZ, measure_idle, measure_steps
from .family import board_family
from .sysfs import (
    INA3221_NAMES,
    SysfsIO,
    available_frequencies,
    board_power_w,
    find_gpu_devfreq,
    find_power_rails,
    read_attr,
)


class JetsonDevice:
    """A Jetson GPU pinned through devfreq (root needed to write) and measured with the
    INA3221 monitors. Use it as a context manager so restore() runs on errors too."""

    backend = "jetson"
    simulated = False
    control = ControlAxis.GPU_CLOCK_HZ
    power_resolution_w = 0.001  # the INA3221 drivers report mW (or mV and mA)

    def __init__(
        self,
        sysfs_root: str | Path = "/",
        device_type: str | None = None,
        io: SysfsIO | None = None,
        sample_rate_hz: float = DEFAULT_RATE_HZ,
        settle_s: float = 0.5,
    ):
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
        # min_freq, max_freq (Hz) and governor as found at start: what restore() puts back, also
        # from a worker process whose pool child pinned the clock and died
        self._original: tuple[int, int, str] = (self._read_int("min_freq"), self._read_int("max_freq"), self._read("governor"))

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
            raise DeviceError(f"frequency_hz={frequency_hz} is not available on this {self.device_type}: allowed {self._frequencies} (Hz)")
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
        """Time, power and the cur_freq observed while the steps ran (a thermal or power-mode
        cap can hold the GPU below the pinned clock)."""
        return measure_steps(step, batch_size, steps, self.read_power_w, self._sample_rate_hz, read_clock_hz=self.current_frequency)

    def idle(self, seconds: float) -> Measurement:
        return measure_idle(seconds, self.read_power_w, self._sample_rate_hz)

    def restore(self) -> None:
        """Put min_freq, max_freq and governor back as they were when the device was opened;
        writes only what differs, so it is a no-op when nothing changed."""
        low, high, governor = self._original
        if (self._read_int("min_freq"), self._read_int("max_freq")) != (low, high):
            self._write_range(low, high)
        if self._read("governor") != governor:
            self._write("governor", governor)

    def __enter__(self) -> JetsonDevice:
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
