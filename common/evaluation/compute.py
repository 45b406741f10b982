"""The evaluation's arithmetic, pure: every method's choice on a device type's lookup table
under a cap, and its time and energy to the target accuracy.

Time to accuracy is equation (2) with the target's measured N_b: T[b][f] / N_s * N_b(target)
(s), and energy E[b][f] / N_s * N_b(target) (J); the standard deviation is that of N_b over
seeds, scaled the same way. The methods:

- `baseline1`: the largest batch that fits in memory at the model-agnostic frequency for the
  cap (no proxy: it does not depend on any relation vector);
- `baseline2`: Baseline 1's frequency and the batch size with the least proxy time to accuracy;
- `equation4`: equation (4) with the proxy's relation vector, as the paper has it;
- `edgetrain`: `Robust`, equation (4)'s choice only where its gain over the largest batch
  exceeds the uncertainty of the proxy's r_b;
- `energy`: the energy objective, argmin of E[b][f] * r_b over every (b, f) under the cap,
  with the proxy's relation vector;
- `oracle`: equation (4) with the target's own N_b.
"""

from __future__ import annotations

from ..schemas import ProfileTable, RelationVector, Selection
from ..selection import (
    Baseline1,
    Baseline2,
    Energy,
    Equation4,
    Oracle,
    Robust,
    SelectionError,
    Strategy,
)
from .results import (
    DeviceProfile,
    EvaluationReport,
    EvaluationRow,
    MeanStd,
    MethodResult,
    Robustness,
    SensitivityMatrix,
)

OVER = 1.05  # a cell's time over Baseline 1's above which edgetrain counts as worse than the state of practice
KEPT = 0.90  # the share of equation (4)'s speed-up that edgetrain must keep where the proxy is good


def baseline1(device: DeviceProfile) -> Baseline1:
    """Baseline 1 knows no relation vector: every batch size counts (r_b = 1), none is censored."""
    return Baseline1(RelationVector.uniform(device.table.batch_sizes), device.power_envelope_w)


def strategies(device: DeviceProfile, proxy: RelationVector, target: RelationVector) -> dict[str, Strategy]:
    """The methods, by their names in the report (METHODS)."""
    return {
        "baseline1": baseline1(device),
        "baseline2": Baseline2(proxy, device.power_envelope_w),
        "equation4": Equation4(proxy),
        "edgetrain": Robust(proxy),
        "energy": Energy(proxy),
        "oracle": Oracle(target),
    }


def choose(strategy: Strategy, table: ProfileTable, power_cap_w: float | None) -> tuple[Selection | None, str | None]:
    """The strategy's configuration, or None and the reason it has none."""
    try:
        return strategy.choose(table, power_cap_w), None
    except SelectionError as exc:
        return None, str(exc)


def _point(table: ProfileTable, values: list[list[float | None]] | None, choice: Selection) -> float | None:
    if values is None:
        return None
    return values[table.batch_sizes.index(choice.batch_size)][table.frequencies_hz.index(choice.frequency_hz)]


def _to_accuracy(per_samples: float | None, samples: int, n_mean: float, n_std: float) -> MeanStd | None:
    """A table value for N_s samples scaled to N_b samples, mean and std over seeds."""
    if per_samples is None:
        return None
    return MeanStd(mean=per_samples / samples * n_mean, std=per_samples / samples * n_std)


def method_result(table: ProfileTable, choice: Selection | None, target: RelationVector) -> MethodResult:
    """Time (s) and energy (J) to the target accuracy of `choice`, from the table and the
    target's N_b (std 0 when the vector records none); not reached when there is no choice or
    its batch size is censored on the target. Energy is None when the table has none."""
    if choice is None:
        return MethodResult(batch_size=None, frequency_hz=None, time_to_accuracy_s=None, energy_j=None, reached=False)
    n_mean = target.samples_for(choice.batch_size)
    if n_mean is None:
        return MethodResult(
            batch_size=choice.batch_size, frequency_hz=choice.frequency_hz, time_to_accuracy_s=None, energy_j=None, reached=False
        )
    n_std = target.samples_std_for(choice.batch_size) or 0.0
    return MethodResult(
        batch_size=choice.batch_size,
        frequency_hz=choice.frequency_hz,
        time_to_accuracy_s=_to_accuracy(_point(table, table.time_s, choice), table.samples, n_mean, n_std),
        energy_j=_to_accuracy(_point(table, table.energy_j, choice), table.samples, n_mean, n_std),
        reached=True,
    )


def _mean_time_s(result: MethodResult) -> float | None:
    return result.time_to_accuracy_s.mean if result.reached and result.time_to_accuracy_s else None


def speedup(baseline: MethodResult, method: MethodResult) -> float | None:
    """The baseline's mean time to accuracy over the method's; None unless both reach it."""
    slow, fast = _mean_time_s(baseline), _mean_time_s(method)
    return slow / fast if slow is not None and fast else None


def over_oracle_pct(method: MethodResult, oracle: MethodResult) -> float | None:
    """How much longer than the oracle the method takes to the target (%); None unless both reach it."""
    ratio = speedup(method, oracle)
    return None if ratio is None else (ratio - 1.0) * 100.0


def _cap_text(power_cap_w: float | None) -> str:
    return "no cap" if power_cap_w is None else f"cap {power_cap_w:g} W"


def _notes(where: str, name: str, table: ProfileTable, choice: Selection | None, why: str | None,
           power_cap_w: float | None, target_label: str, target: RelationVector) -> list[str]:  # fmt: skip
    """Why a method reaches nothing, or a configuration the table says is over the cap."""
    if choice is None:
        return [f"{where}: {name} has no configuration: {why}"]
    notes = []
    power_w = _point(table, table.peak_power_w, choice)
    if power_cap_w is not None and power_w is not None and power_w > power_cap_w:
        notes.append(
            f"{where}: {name} runs b={choice.batch_size} at {choice.frequency_hz / 1e6:g} MHz, which peaks at "
            f"{power_w:.2f} W in the table, over the cap: the model-agnostic power envelope understates this model"
        )
    if target.samples_for(choice.batch_size) is None:
        notes.append(f"{where}: {name} chose b={choice.batch_size}, which never reaches {target_label}'s target (censored)")
    return notes


def evaluation_row(
    device: DeviceProfile,
    power_cap_w: float | None,
    proxy: tuple[str, RelationVector],
    target: tuple[str, RelationVector],
) -> tuple[EvaluationRow, list[str]]:
    """Every method on one (device type, cap, target), and notes on what they could not do."""
    (proxy_label, proxy_vector), (target_label, target_vector) = proxy, target
    where = f"{device.device_type}, {_cap_text(power_cap_w)}, {target_label}"
    results: dict[str, MethodResult] = {}
    notes: list[str] = []
    for name, strategy in strategies(device, proxy_vector, target_vector).items():
        choice, why = choose(strategy, device.table, power_cap_w)
        notes += _notes(where, name, device.table, choice, why, power_cap_w, target_label, target_vector)
        results[name] = method_result(device.table, choice, target_vector)
    row = EvaluationRow(
        device_type=device.device_type,
        power_cap_w=power_cap_w,
        target=target_label,
        proxy=proxy_label,
        simulated=device.table.simulated,
        **results,
        speedup_vs_baseline1=speedup(results["baseline1"], results["edgetrain"]),
        speedup_vs_baseline2=speedup(results["baseline2"], results["edgetrain"]),
        gap_to_oracle_pct=over_oracle_pct(results["edgetrain"], results["oracle"]),
    )
    return row, notes


def sensitivity_matrix(device: DeviceProfile, power_cap_w: float | None, vectors: dict[str, RelationVector]) -> SensitivityMatrix:
    """Every dataset of `vectors` as the proxy for every one as the target (see SensitivityMatrix)."""
    labels = list(vectors)

    def result(strategy: Strategy, target: RelationVector) -> MethodResult:
        return method_result(device.table, choose(strategy, device.table, power_cap_w)[0], target)

    edgetrain_pct: list[list[float | None]] = [[] for _ in labels]
    equation4_pct: list[list[float | None]] = [[] for _ in labels]
    baseline1_pct: list[float | None] = []
    for target in vectors.values():
        oracle = result(Oracle(target), target)
        baseline1_pct.append(over_oracle_pct(result(baseline1(device), target), oracle))
        for robust_row, plain_row, proxy in zip(edgetrain_pct, equation4_pct, vectors.values()):
            robust_row.append(over_oracle_pct(result(Robust(proxy), target), oracle))
            plain_row.append(over_oracle_pct(result(Equation4(proxy), target), oracle))
    return SensitivityMatrix(
        device_type=device.device_type,
        power_cap_w=power_cap_w,
        simulated=device.table.simulated,
        datasets=labels,
        edgetrain_over_oracle_pct=edgetrain_pct,
        equation4_over_oracle_pct=equation4_pct,
        baseline1_over_oracle_pct=baseline1_pct,
    )


def _ratio_to_baseline1(method_pct: float | None, baseline1_pct: float | None) -> float | None:
    """A method's time over Baseline 1's, from both of their % over the oracle."""
    if method_pct is None or baseline1_pct is None:
        return None
    return (1 + method_pct / 100) / (1 + baseline1_pct / 100)


def robustness(matrices: list[SensitivityMatrix]) -> Robustness:
    """edgetrain and plain equation (4) against Baseline 1 over every cell (see Robustness)."""
    cells = 0
    worst: dict[str, float | None] = {"edgetrain": None, "equation4": None}
    over: dict[str, list[str]] = {"edgetrain": [], "equation4": []}
    kept: list[float] = []
    below: list[str] = []
    for m in matrices:
        for p, proxy in enumerate(m.datasets):
            for t, target in enumerate(m.datasets):
                b1 = m.baseline1_over_oracle_pct[t]
                robust = _ratio_to_baseline1(m.edgetrain_over_oracle_pct[p][t], b1)
                plain = _ratio_to_baseline1(m.equation4_over_oracle_pct[p][t], b1)
                if robust is None or plain is None:
                    continue
                cells += 1
                where = f"{m.device_type}, {_cap_text(m.power_cap_w)}, proxy {proxy} -> {target}"
                for name, ratio in (("edgetrain", robust), ("equation4", plain)):
                    worst[name] = max(ratio, worst[name] or ratio)
                    if ratio > OVER:
                        over[name].append(f"{where}: {ratio:.2f}x Baseline 1's time")
                if plain < 1:
                    kept.append(plain / robust)
                    if kept[-1] < KEPT:
                        below.append(f"{where}: keeps {kept[-1]:.0%} ({1 / robust:.2f}x vs {1 / plain:.2f}x)")
    return Robustness(
        cells=cells, edgetrain_worst=worst["edgetrain"], equation4_worst=worst["equation4"],
        edgetrain_over=over["edgetrain"], equation4_over=over["equation4"],
        speedup_cells=len(kept), kept_least=min(kept, default=None), kept_below_90pct=below,
    )  # fmt: skip


def evaluate(devices: list[DeviceProfile], vectors: dict[str, RelationVector], proxy: str, targets: list[str]) -> EvaluationReport:
    """Rows for every (device type, cap, target) with `proxy`'s vector, and the sensitivity
    matrix over the proxy and the targets for every (device type, cap). `vectors` maps each
    dataset label to its relation vector, which must record N_b (`samples_mean`)."""
    labels = [proxy] + [t for t in targets if t != proxy]
    for label in labels:
        if label not in vectors:
            raise ValueError(f"no relation vector for {label!r}: have {sorted(vectors)}")
        if vectors[label].samples_mean is None:
            raise ValueError(f"the relation vector for {label!r} records no N_b (samples_mean): time to accuracy needs them")
    rows: list[EvaluationRow] = []
    notes: list[str] = []
    sensitivity: list[SensitivityMatrix] = []
    for device in devices:
        for cap in device.power_caps_w:
            for target in targets:
                row, row_notes = evaluation_row(device, cap, (proxy, vectors[proxy]), (target, vectors[target]))
                rows.append(row)
                notes += row_notes
            sensitivity.append(sensitivity_matrix(device, cap, {label: vectors[label] for label in labels}))
    return EvaluationReport(rows=rows, sensitivity=sensitivity, robustness=robustness(sensitivity), notes=notes)
