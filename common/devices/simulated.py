"""Simulated twins of Jetson boards: the training step really runs (on the CPU), while the
device time and board power come from a model of the board for that workload.

Model of one training step of `b` samples at GPU frequency `f` (Hz):

    t_compute = b * flops_per_sample / (flops_per_cycle * f * compute_efficiency)
    t_host    = kernels_per_step * kernel_launch_s        (GPU waits for the host)
    t_step    = t_host + t_compute
    activity  = A / (A + activation_half_bytes),  A = b * activation_bytes_per_sample
    P_peak    = idle + (P_full(f) - idle) * activity       (W, while kernels run)
    P_mean    = idle + (P_full(f) - idle) * activity * t_compute / t_step

`P_full(f)` is the board's full-load power per frequency from the spec (for the Nano, the
SGEMM calibration of facts/hardware.md). A small batch keeps fewer units busy, so it draws
less power and may run at a higher frequency under a cap. Memory: parameters, gradients
and Adam state (4x the parameter bytes) plus the activations and their gradients
(2 x A) must fit next to the reserved memory. Sensor noise is seeded.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path
from typing import Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import DeviceError, Measurement, Workload


class NoiseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    time_rel_std: float = Field(0.02, ge=0, description="relative std of a step's time")
    power_rel_std: float = Field(0.02, ge=0, description="relative std of a power reading")
    power_resolution_w: float = Field(0.1, ge=0, description="sensor resolution (W); 0 = exact")


class TwinSpec(BaseModel):
    """A simulated board, loadable from JSON or YAML so users add boards without code."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device_type: str
    description: str = ""
    frequencies_hz: list[int] = Field(min_length=1)
    full_load_power_w: list[float] = Field(description="board power at full GPU load, per frequency (W)")
    idle_power_w: float = Field(gt=0)
    flops_per_cycle: float = Field(gt=0, description="peak FP32 FLOP per GPU clock cycle")
    compute_efficiency: float = Field(0.5, gt=0, le=1, description="fraction of peak a training step reaches")
    kernel_launch_s: float = Field(gt=0, description="host time per launched kernel (s)")
    activation_half_bytes: float = Field(gt=0, description="activations per step at half power activity (bytes)")
    memory_bytes: int = Field(gt=0)
    reserved_memory_bytes: int = Field(ge=0, description="OS and CUDA context (bytes)")
    noise: NoiseSpec = Field(default_factory=NoiseSpec)

    @model_validator(mode="after")
    def _check(self) -> "TwinSpec":
        if sorted(set(self.frequencies_hz)) != self.frequencies_hz:
            raise ValueError("frequencies_hz must be strictly increasing")
        if len(self.full_load_power_w) != len(self.frequencies_hz):
            raise ValueError("full_load_power_w needs one value per frequency")
        if any(p <= self.idle_power_w for p in self.full_load_power_w):
            raise ValueError("full_load_power_w must exceed idle_power_w at every frequency")
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> "TwinSpec":
        text = Path(path).read_text()
        data = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
        return cls.model_validate(data)


def builtin_twins() -> dict[str, TwinSpec]:
    """The twins shipped with edgetrain, by name."""
    folder = resources.files("edgetrain.common") / "twins"
    specs = [TwinSpec.model_validate(json.loads(f.read_text())) for f in folder.iterdir() if f.name.endswith(".json")]
    return {s.name: s for s in specs}


def load_twin(name_or_path: str) -> TwinSpec:
    """A built-in twin by name, or a spec file (.json/.yaml) by path."""
    twins = builtin_twins()
    if name_or_path in twins:
        return twins[name_or_path]
    if Path(name_or_path).is_file():
        return TwinSpec.from_file(name_or_path)
    raise DeviceError(f"unknown twin {name_or_path!r}: use one of {sorted(twins)} or a path to a spec file")


class StepModel:
    """The noiseless time and power of one training step on a twin."""

    def __init__(self, spec: TwinSpec, workload: Workload):
        self.spec = spec
        self.workload = workload

    def full_load_power_w(self, frequency_hz: int) -> float:
        return self.spec.full_load_power_w[self.spec.frequencies_hz.index(frequency_hz)]

    def times_s(self, batch_size: int, frequency_hz: int) -> tuple[float, float]:
        """(host time, GPU compute time) of one step (s)."""
        s, w = self.spec, self.workload
        compute = batch_size * w.flops_per_sample / (s.flops_per_cycle * frequency_hz * s.compute_efficiency)
        return w.kernels_per_step * s.kernel_launch_s, compute

    def activity(self, batch_size: int) -> float:
        a = batch_size * self.workload.activation_bytes_per_sample
        return a / (a + self.spec.activation_half_bytes)

    def peak_power_w(self, batch_size: int, frequency_hz: int) -> float:
        idle = self.spec.idle_power_w
        return idle + (self.full_load_power_w(frequency_hz) - idle) * self.activity(batch_size)

    def step(self, batch_size: int, frequency_hz: int) -> tuple[float, float, float]:
        """(step time s, peak power W, mean power W)."""
        host, compute = self.times_s(batch_size, frequency_hz)
        total = host + compute
        idle = self.spec.idle_power_w
        peak = self.peak_power_w(batch_size, frequency_hz)
        return total, peak, idle + (peak - idle) * compute / total

    def memory_bytes(self, batch_size: int) -> float:
        w = self.workload
        return self.spec.reserved_memory_bytes + 4 * w.parameter_bytes + 2 * batch_size * w.activation_bytes_per_sample


class SimulatedDevice:
    """A twin implementing the Device protocol; every figure it returns is simulated."""

    backend = "sim"
    simulated = True

    def __init__(self, spec: TwinSpec, seed: int = 0):
        self.spec = spec
        self.device_type = spec.device_type
        self._frequency_hz = spec.frequencies_hz[-1]
        self._model: StepModel | None = None
        self._rng = random.Random(seed)

    @property
    def frequencies_hz(self) -> list[int]:
        return list(self.spec.frequencies_hz)

    @property
    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    @property
    def power_envelope_w(self) -> list[float]:
        return list(self.spec.full_load_power_w)

    def set_frequency(self, frequency_hz: int) -> None:
        if frequency_hz not in self.spec.frequencies_hz:
            raise DeviceError(
                f"frequency_hz={frequency_hz} is not supported by {self.spec.name}: allowed {self.spec.frequencies_hz}"
            )
        self._frequency_hz = frequency_hz

    def current_frequency(self) -> int:
        return self._frequency_hz

    def read_power_w(self) -> float:
        return self._sensor(self.spec.idle_power_w)

    def bind_workload(self, workload: Workload) -> None:
        self._model = StepModel(self.spec, workload)

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
            elapsed += t
            energy += t * p_mean
            peak = max(peak, self._sensor(p_peak))
        return Measurement(
            steps=steps,
            batch_size=batch_size,
            elapsed_s=elapsed,
            energy_j=energy,
            peak_power_w=peak,
            mean_power_w=energy / elapsed if elapsed else 0.0,
            simulated=True,
        )

    def restore(self) -> None:
        self._frequency_hz = self.spec.frequencies_hz[-1]

    def _step_model(self) -> StepModel:
        if self._model is None:
            raise DeviceError("no workload bound: call bind_workload() before measuring steps")
        return self._model

    def _sensor(self, power_w: float) -> float:
        noisy = power_w * (1.0 + self._rng.gauss(0.0, self.spec.noise.power_rel_std))
        resolution = self.spec.noise.power_resolution_w
        return round(noisy / resolution) * resolution if resolution else noisy
