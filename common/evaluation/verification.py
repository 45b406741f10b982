"""`--verify`, pure: which configurations of an evaluation to fine-tune on the device, and how
the measured run compares with equation (2).

A fine-tune stops at the first evaluation at or above the target, so its device time runs to
that evaluation (`samples_processed` samples), while its N_b is interpolated between that
evaluation and the one before. Like is compared with like: the measured time to accuracy is
the run's device time per sample times its own N_b, and equation (2) is evaluated with the
same N_b (`computed_time_for_run_s`); their ratio checks the lookup table's T[b][f] / N_s
against the device's time per sample while fine-tuning. The row's figure
(`computed_time_s`, with N_b averaged over seeds on the server pool) is shown next to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from ..schemas import ProfileTable, RunReport, Strict
from .results import METHODS, EvaluationRow, MeanStd


class Verification(Strict):
    """One configuration of a row fine-tuned on the device to the target (times in s on the
    device, simulated on a twin; energies in J); None where the run gives no figure."""

    device_type: str
    device_id: str
    power_cap_w: float | None
    target: str
    methods: list[str] = Field(description="the methods of the row that chose this configuration")
    batch_size: int
    frequency_hz: int
    seed: int = Field(description="the seed of the fine-tune (the spec's first)")
    job_id: str | None = None
    simulated: bool | None = None
    reached: bool = False
    reason: str | None = Field(None, description="why the fine-tune did not run or failed")
    computed_time_s: MeanStd | None = Field(None, description="the row's time: eq. (2) with N_b over seeds")
    computed_energy_j: MeanStd | None = None
    server_samples_to_accuracy: int | None = Field(None, description="N_b of the same batch size and seed on the server pool")
    samples_to_accuracy: int | None = Field(None, description="N_b of the fine-tune (interpolated)")
    samples_processed: int | None = Field(None, description="samples to the evaluation that stopped the fine-tune")
    device_time_s: float | None = Field(None, description="device time to the evaluation that stopped it")
    energy_j: float | None = None
    computed_time_for_run_s: float | None = Field(None, description="eq. (2) with the fine-tune's own N_b")
    computed_energy_for_run_j: float | None = None
    measured_time_s: float | None = Field(None, description="device time per sample x the fine-tune's N_b")
    measured_energy_j: float | None = None
    time_error_pct: float | None = Field(None, description="measured_time_s over computed_time_for_run_s, minus 1, in %")
    energy_error_pct: float | None = None


@dataclass(frozen=True)
class Check:
    """A configuration to fine-tune for a row: (b, f) and the methods that chose it."""

    row: EvaluationRow
    batch_size: int
    frequency_hz: int
    methods: tuple[str, ...]


def checks(rows: list[EvaluationRow]) -> list[Check]:
    """Per row, each distinct configuration of a method that reaches the target on the
    computed figures (a censored batch size would run to the budget and tell nothing new)."""
    found: list[Check] = []
    for row in rows:
        chosen: dict[tuple[int, int], list[str]] = {}
        for name in METHODS:
            method = getattr(row, name)
            if method.reached and method.batch_size is not None and method.frequency_hz is not None:
                chosen.setdefault((method.batch_size, method.frequency_hz), []).append(name)
        found += [Check(row, b, f, tuple(names)) for (b, f), names in chosen.items()]
    return found


def _pct(measured: float | None, computed: float | None) -> float | None:
    return None if measured is None or not computed else (measured / computed - 1.0) * 100.0


def verification(check: Check, device_id: str, seed: int, table: ProfileTable, run: RunReport | None,
                 server_samples: int | None, job_id: str | None = None, reason: str | None = None) -> Verification:  # fmt: skip
    """The check's figures next to what the fine-tune `run` measured (None: it did not run,
    `reason` says why); `server_samples` is N_b of the same batch size and seed on the server."""
    row = check.row
    method = getattr(row, check.methods[0])
    result = Verification(
        device_type=row.device_type, device_id=device_id, power_cap_w=row.power_cap_w, target=row.target,
        methods=list(check.methods), batch_size=check.batch_size, frequency_hz=check.frequency_hz, seed=seed,
        job_id=job_id, reason=reason, computed_time_s=method.time_to_accuracy_s, computed_energy_j=method.energy_j,
        server_samples_to_accuracy=server_samples,
    )  # fmt: skip
    if run is None:
        return result
    i, j = table.batch_sizes.index(check.batch_size), table.frequencies_hz.index(check.frequency_hz)
    time_s, energy_j = table.time_s[i][j], table.energy_j[i][j] if table.energy_j else None
    per_sample_s = None if time_s is None else time_s / table.samples
    per_sample_j = None if energy_j is None else energy_j / table.samples
    n_b = run.samples_to_accuracy if run.reached else None
    measured_s = run.device_time_s / run.samples_processed * n_b if n_b is not None and run.samples_processed else None
    measured_j = run.energy_j / run.samples_processed * n_b if n_b is not None and run.samples_processed else None
    for_run_s = per_sample_s * n_b if per_sample_s is not None and n_b is not None else None
    for_run_j = per_sample_j * n_b if per_sample_j is not None and n_b is not None else None
    return result.model_copy(
        update={
            "simulated": run.simulated, "reached": run.reached, "samples_to_accuracy": run.samples_to_accuracy,
            "samples_processed": run.samples_processed, "device_time_s": run.device_time_s, "energy_j": run.energy_j,
            "computed_time_for_run_s": for_run_s, "computed_energy_for_run_j": for_run_j,
            "measured_time_s": measured_s, "measured_energy_j": measured_j,
            "time_error_pct": _pct(measured_s, for_run_s), "energy_error_pct": _pct(measured_j, for_run_j),
            "reason": reason if run.reached else reason or f"the fine-tune did not reach the target (accuracy {run.final_accuracy:.3f})",
        }
    )  # fmt: skip


class Achieved(Strict):
    """edgetrain's own fine-tune of a row, run through the device workers as a user's job would
    run (the proxy's vector as the prior, the closed loop, and what earlier fine-tunes on the
    data left): what it achieved beside the row's computed methods (device s, simulated on a
    twin). `time_to_accuracy_s` is its device time per sample times its own N_b, as for
    `Verification.measured_time_s`; None where it did not reach the target."""

    device_type: str
    device_id: str
    power_cap_w: float | None
    target: str
    job_id: str | None = None
    reason: str | None = Field(None, description="why the fine-tune did not run, failed or did not reach the target")
    simulated: bool | None = None
    reached: bool = False
    configurations: list[str] = Field(default_factory=list, description="the (b, f) that ran, in order ('16 @ 921.6 MHz')")
    switches: list[str] = Field(default_factory=list, description="each change of configuration: its cause and note")
    evidence: str | None = Field(None, description="where the vector it started from came from (proxy, learned, closed loop)")
    device_time_s: float | None = Field(None, description="device time to the evaluation that stopped it")
    time_to_accuracy_s: float | None = None
    oracle_time_s: float | None = Field(None, description="the row's oracle: eq. (2) with the target's N_b (mean over seeds)")
    baseline1_time_s: float | None = None
    over_oracle_pct: float | None = None
    speedup_vs_baseline1: float | None = None


def achieved(row: EvaluationRow, device_id: str, run: RunReport | None, job_id: str | None = None,
             reason: str | None = None) -> Achieved:  # fmt: skip
    """What edgetrain's fine-tune `run` of `row` achieved (None: it did not run, `reason` says why)."""
    oracle = row.oracle.time_to_accuracy_s.mean if row.oracle.time_to_accuracy_s else None
    baseline1 = row.baseline1.time_to_accuracy_s.mean if row.baseline1.time_to_accuracy_s else None
    result = Achieved(device_type=row.device_type, device_id=device_id, power_cap_w=row.power_cap_w, target=row.target,
                      job_id=job_id, reason=reason, oracle_time_s=oracle, baseline1_time_s=baseline1)  # fmt: skip
    if run is None:
        return result
    n_b = run.samples_to_accuracy if run.reached else None
    measured = run.device_time_s / run.samples_processed * n_b if n_b is not None and run.samples_processed else None
    return result.model_copy(
        update={
            "simulated": run.simulated, "reached": run.reached, "device_time_s": run.device_time_s, "time_to_accuracy_s": measured,
            "configurations": [f"{c.batch_size} @ {c.frequency_hz / 1e6:g} MHz" for c in run.configurations],
            "switches": [s.line().strip() for s in run.switches],
            "evidence": run.learned.source if run.learned else "proxy",
            "over_oracle_pct": _pct(measured, oracle),
            "speedup_vs_baseline1": baseline1 / measured if baseline1 is not None and measured else None,
            "reason": reason if run.reached else reason or f"the fine-tune did not reach the target (accuracy {run.final_accuracy:.3f})",
        }
    )  # fmt: skip
