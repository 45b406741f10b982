"""The paper's evaluation, pure (no Redis, no Celery): the spec, the presets, and the
arithmetic that turns lookup tables and measured N_b into each method's time and energy to
the target accuracy, the speed-ups, the gap to the oracle, the proxy sensitivity matrix and its summary against
Baseline 1;
the verification fine-tunes' comparison with equation (2), and the document of a run."""

from .compute import (
    evaluate,
    evaluation_row,
    method_result,
    over_oracle_pct,
    robustness,
    sensitivity_matrix,
    speedup,
    strategies,
)
from .presets import SCALES, scale_preset
from .results import (
    METHODS,
    DeviceProfile,
    EvaluationReport,
    EvaluationRow,
    MeanStd,
    MethodResult,
    Robustness,
    SensitivityMatrix,
)
from .run import EvaluationRun, SentToWorkers
from .spec import DatasetGoal, EvaluatedDevice, EvaluationSpec, PretrainStep
from .verification import Achieved, Check, Verification, achieved, checks, verification

__all__ = [
    "METHODS", "SCALES", "Achieved", "Check", "DatasetGoal", "DeviceProfile", "SentToWorkers", "EvaluatedDevice", "EvaluationReport",
    "EvaluationRow", "EvaluationRun", "EvaluationSpec", "MeanStd", "MethodResult", "PretrainStep", "Robustness",
    "SensitivityMatrix", "Verification", "achieved", "checks", "evaluate", "evaluation_row", "method_result", "over_oracle_pct",
    "robustness", "scale_preset",
    "sensitivity_matrix", "speedup", "strategies", "verification",
]  # fmt: skip
