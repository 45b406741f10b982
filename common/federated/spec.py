"""A federated job: the model and starting weights, the devices with their caps and data, the
server's global test set, the target global accuracy, the aggregation and who takes part."""

from __future__ import annotations

import math
from collections import Counter
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..ids import Identifier
from ..limits import MAX_BATCH_SIZES, MAX_CAP_STEPS, MAX_NAME_CHARS, BatchSize, Seed
from ..schemas import PAPER_BATCH_SIZES, CapSchedule, DatasetRef, LearningRatePolicy, Strict

MAX_FEDERATED_DEVICES = 1000  # devices of one federated job (each holds a model per round)
MAX_ROUNDS = 10_000
DEADLINE = "-deadline"  # a method with this suffix trains its configuration time-balanced (to the round's time budget)
METHODS = ("edgetrain", "equation4", "baseline1", f"baseline1{DEADLINE}")
TIME_BALANCED = ("edgetrain", f"baseline1{DEADLINE}")  # methods whose devices train to the same device time per round


class Partition(Strict):
    """How the job's dataset is split over the devices that hold no data of their own: `iid`
    (a seeded shuffle in equal parts), `shards` (sorted by label, cut in `shards_per_device`
    shards per device, dealt at random: few labels per device) or `dirichlet` (each label's
    samples shared out by proportions drawn from Dir(`alpha`): smaller alpha, less alike)."""

    scheme: Literal["iid", "shards", "dirichlet"] = "iid"
    alpha: float = Field(0.5, gt=0, le=1000, description="dirichlet: concentration (smaller: more skewed)")
    shards_per_device: int = Field(2, ge=1, le=100, description="shards: label shards per device")
    seed: Seed = 0


class FederatedDevice(Strict):
    """One device of a federated job: its board power cap (W; None: no cap), or a schedule of
    caps by round (a cap set on the device with `edgetrain cap` after the job was submitted
    holds instead, from the next round), and its data: a dataset it holds, or (None) its share
    of the job's dataset under `partition`."""

    device_id: Identifier
    power_cap_w: float | None = Field(None, gt=0, description="board power cap in W; None = no cap")
    power_cap_schedule: CapSchedule | None = Field(
        None, max_length=MAX_CAP_STEPS, description="[[round, cap in W or null], ...]: the cap from that round on; power_cap_w holds before"
    )
    dataset: DatasetRef | None = None

    def cap_in(self, round_number: int) -> float | None:
        """The scheduled cap (W) of round `round_number`."""
        cap = self.power_cap_w
        for first_round, step_cap in self.power_cap_schedule or []:
            if first_round > round_number:
                break
            cap = step_cap
        return cap


class Aggregation(Strict):
    """How updates become the global model. `mode`: `rounds` (every round waits for its
    participants' updates or its deadline) or `buffered` (FedBuff: every device trains again at
    once on the newest global model, and the server aggregates every `buffer_size` updates,
    each weighted by the samples its device holds and by `staleness`: 1/sqrt(1 + s) for an
    update that started s aggregations ago (`sqrt`) or 1 (`none`)). `rule` (rounds): `fedavg`
    (the updates' average weighted by the samples each device holds) or `fednova` (normalized
    averaging: each update's change divided by its device's local work, averaged with the same
    weights, rescaled by the effective local work; common/federated/rounds.py); `mu` > 0 adds
    FedProx's proximal term mu/2 * ||w - w_global||^2 to every local loss; `drift` (rounds):
    `scaffold` corrects every local step by the fleet's control variate minus the device's own
    (SCAFFOLD: the devices' mean gradients; common/federated/rounds.py), `none` does not."""

    mode: Literal["rounds", "buffered"] = "rounds"
    buffer_size: int | None = Field(None, ge=1, le=MAX_FEDERATED_DEVICES, description="buffered: updates per aggregation")
    staleness: Literal["sqrt", "none"] = Field("sqrt", description="buffered: an update's weight by its staleness s: 1/sqrt(1+s) or 1")
    rule: Literal["fedavg", "fednova"] = "fedavg"
    mu: float = Field(0.0, ge=0, le=100, description="FedProx's mu (0: plain FedAvg)")
    drift: Literal["none", "scaffold"] = Field("none", description="rounds: correct each local step for the device's drift")

    @model_validator(mode="after")
    def _mode_fields(self) -> Aggregation:
        problems = []
        if self.mode == "buffered" and self.buffer_size is None:
            problems.append("aggregation.buffer_size: required with mode buffered (updates per aggregation)")
        if self.mode == "rounds" and self.buffer_size is not None:
            problems.append("aggregation.buffer_size: applies only with mode buffered")
        if self.mode == "buffered" and self.rule == "fednova":
            problems.append("aggregation.rule: fednova applies only with mode rounds (buffered aggregates by samples and staleness)")
        if self.mode == "buffered" and self.drift != "none":
            problems.append(f"aggregation.drift: {self.drift} applies only with mode rounds (a buffered update's control variate "
                            "would be stale by its staleness); leave it at none")  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def staleness_weight(self, staleness: int) -> float:
        """An update's weight for its staleness (aggregations since its work started)."""
        return 1.0 / math.sqrt(1 + staleness) if self.staleness == "sqrt" else 1.0


class Participation(Strict):
    """Who trains in a round: a seeded `fraction` of the devices that are heard from (at least
    one), and how long a round waits for their updates (wall s) before it closes with those
    that arrived."""

    fraction: float = Field(1.0, gt=0, le=1)
    deadline_s: float = Field(600.0, gt=0, le=7 * 24 * 3600, description="wall s a round waits for updates")


class LocalWork(Strict):
    """How each device's (b, f) and local work per round are chosen.

    `method`: `edgetrain` (each device's equation (4) choice under its cap, and local steps
    sized so that every device trains for the same device time per round), `equation4` (the
    same choice, `local_steps` steps each), `baseline1` (the largest batch that fits at the
    cap's model-agnostic frequency, `local_steps` steps each) or `baseline1-deadline`
    (Baseline 1's configuration, each device training until the round's time budget, as
    edgetrain: FedProx-style partial work). `local_steps`: steps per round of the
    equal-steps methods, and of the device whose time sets the time-balanced methods' round
    budget (the median device). `fleet_power_w` (edgetrain): a budget in watts across the
    round's devices: a round whose time-balanced plan would draw more has each device choose
    between more local steps and a lower frequency by progress per joule, so that their steps
    take at most `fleet_power_w` times the round's time budget (J); a budget that even
    `min_steps` steps at every device's most frugal (b, f) exceed fails the job, naming it."""

    method: Literal["edgetrain", "equation4", "baseline1", "baseline1-deadline"] = "edgetrain"
    local_steps: int = Field(20, ge=1, le=100_000)
    min_steps: int = Field(1, ge=1, le=100_000, description="time-balanced methods: the fewest steps a device trains in a round")
    fleet_power_w: float | None = Field(
        None, gt=0, le=1_000_000,
        description="edgetrain: the round's devices together draw at most this (W) over the round's time budget; None: no budget",
    )  # fmt: skip

    @model_validator(mode="after")
    def _budget_with_edgetrain(self) -> LocalWork:
        if self.fleet_power_w is not None and self.method != "edgetrain":
            raise ValueError(f"local.fleet_power_w: applies only with method edgetrain (each device choosing its (b, f)), not "
                             f"{self.method}")  # fmt: skip
        return self


class FederatedSpec(Strict):
    """A federated job (`kind: federated`)."""

    kind: Literal["federated"]
    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    weights: str = Field("init:0", max_length=MAX_NAME_CHARS, description="'init:<seed>' or an artifact URL")
    dataset: DatasetRef | None = Field(None, description="split over the devices that name no dataset")
    partition: Partition = Field(default_factory=Partition)
    test_dataset: DatasetRef = Field(description="the server's global test set (its test split)")
    target_accuracy: float = Field(gt=0, lt=1, description="on the global test set")
    devices: list[FederatedDevice] = Field(min_length=1, max_length=MAX_FEDERATED_DEVICES)
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: list(PAPER_BATCH_SIZES), min_length=1, max_length=MAX_BATCH_SIZES)
    lr: LearningRatePolicy = Field(default_factory=LearningRatePolicy)
    aggregation: Aggregation = Field(default_factory=Aggregation)
    participation: Participation = Field(default_factory=Participation)
    local: LocalWork = Field(default_factory=LocalWork)
    max_rounds: int = Field(50, ge=1, le=MAX_ROUNDS)
    seed: Seed = 0

    @field_validator("batch_sizes")
    @classmethod
    def _ascending(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"batch sizes must be distinct, got {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _consistent(self) -> FederatedSpec:
        problems = []
        if repeated := sorted(i for i, n in Counter(d.device_id for d in self.devices).items() if n > 1):
            problems.append(f"devices: each device may appear once; repeated {repeated}")
        if self.dataset is None and any(d.dataset is None for d in self.devices):
            problems.append("dataset: required when a device names no dataset of its own (it trains on its share of it)")
        if self.aggregation.mode == "buffered" and self.participation.fraction < 1:
            problems.append("participation.fraction: buffered mode trains every device heard from; leave it at 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def partitioned(self) -> list[str]:
        """The devices that train on a share of the job's dataset, in spec order."""
        return [d.device_id for d in self.devices if d.dataset is None]
