"""What an evaluation runs: a model and its starting weights (optionally pre-trained on the
server pool first), one proxy dataset, the target datasets, the device types with their
power caps, the batch sizes and the seeds.

Every dataset is trained to its own target accuracy with every batch size and seed, on the
server pool: the proxy's N_b give edgetrain's relation vector, each target's N_b give the
oracle and every method's time to accuracy (N_b depends on the data and the weights, not on
the device). Each device type is profiled once (grid by default: one table serves every cap).
"""

from __future__ import annotations

import re

from pydantic import Field, PositiveFloat, field_validator, model_validator

from ..datasets.registry import USER_DATA, dataset_task
from ..devices.base import DeviceError
from ..devices.simulated import load_twin
from ..ids import Identifier
from ..models import get_model, model_names
from ..schemas import (
    PAPER_BATCH_SIZES,
    BatchSizes,
    DatasetRef,
    EstimationRequest,
    LearningRatePolicy,
    ProfilingOptions,
    Seeds,
    Strict,
)

INIT_WEIGHTS = re.compile(r"^init:(\d+)$")


class PretrainStep(Strict):
    """Pre-training on a server worker before anything else: `max_samples` samples of `dataset`
    from the spec's `init:<seed>` weights; the published weights replace `weights`."""

    dataset: DatasetRef
    max_samples: int = Field(gt=0, description="samples to pre-train on")
    batch_size: int = Field(128, gt=0)


class DatasetGoal(Strict):
    """A dataset and the test accuracy (fraction) its N_b are measured to."""

    dataset: DatasetRef
    target_accuracy: float = Field(gt=0, lt=1)
    name: str | None = Field(None, min_length=1, description="label in reports; default: the dataset's name")

    @field_validator("dataset")
    @classmethod
    def _registered(cls, value: DatasetRef) -> DatasetRef:
        dataset_task(value.name)
        if value.name in USER_DATA and value.path is None:
            raise ValueError(f"path: dataset {value.name!r} reads your own data: give its path")
        return value

    @property
    def label(self) -> str:
        """The name in reports: `name`, else the dataset's name with its fraction below 1."""
        if self.name:
            return self.name
        return self.dataset.name if self.dataset.fraction == 1 else f"{self.dataset.name} ({self.dataset.fraction:g})"


class EvaluatedDevice(Strict):
    """A device type to evaluate on, by built-in twin name or twin spec file (`twin`), or by a
    registered device (`device_id`), and the board power caps (W; null = no cap)."""

    twin: str | None = Field(None, min_length=1)
    device_id: Identifier | None = None
    power_caps_w: list[PositiveFloat | None] = Field(default_factory=lambda: [None], min_length=1)  # type: ignore[arg-type]

    @field_validator("twin")
    @classmethod
    def _known_twin(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                load_twin(value)
            except DeviceError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("power_caps_w")
    @classmethod
    def _unique_caps(cls, value: list[float | None]) -> list[float | None]:
        if len(set(value)) != len(value):
            raise ValueError(f"each power cap may appear once, got {value}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> EvaluatedDevice:
        if (self.twin is None) == (self.device_id is None):
            raise ValueError("give exactly one of 'twin' (a simulated device type) or 'device_id' (a registered device)")
        return self

    @property
    def label(self) -> str:
        """How this device entry is named in the rows: its twin or its device id."""
        return f"twin {self.twin}" if self.twin else f"device {self.device_id}"


class EvaluationSpec(Strict):
    """The paper's evaluation of one model: Baseline 1, Baseline 2, edgetrain and the oracle
    for every (device type, power cap, target dataset), and the proxy sensitivity matrix."""

    name: str | None = Field(None, description="a title for reports and figures")
    model: str = Field(min_length=1)
    weights: str = Field("init:0", description="'init:<seed>' or an artifact URL; with `pretrain`, 'init:<seed>'")
    pretrain: PretrainStep | None = None
    proxy: DatasetGoal
    targets: list[DatasetGoal] = Field(min_length=1)
    devices: list[EvaluatedDevice] = Field(min_length=1)
    batch_sizes: BatchSizes = Field(default_factory=lambda: list(PAPER_BATCH_SIZES), min_length=1)
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    lr: LearningRatePolicy = Field(default_factory=LearningRatePolicy)
    eval_every_samples: int = Field(512, gt=0, description="accuracy is checked this often; N_b is interpolated")
    max_samples: int = Field(200_000, gt=0, description="budget per run; a run short of its target by then is censored")
    profiling: ProfilingOptions = Field(default_factory=ProfilingOptions)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in model_names() and ":" not in value:
            raise ValueError(f"unknown model {value!r}; registered: {model_names()} or 'package.module:factory'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationSpec:
        if self.pretrain is not None and not INIT_WEIGHTS.match(self.weights):
            raise ValueError(f"weights: with 'pretrain', weights must be 'init:<seed>' (where pre-training starts), got {self.weights!r}")
        labels = [t.label for t in self.targets]
        for k, target in enumerate(self.targets):
            if target.label in labels[:k]:
                raise ValueError(f"targets.{k}: label {target.label!r} is used twice: give one of them a 'name'")
            if target.label == self.proxy.label and target != self.proxy:
                raise ValueError(f"targets.{k}: label {target.label!r} is the proxy's, with other data or accuracy: give it a 'name'")
        devices = [d.twin or d.device_id for d in self.devices]
        if len(set(devices)) != len(devices):
            raise ValueError(f"devices: each twin or device_id may appear once (list its caps in power_caps_w), got {devices}")
        if self.profiling.mode == "staircase" and any(len(d.power_caps_w) > 1 or d.power_caps_w[0] is None for d in self.devices):
            raise ValueError("profiling.mode: a staircase profile serves one power cap; use 'grid' for several caps or none")
        self._check_tasks()
        return self

    def _check_tasks(self) -> None:
        """Every dataset must be of the model's task (image or text)."""
        task = get_model(self.model).task if ":" not in self.model else dataset_task(self.proxy.dataset.name)
        named = [("proxy", self.proxy.dataset)] + [(f"targets.{k}", t.dataset) for k, t in enumerate(self.targets)]
        if self.pretrain is not None:
            named.append(("pretrain", self.pretrain.dataset))
        for where, ref in named:
            if dataset_task(ref.name) != task:
                kind = dataset_task(ref.name)
                raise ValueError(f"{where}.dataset: {ref.name!r} is a {kind} dataset, model {self.model!r} needs {task} data")

    def goals(self) -> list[DatasetGoal]:
        """Every dataset with its target accuracy, the proxy first, each label once."""
        return [self.proxy] + [t for t in self.targets if t.label != self.proxy.label]

    @property
    def init_seed(self) -> int | None:
        """The seed of `init:<seed>` weights (where pre-training starts), else None."""
        found = INIT_WEIGHTS.match(self.weights)
        return int(found.group(1)) if found else None

    def estimation_request(self, goal: DatasetGoal, weights: str | None = None) -> EstimationRequest:
        """What measures `goal`'s N_b for every batch size and seed on the server pool, from
        `weights` (the pre-trained weights' URL when the spec pre-trains, else the spec's)."""
        if weights is None and self.pretrain is not None:
            raise ValueError("this spec pre-trains first: pass the URL of the pre-trained weights")
        return EstimationRequest(
            model=self.model,
            weights=weights or self.weights,
            proxy_dataset=goal.dataset,
            target_accuracy=goal.target_accuracy,
            batch_sizes=self.batch_sizes,
            seeds=self.seeds,
            lr=self.lr,
            eval_every_samples=self.eval_every_samples,
            max_samples=self.max_samples,
        )
