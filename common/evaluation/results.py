"""The evaluation's inputs per device type and its typed results (the `--json` document).

Times are device seconds to the target accuracy, energies board joules; mean and standard
deviation are over the seeds of the target's N_b (the lookup table is one measurement).
"""

from __future__ import annotations

from pydantic import Field

from ..schemas import ProfileTable, Strict

METHODS = ("baseline1", "baseline2", "equation4", "edgetrain", "energy", "oracle")


class DeviceProfile(Strict):
    """A device type's lookup table, Baseline 1's model-agnostic full-load board power per
    table frequency (W; None: the table's worst row stands in), and the caps to evaluate (W)."""

    device_type: str
    table: ProfileTable
    power_envelope_w: list[float] | None = None
    power_caps_w: list[float | None] = Field(min_length=1)


class MeanStd(Strict):
    """A mean and standard deviation over seeds."""

    mean: float
    std: float


class MethodResult(Strict):
    """One method's configuration and what it costs to reach the target with it; nothing is
    reached when the method has no configuration under the cap or its batch size never reaches
    the target on the target data (censored)."""

    batch_size: int | None
    frequency_hz: int | None
    time_to_accuracy_s: MeanStd | None
    energy_j: MeanStd | None
    reached: bool


class EvaluationRow(Strict):
    """The methods on one (device type, power cap, target dataset). Speed-ups are a
    baseline's mean time over edgetrain's; the gap is edgetrain's mean time over the oracle's,
    minus 1, in percent; None unless both methods reach the target."""

    device_type: str
    power_cap_w: float | None
    target: str
    proxy: str
    simulated: bool
    baseline1: MethodResult
    baseline2: MethodResult
    equation4: MethodResult
    edgetrain: MethodResult
    energy: MethodResult
    oracle: MethodResult
    speedup_vs_baseline1: float | None
    speedup_vs_baseline2: float | None
    gap_to_oracle_pct: float | None


class SensitivityMatrix(Strict):
    """How good each dataset is as a proxy for each other one on a (device type, cap):
    `edgetrain_over_oracle_pct[p][t]` is the % time over the oracle on target `datasets[t]` of
    edgetrain's choice with the vector of proxy `datasets[p]`, and `equation4_over_oracle_pct`
    the same for plain equation (4); Baseline 1 uses no proxy, so its % over the oracle is one
    value per target. None where a method does not reach the target."""

    device_type: str
    power_cap_w: float | None
    simulated: bool
    datasets: list[str]
    edgetrain_over_oracle_pct: list[list[float | None]]
    equation4_over_oracle_pct: list[list[float | None]]
    baseline1_over_oracle_pct: list[float | None]


class Robustness(Strict):
    """Every cell of the sensitivity matrices (device type, cap, proxy, target) against Baseline 1.
    A method's ratio in a cell is its time to accuracy over Baseline 1's (> 1: slower); a cell
    is over when the ratio exceeds 1.05. Where plain equation (4) is faster than Baseline 1,
    edgetrain keeps `kept` = its speed-up over equation (4)'s (1: all of it)."""

    cells: int = Field(description="cells where edgetrain, equation (4) and Baseline 1 all reach the target")
    edgetrain_worst: float | None = Field(description="edgetrain's largest ratio to Baseline 1")
    equation4_worst: float | None = Field(description="plain equation (4)'s largest ratio to Baseline 1")
    edgetrain_over: list[str] = Field(description="the cells where edgetrain is more than 5 % slower than Baseline 1")
    equation4_over: list[str] = Field(description="the cells where equation (4) is more than 5 % slower than Baseline 1")
    speedup_cells: int = Field(description="cells where equation (4) is faster than Baseline 1")
    kept_least: float | None = Field(description="the least `kept` over those cells")
    kept_below_90pct: list[str] = Field(description="those cells where edgetrain keeps less than 90 %, with what it keeps")


class EvaluationReport(Strict):
    """An evaluation's result: a row per (device type, cap, target), the sensitivity matrices,
    their summary against Baseline 1, and notes."""

    rows: list[EvaluationRow]
    sensitivity: list[SensitivityMatrix]
    robustness: Robustness | None = None
    notes: list[str] = Field(default_factory=list, description="why a method has no configuration, and other caveats")
