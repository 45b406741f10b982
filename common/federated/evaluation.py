"""The federated evaluation: one fleet of twins trained to a target global accuracy with each
method (Baseline 1, equation (4) with equal local steps, edgetrain's time-balanced steps; the
last two also with a relation vector, `+vector`; edgetrain within the job's fleet power
budget, `+budget`) over several seeds, in one process
(`simulate`), and its summary per method: rounds, device time and fleet energy to the target
(mean ± std over seeds) and the speed-up over Baseline 1.

A seed sets the job's `seed` (each device's mini-batch order, who takes part, the twins'
measurement noise); the partition, its seed and the starting weights are the job's own.
Device time and energy come from the twins: SIMULATED. Accuracy comes from real training.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import Field, field_validator, model_validator

from ..devices.base import DeviceError
from ..devices.simulated import load_twin
from ..estimation import estimate_in_process
from ..evaluation import MeanStd
from ..limits import MAX_SEEDS
from ..schemas import RelationVector, Seeds, Strict, TrainingOutcome
from .plan import Assignment
from .records import RoundRecord
from .simulate import ASYNC, BUDGET, FEDNOVA, SCAFFOLD, VECTOR, FederatedRun, simulate, twin_table
from .spec import DEADLINE, MAX_ROUNDS, FederatedSpec
from .vector import ProxyRuns, read_vector

LABELS = {
    "baseline1": "Baseline 1", f"baseline1{DEADLINE}": "Baseline 1, partial work to the deadline", "equation4": "eq. (4), equal steps",
    "edgetrain": "edgetrain (time-balanced)", f"edgetrain{FEDNOVA}": "edgetrain + FedNova (time-balanced)",
    f"edgetrain{SCAFFOLD}": "edgetrain + drift correction (time-balanced, SCAFFOLD)",
    f"edgetrain{ASYNC}": "edgetrain async (buffered)", f"edgetrain{BUDGET}": "edgetrain within the fleet power budget (time-balanced)",
    f"equation4{VECTOR}": "eq. (4) + vector, equal steps", f"edgetrain{VECTOR}": "edgetrain + vector (time-balanced)",
}  # fmt: skip


class FederatedEvaluationSpec(Strict):
    """A fleet of twins and a federated job to evaluate each method on: `job` is a federated
    job spec (its `seed` and `local.method` are set per run), `twins` the twin (built-in name
    or twin spec file) that simulates each of its devices. The `+vector` methods choose every
    device's (b, f) with one relation vector: estimated in this process (`proxy`) or given
    (`vector`); the others with r_b = 1."""

    name: str | None = Field(None, description="a title for reports and figures")
    job: FederatedSpec
    twins: dict[str, str] = Field(min_length=1, description="device id -> twin name or twin spec file")
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=MAX_SEEDS)
    methods: list[str] = Field(default_factory=lambda: [m for m in LABELS if not m.endswith((VECTOR, BUDGET))], min_length=1,
                               description="in the order of the reports")  # fmt: skip
    proxy: ProxyRuns | None = Field(None, description="the `+vector` methods' relation vector, estimated in this process")
    vector: RelationVector | None = Field(None, description="the `+vector` methods' relation vector, or its JSON file's path")

    @field_validator("twins")
    @classmethod
    def _known_twins(cls, value: dict[str, str]) -> dict[str, str]:
        for device_id, twin in value.items():
            try:
                load_twin(twin)
            except DeviceError as exc:
                raise ValueError(f"{device_id}: {exc}") from None
        return value

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: list[str]) -> list[str]:
        if unknown := [m for m in value if m not in LABELS]:
            raise ValueError(f"unknown methods {unknown}; use any of {list(LABELS)}")
        if len(set(value)) != len(value):
            raise ValueError(f"each method may appear once, got {value}")
        return value

    @field_validator("vector", mode="before")
    @classmethod
    def _vector_file(cls, value: object) -> object:
        return read_vector(value)

    @model_validator(mode="after")
    def _every_device_a_twin(self) -> FederatedEvaluationSpec:
        devices = [d.device_id for d in self.job.devices]
        if missing := [d for d in devices if d not in self.twins]:
            raise ValueError(f"twins: give a twin for every device of job.devices; missing {missing}")
        if unknown := sorted(set(self.twins) - set(devices)):
            raise ValueError(f"twins: {unknown} are not devices of job.devices")
        return self

    @model_validator(mode="after")
    def _one_vector_for_its_methods(self) -> FederatedEvaluationSpec:
        using = [m for m in self.methods if m.endswith(VECTOR)]
        given = [name for name in ("proxy", "vector") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError("vector: give either proxy (estimated in this process) or vector, not both")
        if using and not given:
            raise ValueError(f"methods: {using} need a relation vector: give proxy (estimated in this process) or vector")
        if given and not using:
            raise ValueError(f"{given[0]}: no method uses it; add equation4{VECTOR} or edgetrain{VECTOR} to methods")
        if self.vector and (missing := [b for b in self.job.batch_sizes if b not in self.vector.batch_sizes]):
            raise ValueError(f"vector: no r_b for the job's batch sizes {missing}")
        return self

    @model_validator(mode="after")
    def _one_budget_for_its_method(self) -> FederatedEvaluationSpec:
        using = [m for m in self.methods if m.endswith(BUDGET)]
        if using and self.job.local.fleet_power_w is None:
            raise ValueError(f"methods: {using} need a fleet power budget: give job.local.fleet_power_w (W)")
        if self.job.local.fleet_power_w is not None and not using:
            raise ValueError(f"job.local.fleet_power_w: no method uses it; add edgetrain{BUDGET} to methods")
        return self

    @model_validator(mode="after")
    def _async_can_run_buffered(self) -> FederatedEvaluationSpec:
        if (buffered := [m for m in self.methods if m.endswith(ASYNC)]) and self.job.participation.fraction < 1:
            raise ValueError(f"methods: {buffered} run buffered, which trains every device, not a fraction of them: set "
                             f"job.participation.fraction to 1 or leave {buffered} out of methods")  # fmt: skip
        return self

    def async_buffer_size(self) -> int:
        """The `+async` methods' updates per aggregation: the job's `buffer_size`, else half its devices."""
        return self.job.aggregation.buffer_size or max(1, len(self.job.devices) // 2)

    def run_spec(self, method: str, seed: int) -> FederatedSpec:
        """The job of one run, validated as a submitted job is: `method` (without `+vector`,
        `+budget`, `+fednova`, `+async` or `+scaffold`) choosing every device's work, within the
        job's fleet power budget for a `+budget` method (without one otherwise), aggregated with
        FedNova for a `+fednova` method, with drift correction for a `+scaffold` one (without
        otherwise), buffered for an `+async` one (`async_buffer_size`; as many local
        works at most as `max_rounds` rounds of every device, within MAX_ROUNDS aggregations)
        and FedAvg in rounds otherwise, `seed` its seed."""
        job = self.job.model_dump()
        job["local"]["method"] = method
        for suffix in (SCAFFOLD, FEDNOVA, ASYNC, BUDGET, VECTOR):
            job["local"]["method"] = job["local"]["method"].removesuffix(suffix)
        job["aggregation"]["drift"] = "scaffold" if method.endswith(SCAFFOLD) else "none"
        if not method.endswith(BUDGET):
            job["local"]["fleet_power_w"] = None
        if method.endswith(ASYNC):
            job["aggregation"] |= {"mode": "buffered", "rule": "fedavg", "buffer_size": self.async_buffer_size()}
            job["max_rounds"] = min(MAX_ROUNDS, math.ceil(self.job.max_rounds * len(self.job.devices) / self.async_buffer_size()))
        else:
            job["aggregation"] |= {"mode": "rounds", "buffer_size": None, "rule": "fednova" if method.endswith(FEDNOVA) else "fedavg"}
        return FederatedSpec.model_validate(job | {"seed": seed})


class MethodSummary(Strict):
    """One method over the seeds: how many reached the target global accuracy, and over those,
    the rounds, the device time (s) and the fleet's energy (J) to it; the speed-up is Baseline
    1's mean time over this method's (None unless both reached it with every seed). The global
    model on the devices' held-out data at each run's last round (the target round where it
    reached the target), over every seed: the mean over the devices, the worst device's
    accuracy and the spread (std) over the devices (fractions). `plan`: each device's
    assignment the first time it took part in the first seed's run."""

    method: str
    runs: int
    reached: int
    rounds: MeanStd | None
    time_to_target_s: MeanStd | None
    energy_to_target_j: MeanStd | None
    speedup_vs_baseline1: float | None
    device_mean: MeanStd | None = None
    device_worst: MeanStd | None = None
    device_spread: MeanStd | None = None
    plan: list[Assignment]


class FederatedEvaluation(Strict):
    """A federated evaluation's result (the `--json` document): the spec, the `+vector`
    methods' relation vector, the summary per method, every run round by round, and the wall
    time (s). Device figures are SIMULATED."""

    name: str | None
    spec: FederatedEvaluationSpec
    vector: RelationVector | None = None
    summary: list[MethodSummary]
    runs: list[FederatedRun]
    wall_s: float
    simulated: bool = True


FLEET = [  # (device id, twin, board power cap in W; None: no cap)
    ("nano-1", "jetson-nano", 5.0), ("nano-2", "jetson-nano", None), ("tx2-1", "jetson-tx2-nx", 7.0),
    ("tx2-2", "jetson-tx2-nx", 10.0), ("orin-1", "jetson-agx-orin", 15.0), ("orin-2", "jetson-agx-orin", 30.0),
]  # fmt: skip
PRESET: dict[str, Any] = {
    "name": "federated: smallcnn from init, MNIST (5000) split Dirichlet(0.5) over 6 twins of 3 types",
    "seeds": [0, 1, 2],
    "twins": {device_id: twin for device_id, twin, _ in FLEET},
    "job": {
        "kind": "federated", "model": "smallcnn", "weights": "init:0",
        "dataset": {"name": "mnist5k"}, "partition": {"scheme": "dirichlet", "alpha": 0.5, "seed": 0},
        "test_dataset": {"name": "mnist5k"}, "target_accuracy": 0.9,
        "devices": [{"device_id": device_id, "power_cap_w": cap} for device_id, _, cap in FLEET],
        "batch_sizes": [8, 16, 32, 64, 128], "local": {"local_steps": 10}, "max_rounds": 60,
    },
}  # fmt: skip


def preset() -> FederatedEvaluationSpec:
    """The ready-made federated evaluation (`edgetrain evaluate --federated`), validated."""
    return FederatedEvaluationSpec.model_validate(PRESET)


def _spread(values: list[float]) -> MeanStd | None:
    return MeanStd(mean=statistics.fmean(values), std=statistics.pstdev(values)) if values else None


def _first_plan(run: FederatedRun) -> list[Assignment]:
    """Each device's assignment in the first round it took part in."""
    seen: dict[str, Assignment] = {}
    for record in run.rounds:
        for d in record.devices:
            seen.setdefault(d.assignment.device_id, d.assignment)
    return list(seen.values())


def summarize(runs: list[FederatedRun], methods: list[str]) -> list[MethodSummary]:
    """Each method's figures over its runs (one per seed), in `methods` order."""
    summaries = []
    for method in methods:
        mine = sorted((r for r in runs if r.method == method), key=lambda r: r.seed)
        done = [r for r in mine if r.reached]
        fair = [f for r in mine if r.rounds and (f := r.rounds[-1].fairness())]
        summaries.append(MethodSummary(
            method=method, runs=len(mine), reached=len(done),
            rounds=_spread([float(len(r.rounds)) for r in done]),
            time_to_target_s=_spread([r.time_to_target_s for r in done if r.time_to_target_s is not None]),
            energy_to_target_j=_spread([r.energy_to_target_j for r in done if r.energy_to_target_j is not None]),
            speedup_vs_baseline1=None, device_mean=_spread([f.mean for f in fair]), device_worst=_spread([f.worst for f in fair]),
            device_spread=_spread([f.spread for f in fair]), plan=_first_plan(mine[0]) if mine else [],
        ))  # fmt: skip
    baseline = next((s for s in summaries if s.method == "baseline1"), None)
    for s in summaries:
        if baseline and baseline.time_to_target_s and s.time_to_target_s and baseline.reached == baseline.runs and s.reached == s.runs:
            s.speedup_vs_baseline1 = baseline.time_to_target_s.mean / s.time_to_target_s.mean
    return summaries


def evaluate_fleet(
    spec: FederatedEvaluationSpec,
    on_round: Callable[[str, int, RoundRecord], None] | None = None,
    on_run: Callable[[FederatedRun], None] | None = None,
    on_proxy_run: Callable[[TrainingOutcome], None] | None = None,
) -> FederatedEvaluation:  # fmt: skip
    """Estimate the relation vector (with `proxy`), profile each twin once, run the job with
    every method and seed, and summarize; `on_round(method, seed, record)`, `on_run(run)` and
    `on_proxy_run(outcome)` report progress."""
    started = time.perf_counter()
    vector = estimate_in_process(spec.proxy.request(spec.job), on_proxy_run) if spec.proxy else spec.vector
    tables = {twin: twin_table(twin, spec.job) for twin in dict.fromkeys(spec.twins.values())}
    runs = []
    for method in spec.methods:
        for seed in spec.seeds:
            report = partial(on_round, method, seed) if on_round else None
            mine = vector if method.endswith(VECTOR) else None
            runs.append(simulate(spec.run_spec(method, seed), spec.twins, tables, mine, on_round=report))
            if on_run:
                on_run(runs[-1])
    return FederatedEvaluation(name=spec.name, spec=spec, vector=vector, summary=summarize(runs, spec.methods), runs=runs,
                               wall_s=time.perf_counter() - started)  # fmt: skip
