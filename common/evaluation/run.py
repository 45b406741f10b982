"""An evaluation as it ran on a cluster: the report with what it was computed from, what was
sent to the workers, and the fine-tunes of `--verify` (the `--json` document of one spec)."""

from __future__ import annotations

from pydantic import Field

from ..schemas import RelationVector, Strict
from .results import EvaluationReport
from .spec import EvaluationSpec
from .verification import Achieved, Verification


class SentToWorkers(Strict):
    """What an evaluation sent to the workers; zero where it reused what Redis holds (or
    waited for another job or command that was producing it)."""

    pretrain: int = 0
    estimations: int = Field(0, description="relation vectors estimated on the server pool")
    profiles: int = Field(0, description="lookup tables profiled on a device")
    finetunes: int = Field(0, description="fine-tunes of --verify on a device")


class EvaluationRun(EvaluationReport):
    """One spec's evaluation: its rows, sensitivity matrices and notes, the weights and relation
    vectors (N_b per batch size, with their resolution) they were computed from, the
    verification fine-tunes, what was dispatched, and the wall time (s)."""

    name: str | None
    spec: EvaluationSpec
    weights: str = Field(description="the weights every run started from (the pre-trained ones when the spec pre-trains)")
    pretrain_test_accuracy: float | None = None
    vectors: dict[str, RelationVector] = Field(description="per dataset label: N_b over seeds for every batch size")
    verification: list[Verification] = Field(default_factory=list)
    achieved: list[Achieved] = Field(default_factory=list, description="edgetrain's own fine-tune of each row, through the device workers")
    dispatched: SentToWorkers
    wall_s: float
