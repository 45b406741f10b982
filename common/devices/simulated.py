"""Simulated twins of Jetson boards: the training step really runs (on the CPU), while the
device time and board power come from the twin's model of the board for that workload
(step_model.py), with seeded sensor noise. Every figure a twin returns is marked simulated.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from ..control_axis import ClockObservation, ControlAxis
from .base import DeviceError, Measurement, Workload
from .step_model import MODEL_VERSION, StepModel
from .twin_spec import TwinSpec, load_twin

__all__ = ["SimulatedDevice", "load_twin"]

IDLE_SPEED_UP = 20.0  # a twin's idle time passes this many times faster than real time


class SimulatedDevice:
    """A twin implementing the Device protocol; every figure it returns is simulated."""

    backend = "sim"
    simulated = True
    control = ControlAxis.GPU_CLOCK_HZ

    def __init__(self, spec: TwinSpec, seed: int = 0):
        self.spec = spec
        self.device_type = spec.device_type
        self.power_resolution_w = spec.noise.power_resolution_w
        self._frequency_hz = spec.frequencies_hz[-1]
        self._model: StepModel | None = None
        self._rng = random.Random(seed)
        self._steps = 0  # steps since the workload was bound (for the power drift)

    @property
    def frequencies_hz(self) -> list[int]:
        return list(self.spec.frequencies_hz)

    @property
    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    @property
    def power_envelope_w(self) -> list[float]:
        return list(self.spec.full_load_power_w)

    @property
    def software(self) -> dict[str, str]:
        """The version of the twin's spec and step model its tables are made with."""
        return {"twin_spec": self.spec.version(MODEL_VERSION)}

    def set_frequency(self, frequency_hz: int) -> None:
        if frequency_hz not in self.spec.frequencies_hz:
            raise DeviceError(f"frequency_hz={frequency_hz} is not supported by {self.spec.name}: allowed {self.spec.frequencies_hz}")
        self._frequency_hz = frequency_hz

    def current_frequency(self) -> int:
        return self._frequency_hz

    def read_power_w(self) -> float:
        return self._sensor(self.spec.idle_power_w)

    def bind_workload(self, workload: Workload) -> None:
        self._model = StepModel(self.spec, workload)
        self._steps = 0

    def fits(self, batch_size: int) -> bool:
        return self._step_model().memory_bytes(batch_size) <= self.spec.memory_bytes

    def run_steps(self, step: Callable[[], None], batch_size: int, steps: int) -> Measurement:
        if not self.fits(batch_size):
            raise MemoryError(f"batch_size={batch_size} does not fit in the memory of {self.spec.name} (simulated)")
        elapsed = energy = peak = 0.0
        for _ in range(steps):
            step()
            t, p_peak, p_mean = self._step_model().step(batch_size, self._frequency_hz)
            t *= max(0.5, 1.0 + self._rng.gauss(0.0, self.spec.noise.time_rel_std))
            drift = self._drift()
            p_peak, p_mean = p_peak * drift, p_mean * drift
            self._steps += 1
            elapsed += t
            energy += t * p_mean
            peak = max(peak, self._sensor(p_peak))
        f = self._frequency_hz
        return Measurement(
            steps=steps,
            batch_size=batch_size,
            elapsed_s=elapsed,
            energy_j=energy,
            peak_power_w=peak,
            mean_power_w=energy / elapsed if elapsed else 0.0,
            simulated=True,
            clock=ClockObservation(mean_hz=f, min_hz=f, max_hz=f, samples=steps),
        )

    def idle(self, seconds: float) -> Measurement:
        """Idle power for `seconds` of the twin's clock, which passes IDLE_SPEED_UP times
        faster than real time (a worker waiting for a cap does not spin)."""
        time.sleep(seconds / IDLE_SPEED_UP)
        power = self._sensor(self.spec.idle_power_w)
        f = self._frequency_hz
        return Measurement(
            steps=0, batch_size=0, elapsed_s=seconds, energy_j=seconds * self.spec.idle_power_w, peak_power_w=power,
            mean_power_w=self.spec.idle_power_w, simulated=True,
            clock=ClockObservation(mean_hz=f, min_hz=f, max_hz=f, samples=1),
        )  # fmt: skip

    def restore(self) -> None:
        self._frequency_hz = self.spec.frequencies_hz[-1]

    def _drift(self) -> float:
        drift = self.spec.power_drift
        return drift.factor if drift is not None and self._steps >= drift.after_steps else 1.0

    def _step_model(self) -> StepModel:
        if self._model is None:
            raise DeviceError("no workload bound: call bind_workload() before measuring steps")
        return self._model

    def _sensor(self, power_w: float) -> float:
        noisy = power_w * (1.0 + self._rng.gauss(0.0, self.spec.noise.power_rel_std))
        resolution = self.spec.noise.power_resolution_w
        return round(noisy / resolution) * resolution if resolution else noisy
