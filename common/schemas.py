"""Pydantic models for every message and stored record (the wire format).

Units are in the field names: `_hz`, `_w`, `_s`, `_j`, `_bytes`.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .limits import (
    MAX_BATCH_SIZES, MAX_DEVICES, MAX_NAME_CHARS, MAX_PATH_CHARS, MAX_SEEDS, BatchSize, ProfileBatches, SampleCount, Seed,
)  # fmt: skip

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
PAPER_BATCH_SIZES = [4, 8, 16, 32, 64, 128]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Strict(BaseModel):
    """Base for records: unknown fields are errors, so a typo is named, not ignored."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- job spec


class DatasetRef(Strict):
    """A dataset from the registry (`name`), optionally a seeded fraction of it."""

    name: str = Field(min_length=1)
    fraction: float = Field(1.0, gt=0, le=1)
    path: str | None = Field(None, max_length=MAX_PATH_CHARS)  # for user data (image folder, .npz, text file)


class LearningRatePolicy(Strict):
    """lr_b = lr_ref * sqrt(b / b_ref) (square-root scaling for Adam/AdamW)."""

    optimizer: Literal["adam", "adamw"] = "adam"
    lr_ref: float = Field(5e-4, gt=0)
    b_ref: int = Field(128, gt=0)
    rule: Literal["sqrt", "linear", "none"] = "sqrt"

    def lr_for(self, batch_size: int) -> float:
        scale = batch_size / self.b_ref
        factor = {"sqrt": math.sqrt(scale), "linear": scale, "none": 1.0}[self.rule]
        return self.lr_ref * factor


class DeviceTarget(Strict):
    """One device of a job: where to fine-tune and under which board power cap."""

    device_id: str = Field(pattern=ID_PATTERN)
    power_cap_w: float | None = Field(None, gt=0, description="board power cap in W; None = no cap")
    dataset: DatasetRef | None = None  # the device's own data; default: the job's dataset


class ProfilingOptions(Strict):
    samples: int = Field(1024, gt=0, description="N_s: samples the time table is scaled to")
    warmup_batches: ProfileBatches = Field(1, ge=0)
    measure_batches: ProfileBatches = Field(3, gt=0)
    mode: Literal["grid", "staircase"] = "grid"
    force: bool = Field(False, description="profile again even when a current table exists")


class JobSpec(Strict):
    """What a user submits: fine-tune `model` from `weights` on each device's data to
    `target_accuracy`, choosing (batch size, GPU frequency) per device under its cap."""

    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    weights: str = Field("init:0", max_length=MAX_NAME_CHARS, description="'init:<seed>' or an artifact URL")
    dataset: DatasetRef
    proxy_dataset: DatasetRef
    target_accuracy: float = Field(gt=0, lt=1)
    devices: list[DeviceTarget] = Field(min_length=1, max_length=MAX_DEVICES)
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: list(PAPER_BATCH_SIZES), min_length=1, max_length=MAX_BATCH_SIZES)
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    lr: LearningRatePolicy = Field(default_factory=LearningRatePolicy)
    eval_every_samples: SampleCount = Field(512, description="accuracy is checked this often")
    max_samples: SampleCount = Field(200_000, description="budget; a run that has not reached the target by then is censored")
    profiling: ProfilingOptions = Field(default_factory=ProfilingOptions)

    @field_validator("batch_sizes")
    @classmethod
    def _powers_of_two(cls, value: list[int]) -> list[int]:
        bad = [b for b in value if b < 1 or b & (b - 1)]
        if bad:
            raise ValueError(f"batch sizes must be powers of two (1, 2, 4, ...), got {bad}")
        return sorted(set(value))

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    @model_validator(mode="after")
    def _unique_devices(self) -> "JobSpec":
        ids = [d.device_id for d in self.devices]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"devices: each device_id may appear once, repeated: {dupes}")
        return self

    def dataset_for(self, target: DeviceTarget) -> DatasetRef:
        return target.dataset or self.dataset

    def estimation_request(self) -> "EstimationRequest":
        return EstimationRequest(
            model=self.model,
            weights=self.weights,
            proxy_dataset=self.proxy_dataset,
            target_accuracy=self.target_accuracy,
            batch_sizes=self.batch_sizes,
            seeds=self.seeds,
            lr=self.lr,
            eval_every_samples=self.eval_every_samples,
            max_samples=self.max_samples,
        )


class EstimationRequest(Strict):
    """Everything a relation vector depends on; identical requests share one vector."""

    model: str = Field(max_length=MAX_NAME_CHARS)
    weights: str = Field(max_length=MAX_NAME_CHARS)
    proxy_dataset: DatasetRef
    target_accuracy: float = Field(gt=0, lt=1)
    batch_sizes: list[BatchSize] = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    seeds: list[Seed] = Field(min_length=1, max_length=MAX_SEEDS)
    lr: LearningRatePolicy
    eval_every_samples: SampleCount
    max_samples: SampleCount


# --------------------------------------------------------------------------- fleet


class DeviceInfo(Strict):
    """A device's identity as registered in the fleet."""

    device_id: str = Field(pattern=ID_PATTERN)
    device_type: str
    backend: str
    frequencies_hz: list[int]
    memory_bytes: int
    simulated: bool
    power_envelope_w: list[float] | None = Field(
        None, description="model-agnostic full-load board power per frequency (W), for Baseline 1"
    )
    software: dict[str, str] = Field(default_factory=dict, description="versions its tables are made with")
    hostname: str = ""
    registered_at: datetime = Field(default_factory=utc_now)
    heartbeat_at: datetime = Field(default_factory=utc_now)


# --------------------------------------------------------------------------- lookup tables


class ProfileTable(Strict):
    """T[b][f] (s for `samples` samples), peak P[b][f] (W) and energy E[b][f] (J for `samples`
    samples); rows follow `batch_sizes`, columns follow `frequencies_hz`; None = not measured."""

    batch_sizes: list[int] = Field(min_length=1)
    frequencies_hz: list[int] = Field(min_length=1)
    samples: int = Field(gt=0)
    time_s: list[list[float | None]]
    peak_power_w: list[list[float | None]]
    energy_j: list[list[float | None]] | None = Field(None, description="board energy for `samples` samples (J)")
    points_measured: int | None = Field(None, description="(b, f) points measured to make the table")
    max_batch_size: int | None = Field(None, description="b_mem: largest batch that fits in memory")
    device_type: str | None = None
    model: str | None = None
    input_shape: list[int] | None = None
    simulated: bool = False
    mode: Literal["grid", "staircase"] = "grid"
    power_cap_w: float | None = None
    produced_by: dict[str, str] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utc_now)

    def measured_points(self) -> int:
        """How many (b, f) points were measured."""
        return sum(p is not None for row in self.peak_power_w for p in row)

    @model_validator(mode="after")
    def _shapes(self) -> "ProfileTable":
        rows, cols = len(self.batch_sizes), len(self.frequencies_hz)
        for name in ("time_s", "peak_power_w", "energy_j"):
            table = getattr(self, name)
            if table is None:
                continue
            if len(table) != rows or any(len(r) != cols for r in table):
                raise ValueError(
                    f"{name} must have {rows} rows (one per batch size) of {cols} values (one per frequency)"
                )
        if sorted(set(self.frequencies_hz)) != self.frequencies_hz:
            raise ValueError("frequencies_hz must be strictly increasing")
        if sorted(set(self.batch_sizes)) != self.batch_sizes:
            raise ValueError("batch_sizes must be strictly increasing")
        return self


class RelationVector(Strict):
    """r_b = N_b / N_{b_max} from proxy training; None = censored (never reached the target)."""

    batch_sizes: list[int] = Field(min_length=1)
    ratios: list[float | None]
    samples_mean: list[float | None] | None = Field(None, description="N_b, mean over seeds (samples)")
    samples_std: list[float | None] | None = Field(None, description="N_b, standard deviation over seeds (samples)")
    censored: list[bool] | None = None
    resolution_samples: int | None = Field(None, description="how finely N_b is known (samples)")
    key: str | None = None
    reference_batch_size: int | None = Field(None, description="b_max: the largest batch size that reached the target")
    request: EstimationRequest | None = Field(None, description="what the vector was estimated from")

    @model_validator(mode="after")
    def _shapes(self) -> "RelationVector":
        if len(self.ratios) != len(self.batch_sizes):
            raise ValueError("ratios must have one value per batch size")
        return self

    def ratio(self, batch_size: int) -> float | None:
        return self.ratios[self.batch_sizes.index(batch_size)] if batch_size in self.batch_sizes else None

    def samples_for(self, batch_size: int) -> float | None:
        if self.samples_mean is None or batch_size not in self.batch_sizes:
            return None
        return self.samples_mean[self.batch_sizes.index(batch_size)]


class TrainingOutcome(Strict):
    """One training run to the target accuracy (proxy estimation or device fine-tune)."""

    batch_size: int
    seed: int
    samples_to_accuracy: int | None  # None = censored
    reached: bool
    final_accuracy: float
    samples_processed: int
    evaluations: int
    wall_s: float
    worker: str | None = None  # the worker node that ran it


# --------------------------------------------------------------------------- selection and reports


class Selection(Strict):
    """A chosen configuration and the estimate that chose it."""

    strategy: str = Field("edgetrain", description="the selection strategy that chose it")
    batch_size: int
    frequency_hz: int
    estimated_time_s: float = Field(description="T[b][f] * r_b (s): the objective of eq. (4)")
    peak_power_w: float


class RunReport(Strict):
    """What `finetune` measured on the device."""

    device_id: str
    device_type: str
    simulated: bool
    batch_size: int
    frequency_hz: int
    reached: bool
    final_accuracy: float
    samples_to_accuracy: int | None
    samples_processed: int
    steps: int
    device_time_s: float = Field(description="time to accuracy on the device (simulated when `simulated`)")
    energy_j: float
    peak_power_w: float
    wall_s: float = Field(description="wall-clock time of the task on the worker host")
