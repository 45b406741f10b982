"""A device that replays a recorded lookup table, for profiling and selection tests."""

from __future__ import annotations

from collections.abc import Callable

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.devices.base import Measurement, Workload
from edgetrain.common.schemas import ProfileTable


class RecordedDevice:
    """Replays a recorded grid of step times and peak powers: a step of batch size b at
    frequency f takes T[b][f] * b / N_s seconds at peak power P[b][f] (SIMULATED figures)."""

    device_type, backend, simulated = "recorded", "recorded", True
    control = ControlAxis.GPU_CLOCK_HZ
    power_resolution_w = 0.0
    power_envelope_w: list[float] | None = None
    memory_bytes = 1
    software: dict[str, str] = {}

    def __init__(self, table: ProfileTable, max_batch: int | None = None):
        self.table, self.max_batch = table, max_batch
        self.frequencies_hz = list(table.frequencies_hz)
        self.frequency_hz: int | None = None

    def set_frequency(self, frequency_hz: int) -> None:
        self.frequency_hz = frequency_hz

    def current_frequency(self) -> int:
        return self.frequency_hz or self.frequencies_hz[-1]

    def read_power_w(self) -> float:
        return 0.0

    def bind_workload(self, workload: Workload) -> None:
        """Nothing to do: the recording is the workload."""

    def fits(self, batch_size: int) -> bool:
        return self.max_batch is None or batch_size <= self.max_batch

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        assert self.frequency_hz is not None, "set_frequency first"
        i, j = self.table.batch_sizes.index(batch_size), self.table.frequencies_hz.index(self.frequency_hz)
        time_s, power_w = self.table.time_s[i][j], self.table.peak_power_w[i][j]
        assert time_s is not None and power_w is not None, f"({batch_size}, {self.frequency_hz}) was not recorded"
        per_step = time_s * batch_size / self.table.samples
        return Measurement(steps, batch_size, per_step * steps, per_step * steps * power_w, power_w, power_w, True)

    def idle(self, seconds: float) -> Measurement:
        return Measurement(0, 0, seconds, 0.0, 0.0, 0.0, True)

    def restore(self) -> None:
        self.frequency_hz = None


class ReplayDevice(RecordedDevice):
    """The recorded table's time and power for steps that really run (a replayed fine-tune)."""

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        for _ in range(steps):
            step()
        return super().run_steps(step, batch_size, steps)
