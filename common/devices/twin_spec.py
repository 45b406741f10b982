"""Twin specifications: a simulated board as data (JSON or YAML), so users add boards
without code. The built-in twins live in edgetrain/common/twins/*.json; each cites the
public sources it was built from and the L4T release whose GPU frequency table it models.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..documents import read_document
from .base import DeviceError


class NoiseSpec(BaseModel):
    """How noisy a twin's measurements are (relative standard deviations, sensor resolution)."""

    model_config = ConfigDict(extra="forbid")

    time_rel_std: float = Field(0.02, ge=0, description="relative std of a step's time")
    power_rel_std: float = Field(0.02, ge=0, description="relative std of a power reading")
    power_resolution_w: float = Field(0.1, ge=0, description="sensor resolution (W); 0 = exact")


class PowerDrift(BaseModel):
    """A board that draws more than its spec after a while (heat, another process): from the
    `after_steps`-th training step since a workload was bound, every power reading and the
    energy are `factor` times the model's."""

    model_config = ConfigDict(extra="forbid")

    after_steps: int = Field(ge=0)
    factor: float = Field(gt=0)


class PowerMode(BaseModel):
    """An nvpmodel power mode of the board: its name, the GPU clock cap it writes (Hz; the
    GPU runs at the highest listed frequency not above it) and the module power budget it
    is named for (W; None for MAXN, which has none)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpu_max_frequency_hz: int = Field(gt=0)
    budget_w: float | None = Field(None, gt=0)


class TwinSpec(BaseModel):
    """A simulated board. Times and powers come from StepModel (see step_model.py)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device_type: str
    description: str = ""
    l4t_release: str | None = Field(None, description="the L4T release whose GPU frequency table the twin models")
    sources: list[str] = Field(default_factory=list, description="public sources of the figures")
    frequencies_hz: list[int] = Field(min_length=1)
    full_load_power_w: list[float] = Field(description="board power at full GPU load, per frequency (W)")
    idle_power_w: float = Field(gt=0)
    power_rails: list[str] = Field(default_factory=list, description="the board's INA3221 rails")
    total_rail: str | None = Field(None, description="the rail that measures the whole board; None = sum of rails")
    power_modes: list[PowerMode] = Field(default_factory=list, description="nvpmodel modes of the modelled release")
    flops_per_cycle: float = Field(gt=0, description="FP32 FLOP per GPU clock cycle at full occupancy")
    compute_efficiency: float = Field(0.5, gt=0, le=1, description="fraction of that a training step reaches")
    kernel_launch_s: float = Field(gt=0, description="host time per launched kernel (s)")
    memory_bandwidth_bytes_per_s: float | None = Field(
        None, gt=0, description="peak DRAM (EMC) bandwidth (bytes/s); None = no memory-bound time"
    )
    memory_efficiency: float = Field(0.6, gt=0, le=1, description="fraction of peak bandwidth training kernels reach")
    activation_half_bytes: float = Field(gt=0, description="activations per step at half power activity (bytes)")
    memory_bytes: int = Field(gt=0)
    reserved_memory_bytes: int = Field(ge=0, description="OS and CUDA context (bytes)")
    noise: NoiseSpec = Field(default_factory=NoiseSpec)
    power_drift: PowerDrift | None = Field(None, description="inject a power drift (to exercise the power guard)")

    @model_validator(mode="after")
    def _check(self) -> TwinSpec:
        if sorted(set(self.frequencies_hz)) != self.frequencies_hz:
            raise ValueError("frequencies_hz must be strictly increasing")
        if len(self.full_load_power_w) != len(self.frequencies_hz):
            raise ValueError("full_load_power_w needs one value per frequency")
        if any(p <= self.idle_power_w for p in self.full_load_power_w):
            raise ValueError("full_load_power_w must exceed idle_power_w at every frequency")
        if self.total_rail is not None and self.total_rail not in self.power_rails:
            raise ValueError(f"total_rail {self.total_rail!r} must be one of power_rails {self.power_rails}")
        bad = [m.name for m in self.power_modes if m.gpu_max_frequency_hz < self.frequencies_hz[0]]
        if bad:
            raise ValueError(f"power_modes {bad}: gpu_max_frequency_hz is below the lowest of frequencies_hz")
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> TwinSpec:
        """A twin spec from a JSON or YAML file; DocumentError (a ValueError) when the file cannot be
        read, does not parse or is nested too deep, ValidationError when it is not a twin spec."""
        return cls.model_validate(read_document(path, "twin spec"))

    def version(self, model_version: str) -> str:
        """A short digest of the spec and of the step model's version: tables made with
        another spec or model are not reused."""
        spec = self.model_dump(mode="json", exclude={"power_drift"} if self.power_drift is None else None)
        canonical = json.dumps(spec, sort_keys=True) + model_version
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def builtin_twins() -> dict[str, TwinSpec]:
    """The twins shipped with edgetrain, by name."""
    folder = resources.files("edgetrain.common") / "twins"
    specs = [TwinSpec.model_validate(json.loads(f.read_text())) for f in folder.iterdir() if f.name.endswith(".json")]
    return {s.name: s for s in sorted(specs, key=lambda s: s.name)}


def load_twin(name_or_path: str) -> TwinSpec:
    """A built-in twin by name, or a spec file (.json/.yaml) by path; DeviceError saying why
    for anything else."""
    twins = builtin_twins()
    if name_or_path in twins:
        return twins[name_or_path]
    if Path(name_or_path).is_file():
        try:
            return TwinSpec.from_file(name_or_path)
        except ValueError as exc:  # the file does not parse, is nested too deep, or is not a twin spec
            raise DeviceError(f"twin spec {name_or_path}: {exc}") from None
    raise DeviceError(f"unknown twin {name_or_path!r}: use one of {sorted(twins)} or a path to a spec file")
