"""The paper's evaluation, pure (no Redis, no Celery): the spec, the presets, and the
arithmetic that turns lookup tables and measured N_b into each method's time and energy to
the target accuracy, the speed-ups, the gap to the oracle and the proxy sensitivity matrix."""

from .compute import (
    evaluate,
    evaluation_row,
    method_result,
    over_oracle_pct,
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
    SensitivityMatrix,
)
from .spec import DatasetGoal, EvaluatedDevice, EvaluationSpec, PretrainStep

__all__ = [
    "METHODS", "SCALES", "DatasetGoal", "DeviceProfile", "EvaluatedDevice", "EvaluationReport", "EvaluationRow",
    "EvaluationSpec", "MeanStd", "MethodResult", "PretrainStep", "SensitivityMatrix", "evaluate", "evaluation_row",
    "method_result", "over_oracle_pct", "scale_preset", "sensitivity_matrix", "speedup", "strategies",
]  # fmt: skip
