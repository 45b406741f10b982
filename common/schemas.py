"""Pydantic models for every message and stored record (the wire format).

Units are in the field names: `_hz`, `_w`, `_s`, `_j`, `_bytes`.
"""

from __future__ import annotations

import math
import types
from collections import Counter
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from .control_axis import ClockObservation, ControlAxis
from .ids import Identifier
from .limits import (
    MAX_BATCH_SIZE,
    MAX_BATCH_SIZES,
    MAX_CAP_STEPS,
    MAX_DEVICES,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    MAX_SEEDS,
    BatchSize,
    ProfileBatches,
    SampleCount,
    Seed,
)  # fmt: skip

PAPER_BATCH_SIZES = [4, 8, 16, 32, 64, 128]


def utc_now() -> datetime:
    """The time now, in UTC."""
    return datetime.now(timezone.utc)


def checked_batch_sizes(value: list[int]) -> list[int]:
    """Batch sizes sorted and unique; ValueError unless each is a power of two up to MAX_BATCH_SIZE."""
    bad = [b for b in value if b < 1 or b & (b - 1) or b > MAX_BATCH_SIZE]
    if bad:
        raise ValueError(f"batch sizes must be powers of two from 1 to {MAX_BATCH_SIZE}, got {bad}")
    return sorted(set(value))


# sorted powers of two up to MAX_BATCH_SIZE, each once (the element type bounds a single value first)
BatchSizes = Annotated[list[BatchSize], AfterValidator(checked_batch_sizes)]
Seeds = Annotated[list[Seed], AfterValidator(lambda seeds: sorted(set(seeds)))]  # sorted, each once


RecordT = TypeVar("RecordT", bound="Strict")


class Strict(BaseModel):
    """Base for records: unknown fields are errors, so a typo is named, not ignored; NaN and
    infinite numbers are refused everywhere."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def validated_copy(self: RecordT, **update: Any) -> RecordT:
        """A copy with `update` applied, validated like a new record (`model_copy(update=...)`
        skips validation, so it can make a record that no longer loads)."""
        return self.model_validate(self.model_dump() | update)


def list_depth(annotation: Any) -> int:
    """How deeply lists nest in a field's type, optional or not: 2 for `list[list[float]] | None`."""
    if get_origin(annotation) is Annotated:
        return list_depth(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return max(list_depth(a) for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is list:
        return 1 + list_depth(get_args(annotation)[0])
    return 0


# --------------------------------------------------------------------------- job spec


class DatasetRef(Strict):
    """A dataset from the registry (`name`), optionally a seeded fraction of it."""

    name: str = Field(min_length=1)
    fraction: float = Field(1.0, gt=0, le=1)
    path: str | None = Field(None, max_length=MAX_PATH_CHARS)  # for user data (image folder, .npz, text file)


class LearningRatePolicy(Strict):
    """lr_b = lr_ref * sqrt(b / b_ref) (square-root scaling for Adam/AdamW)."""

    optimizer: Literal["adam", "adamw"] = "adam"
    lr_ref: float = Field(5e-4, gt=0, le=10)
    b_ref: int = Field(128, gt=0, le=MAX_BATCH_SIZE)
    rule: Literal["sqrt", "linear", "none"] = "sqrt"

    def lr_for(self, batch_size: int) -> float:
        """The learning rate for `batch_size` under this policy."""
        scale = batch_size / self.b_ref
        factor = {"sqrt": math.sqrt(scale), "linear": scale, "none": 1.0}[self.rule]
        return self.lr_ref * factor


class FixedConfiguration(Strict):
    """A (batch size, GPU frequency) to fine-tune with instead of equation (4)'s choice, e.g. to
    measure what another method's choice achieves; checked against the lookup table when the
    job is planned (a row and column of it, measured, within b_mem, under the cap)."""

    batch_size: BatchSize
    frequency_hz: int = Field(gt=0, description="one of the device's frequencies (Hz)")


def checked_cap_schedule(steps: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """A cap schedule as given; ValueError unless its times (s) are non-negative and strictly
    increasing and its caps (W) positive or None (no cap)."""
    times = [t for t, _ in steps]
    if any(t < 0 for t in times) or any(b <= a for a, b in zip(times, times[1:])):
        raise ValueError(f"times must be non-negative and strictly increasing (s of device time), got {times}")
    bad = [cap for _, cap in steps if cap is not None and cap <= 0]
    if bad:
        raise ValueError(f"caps must be above 0 W or null (no cap), got {bad}")
    return steps


# [[device time since the fine-tune started (s), board power cap (W) or None], ...]
CapSchedule = Annotated[list[tuple[float, float | None]], AfterValidator(checked_cap_schedule)]


class DeviceTarget(Strict):
    """One device of a job: where to fine-tune and under which board power cap."""

    device_id: Identifier
    power_cap_w: float | None = Field(None, gt=0, description="board power cap in W; None = no cap")
    power_cap_schedule: CapSchedule | None = Field(
        None, max_length=MAX_CAP_STEPS,
        description="[[s of device time since the fine-tune started, cap in W or null], ...]: the cap from each time on; "
        "power_cap_w holds before the first step",
    )  # fmt: skip
    dataset: DatasetRef | None = None  # the device's own data; default: the job's dataset
    configuration: FixedConfiguration | None = Field(None, description="fine-tune with this configuration; default: eq. (4)")

    def cap_at(self, device_time_s: float) -> float | None:
        """The scheduled board power cap (W) `device_time_s` seconds into the fine-tune."""
        cap = self.power_cap_w
        for start_s, step_cap in self.power_cap_schedule or []:
            if start_s > device_time_s:
                break
            cap = step_cap
        return cap

    def next_change_s(self, device_time_s: float) -> float | None:
        """When the schedule's next step after `device_time_s` begins (s of device time); None: no more."""
        return next((start_s for start_s, _ in self.power_cap_schedule or [] if start_s > device_time_s), None)

    def schedule_step(self, device_time_s: float) -> int:
        """How many steps of the schedule have begun by `device_time_s` (0: power_cap_w holds)."""
        return sum(start_s <= device_time_s for start_s, _ in self.power_cap_schedule or [])


class ProfilingOptions(Strict):
    """How a lookup table is measured."""

    samples: int = Field(1024, gt=0, le=10_000_000, description="N_s: samples the time table is scaled to")
    warmup_batches: ProfileBatches = Field(1, ge=0)
    measure_batches: ProfileBatches = Field(3, gt=0)
    mode: Literal["grid", "staircase"] = "grid"
    force: bool = Field(False, description="profile again even when a current table exists")


class Objective(Strict):
    """What selection minimises per device, from the table and the relation vector:

    - "time": time to accuracy, T[b][f] * r_b (equation (4));
    - "energy": energy to accuracy, E[b][f] * r_b, over every (b, f) under the cap;
    - "zeus": zeus's cost eta * E[b][f] * r_b + (1 - eta) * max_power * T[b][f] * r_b (J),
      max_power the highest peak power of the table (W);
    - "time_within_energy_budget": the fastest whose estimated energy to accuracy
      E[b][f] * N_b / N_s is at most `energy_budget_j` (J).

    A bare name is accepted for the object: "energy" = {"name": "energy"}."""

    name: Literal["time", "energy", "zeus", "time_within_energy_budget"] = "time"
    eta: float = Field(0.5, ge=0, le=1, description="zeus: the weight of energy against time (0..1)")
    energy_budget_j: float | None = Field(None, gt=0, description="time_within_energy_budget: the budget (J)")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: object) -> object:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _budget(self) -> Objective:
        if (self.name == "time_within_energy_budget") != (self.energy_budget_j is not None):
            raise ValueError("energy_budget_j is required by, and only allowed with, name 'time_within_energy_budget'")
        return self


class JobSpec(Strict):
    """What a user submits: fine-tune `model` from `weights` on each device's data to
    `target_accuracy`, choosing (batch size, GPU frequency) per device under its cap."""

    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    weights: str = Field("init:0", max_length=MAX_NAME_CHARS, description="'init:<seed>' or an artifact URL")
    dataset: DatasetRef
    proxy_dataset: DatasetRef
    target_accuracy: float = Field(gt=0, lt=1)
    proxy_target_accuracy: float | None = Field(
        None, gt=0, lt=1, description="the accuracy the proxy is trained to for the relation vector (default: target_accuracy)"
    )
    devices: list[DeviceTarget] = Field(min_length=1, max_length=MAX_DEVICES)
    batch_sizes: BatchSizes = Field(default_factory=lambda: list(PAPER_BATCH_SIZES), min_length=1, max_length=MAX_BATCH_SIZES)
    seeds: Seeds = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    lr: LearningRatePolicy = Field(default_factory=LearningRatePolicy)
    eval_every_samples: SampleCount = Field(512, description="accuracy is checked this often")
    max_samples: SampleCount = Field(200_000, description="budget; a run that has not reached the target by then is censored")
    profiling: ProfilingOptions = Field(default_factory=ProfilingOptions)
    objective: Objective = Field(default_factory=Objective, description="what selection minimises (default: time)")
    device_grace_s: float = Field(
        120.0,
        ge=0,
        le=7 * 24 * 3600,
        description="how long a part waits for a device that stopped heartbeating, or has not registered yet, before it fails (s)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        dupes = sorted(i for i, n in Counter(d.device_id for d in self.devices).items() if n > 1)
        if dupes:
            raise ValueError(f"devices: each device_id may appear once, repeated: {dupes}")
        if self.eval_every_samples > self.max_samples:
            raise ValueError(f"eval_every_samples={self.eval_every_samples} is more than max_samples={self.max_samples}")
        for k, target in enumerate(self.devices):
            if target.power_cap_schedule and self.profiling.mode == "staircase":
                raise ValueError(
                    f"devices.{k}.power_cap_schedule: a cap that changes needs a grid table, and a staircase table is "
                    "measured for one cap: set profiling.mode to 'grid'"
                )
            if target.configuration is not None and target.configuration.batch_size not in self.batch_sizes:
                raise ValueError(
                    f"devices.{k}.configuration.batch_size: {target.configuration.batch_size} is not one of the job's "
                    f"batch_sizes {self.batch_sizes}"
                )
        return self

    def dataset_for(self, target: DeviceTarget) -> DatasetRef:
        """The data `target` fine-tunes on: its own dataset, else the job's."""
        return target.dataset or self.dataset

    def estimation_request(self) -> EstimationRequest:
        """The relation vector this job needs, as an estimation request."""
        return EstimationRequest(
            model=self.model,
            weights=self.weights,
            proxy_dataset=self.proxy_dataset,
            target_accuracy=self.proxy_target_accuracy or self.target_accuracy,
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
    batch_sizes: BatchSizes = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    seeds: Seeds = Field(min_length=1, max_length=MAX_SEEDS)
    lr: LearningRatePolicy
    eval_every_samples: SampleCount
    max_samples: SampleCount


# --------------------------------------------------------------------------- fleet


class DeviceInfo(Strict):
    """A device's identity as registered in the fleet."""

    device_id: Identifier
    device_type: str
    backend: str
    frequencies_hz: list[int]
    memory_bytes: int
    simulated: bool
    power_envelope_w: list[float] | None = Field(None, description="model-agnostic full-load board power per frequency (W), for Baseline 1")
    software: dict[str, str] = Field(default_factory=dict, description="versions its tables are made with")
    control: ControlAxis = Field(ControlAxis.GPU_CLOCK_HZ, description="what frequencies_hz holds: the control axis")
    hostname: str = ""
    registered_at: datetime = Field(default_factory=utc_now)
    heartbeat_at: datetime = Field(default_factory=utc_now)


class DeviceCap(Strict):
    """A board power cap set on a device while it runs (`EdgeTrainClient.set_power_cap`):
    running fine-tunes follow it from their next step. `version` counts the caps set on the
    device, so a fine-tune knows which are newer than what it follows."""

    power_cap_w: float | None = Field(gt=0, description="W; None = no cap")
    version: int = Field(ge=1)
    set_at: datetime


# --------------------------------------------------------------------------- lookup tables


class ProfileTable(Strict):
    """T[b][f] (s for `samples` samples), peak P[b][f] (W) and energy E[b][f] (J for `samples`
    samples); rows follow `batch_sizes`, columns follow `frequencies_hz`; None = not measured.

    The columns are the settings of the device's control axis, ascending (`control`: locked
    GPU clocks in Hz by default, power limits in mW, or the single driver's-choice setting);
    `observed_clock_hz` holds the GPU clock seen while each point was measured."""

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
    control: ControlAxis = Field(ControlAxis.GPU_CLOCK_HZ, description="what the columns are, with their unit")
    observed_clock_hz: list[list[ClockObservation | None]] | None = Field(
        None, description="GPU clock sampled while each point's steps ran (Hz)"
    )
    GRIDS: ClassVar[tuple[str, ...]]  # the per-point fields: every list of lists (set below)

    def measured_points(self) -> int:
        """How many (b, f) points were measured."""
        return sum(p is not None for row in self.peak_power_w for p in row)

    @model_validator(mode="after")
    def _shapes(self) -> ProfileTable:
        rows, cols = len(self.batch_sizes), len(self.frequencies_hz)
        for name in self.GRIDS:
            table = getattr(self, name)
            if table is None:
                continue
            if len(table) != rows or any(len(r) != cols for r in table):
                raise ValueError(f"{name} must have {rows} rows (one per batch size) of {cols} values (one per frequency)")
        if sorted(set(self.frequencies_hz)) != self.frequencies_hz:
            raise ValueError("frequencies_hz must be strictly increasing")
        if sorted(set(self.batch_sizes)) != self.batch_sizes:
            raise ValueError("batch_sizes must be strictly increasing")
        for name, low in (("time_s", "positive"), ("peak_power_w", "non-negative"), ("energy_j", "non-negative")):
            values = [v for row in getattr(self, name) or [] for v in row if v is not None]
            if any(v <= 0 if low == "positive" else v < 0 for v in values):
                raise ValueError(f"{name}: every measured value must be {low}")
        return self


ProfileTable.GRIDS = tuple(name for name, f in ProfileTable.model_fields.items() if list_depth(f.annotation) == 2)


class VectorProvenance(Strict):
    """Where a relation vector's numbers come from: the proxy's runs on the server pool
    ("proxy"), what earlier fine-tunes measured on the device's own data ("learned"), or a
    fine-tune's closed loop correcting its prior with that evidence ("closed_loop")."""

    source: Literal["proxy", "learned", "closed_loop"]
    summary: str = Field(max_length=2000, description="in words, for `edgetrain vector show`")
    prior_key: str | None = Field(None, description="the vector this one corrects (the proxy's), if any")
    records: list[str] = Field(default_factory=list, description="the fine-tune records it learned from (record ids)")
    measured_batch_sizes: list[int] = Field(
        default_factory=list, description="batch sizes whose N_b runs on the device's data measured (the rest: the prior's)"
    )


class RelationVector(Strict):
    """r_b = N_b / N_{b_max} from proxy training; None = censored (never reached the target).
    Every list has one entry per batch size (`PER_BATCH_SIZE`)."""

    batch_sizes: list[int] = Field(min_length=1)
    ratios: list[float | None]
    samples_mean: list[float | None] | None = Field(None, description="N_b, mean over seeds (samples)")
    samples_std: list[float | None] | None = Field(None, description="N_b, standard deviation over seeds (samples)")
    censored: list[bool] | None = None
    resolution_samples: int | None = Field(
        None,
        description="the widest interval between the two evaluations that bracket a crossing of the target "
        "accuracy, over every batch size and seed (samples): each N_b is interpolated inside such an interval",
    )
    key: str | None = None
    reference_batch_size: int | None = Field(None, description="b_max: the largest batch size that reached the target")
    request: EstimationRequest | None = Field(None, description="what the vector was estimated from")
    provenance: VectorProvenance | None = Field(
        None, description="where the numbers come from; None: proxy runs on the server pool, as `request` says"
    )

    PER_BATCH_SIZE: ClassVar[tuple[str, ...]]  # every list field but batch_sizes (set below)

    @model_validator(mode="after")
    def _shapes(self) -> RelationVector:
        for name in self.PER_BATCH_SIZE:
            values = getattr(self, name)
            if values is not None and len(values) != len(self.batch_sizes):
                raise ValueError(f"{name} must have one value per batch size ({len(self.batch_sizes)}), not {len(values)}")
        if any(r is not None and r <= 0 for r in self.ratios):
            raise ValueError("ratios: every ratio must be positive (None for a censored batch size)")
        if any(n is not None and n < 0 for n in self.samples_mean or []):
            raise ValueError("samples_mean: N_b cannot be negative")
        return self

    @classmethod
    def uniform(cls, batch_sizes: list[int]) -> RelationVector:
        """r_b = 1 for every batch size: no batch size censored, none preferred."""
        return cls(batch_sizes=batch_sizes, ratios=[1.0] * len(batch_sizes))

    def _at(self, values: list[float | None] | None, batch_size: int) -> float | None:
        if values is None or batch_size not in self.batch_sizes:
            return None
        return values[self.batch_sizes.index(batch_size)]

    def ratio(self, batch_size: int) -> float | None:
        """r_b for `batch_size`; None when censored or not in the vector."""
        return self._at(self.ratios, batch_size)

    def samples_for(self, batch_size: int) -> float | None:
        """N_b, mean over seeds (samples); None when censored or not recorded."""
        return self._at(self.samples_mean, batch_size)

    def samples_std_for(self, batch_size: int) -> float | None:
        """N_b, standard deviation over seeds (samples); None when censored or not recorded."""
        return self._at(self.samples_std, batch_size)


RelationVector.PER_BATCH_SIZE = tuple(
    name for name, f in RelationVector.model_fields.items() if name != "batch_sizes" and list_depth(f.annotation) == 1
)


class AccuracyBracket(Strict):
    """The two evaluations around the first crossing of the target accuracy: the last one
    below the target and the first one at or above it (samples processed, test accuracy).
    Both are the evaluation before training when that one already meets the target."""

    before_samples: int = Field(ge=0)
    before_accuracy: float
    after_samples: int = Field(ge=0)
    after_accuracy: float

    @property
    def width_samples(self) -> int:
        """How far apart the two evaluations are (samples): N_b lies between them."""
        return self.after_samples - self.before_samples


class TrainingOutcome(Strict):
    """One training run to the target accuracy (proxy estimation or device fine-tune)."""

    batch_size: int
    seed: int
    samples_to_accuracy: int | None = Field(
        description="N_b: where the test accuracy first reaches the target, interpolated linearly between "
        "the evaluations in `bracket` and rounded to a whole sample; None = censored (never reached)"
    )
    bracket: AccuracyBracket | None = Field(None, description="the evaluations around the crossing; None = censored")
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
    peak_power_w: float | None = Field(description="the table's peak power at (b, f) (W); None: not measured there")
    estimated_energy_j: float | None = Field(None, description="E[b][f] * r_b (J): the energy objective, where E was measured")
    note: str | None = Field(None, description="why the strategy decided as it did, when that is not the plain estimate")


class ConfigSwitch(Strict):
    """A change of configuration while fine-tuning, at `device_time_s` (s since the fine-tune
    started) after `samples` samples: a new cap (`cause` "cap"), the power guard stepping the
    frequency down or back up ("guard"), a pause at idle clocks because no configuration meets
    the cap ("pause"; no new configuration) and the resume after it ("resume"), or the closed
    loop re-selecting with what the device measured on its own data ("evidence"; the note
    gives the evidence)."""

    device_time_s: float
    samples: int
    cause: Literal["cap", "guard", "pause", "resume", "evidence"]
    power_cap_w: float | None = Field(description="the cap in force (W)")
    old_batch_size: int | None
    old_frequency_hz: int | None
    new_batch_size: int | None
    new_frequency_hz: int | None
    note: str | None = None

    def line(self) -> str:
        """The switch as one line for people."""
        cap = "no cap" if self.power_cap_w is None else f"cap {self.power_cap_w:g} W"
        old = f"b={self.old_batch_size} f={(self.old_frequency_hz or 0) / 1e6:g} MHz" if self.old_batch_size else "paused"
        new = f"b={self.new_batch_size} f={(self.new_frequency_hz or 0) / 1e6:g} MHz" if self.new_batch_size else "paused"
        note = f" ({self.note})" if self.note else ""
        return f"{self.device_time_s:9.1f} s  {self.cause:<6} {cap}: {old} -> {new}{note}"


class PowerGuardReport(Strict):
    """What the power guard saw while fine-tuning: readings above the cap in force."""

    step_downs: int = Field(0, description="times the frequency was stepped down one level on an over-cap reading")
    step_ups: int = Field(0, description="times it went back up after a sustained margin")
    over_cap_s: float = Field(
        0.0, description="device time of the measured regions whose peak was over the cap by more than the sensor's resolution (s)"
    )
    peak_power_w: float = Field(0.0, description="the highest reading (W)")
    peak_over_cap_w: float = Field(
        0.0, description="the largest reading above the cap in force by more than the sensor's resolution (W; 0: never over)"
    )
    over_cap_w: float | None = Field(None, description="the cap in force when that reading was taken (W)")


class ConfigurationRun(Strict):
    """How much of a fine-tune ran at one (batch size, frequency)."""

    batch_size: int
    frequency_hz: int
    samples: int = 0
    device_time_s: float = 0.0


class ExplorationReport(Strict):
    """A batch size a fine-tune explored (common/finetune/exploration.py): why, against which measured
    batch sizes, the most it could cost the run (a fraction of the exploit choice's expected
    time), and what came of it."""

    batch_size: int
    exploit_batch_size: int = Field(description="what the run would have run without exploring")
    against: list[int] = Field(default_factory=list, description="measured batch sizes its solo curve was matched against")
    cost_bound: float = Field(ge=0, description="the most it could cost, as a fraction of the exploit choice's expected time")
    measure_by_samples: int | None = Field(None, description="samples by which its N_b was to be measured (None: not measurable)")
    measured_at_samples: int | None = Field(None, description="when its N_b was measured (None: not, or not yet)")
    outcome: str | None = Field(None, description="kept, or left for another batch size, and why")
    cost: float | None = Field(
        None,
        description="its device time beyond the exploit choice's for the same progress when it ended, on its curve, as a fraction "
        "of the exploit choice's expected time (< 0: it gained; the switch back not counted)",
    )
    note: str

    def line(self) -> str:
        """The exploration for people."""
        cost = "" if self.cost is None else f", it cost {self.cost:.1%}" if self.cost >= 0 else f", it gained {-self.cost:.1%}"
        ending = f"; {self.outcome}" if self.outcome else ""
        return f"explored b={self.batch_size} (else b={self.exploit_batch_size}), at most {self.cost_bound:.1%} at stake{cost}{ending}"


class RunReport(Strict):
    """What `finetune` measured on the device. `batch_size` and `frequency_hz` are the
    configuration it ended with; `configurations` lists every one that ran (caps, the power
    guard and re-selections change it while it trains)."""

    device_id: str
    device_type: str
    simulated: bool
    batch_size: int
    frequency_hz: int
    configurations: list[ConfigurationRun] = Field(default_factory=list, description="what ran at each (b, f), in order")
    reached: bool
    final_accuracy: float
    samples_to_accuracy: int | None
    samples_processed: int
    steps: int
    device_time_s: float = Field(description="time to accuracy on the device (simulated when `simulated`)")
    energy_j: float
    peak_power_w: float
    power_resolution_w: float = Field(0.0, description="the smallest step of the device's power readings (W)")
    wall_s: float = Field(description="wall-clock time of the task on the worker host")
    attempts: int = Field(1, description="how many times the fine-tune started (> 1: its worker died and it resumed)")
    lost_device_time_s: float = Field(0.0, description="device time of the work lost with dead attempts (s)")
    lost_energy_j: float = Field(0.0, description="energy of the work lost with dead attempts (J)")
    switches: list[ConfigSwitch] = Field(default_factory=list, description="configuration changes while fine-tuning")
    paused_s: float = Field(0.0, description="device time spent paused at idle clocks: no configuration met the cap (s)")
    guard: PowerGuardReport = Field(default_factory=PowerGuardReport)
    learned: VectorProvenance | None = Field(
        None, description="where the vector it last selected with came from, when not the proxy's (the closed loop)"
    )
    exploration: ExplorationReport | None = Field(None, description="the batch size it explored, if it did")
