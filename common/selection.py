"""Selection of (batch size, GPU frequency): METHOD.md equation (4) and Baseline 1.

    C = {(b, f*_b) : b in B, b <= b_mem, f*_b = max{f in F : P[b][f] <= P_max}}
    select argmin over C of T[b][f] * r_b

Peak power grows with frequency, so f*_b is found by binary search over the sorted
frequencies of each row: O(|B| log |F|).
"""

from __future__ import annotations

import math

from .schemas import ProfileTable, RelationVector, Selection


class SelectionError(ValueError):
    """No configuration can be selected; the message says why."""


class InfeasibleCapError(SelectionError):
    """No measured configuration meets the power cap."""

    def __init__(self, power_cap_w: float, lowest_cap_w: float | None):
        self.power_cap_w = power_cap_w
        self.lowest_cap_w = lowest_cap_w
        need = f"the lowest cap that would work is {lowest_cap_w:.2f} W" if lowest_cap_w else "no configuration was measured"
        super().__init__(f"power cap {power_cap_w:.2f} W is below what any configuration needs: {need}")


def highest_feasible_index(row: list[float | None], power_cap_w: float | None) -> int | None:
    """Index of the highest frequency whose measured peak power is <= the cap (binary search).

    Unmeasured points (None) are skipped; the measured ones are assumed non-decreasing in f.
    """
    measured = [i for i, p in enumerate(row) if p is not None]
    if not measured:
        return None
    if power_cap_w is None:
        return measured[-1]
    lo, hi = 0, len(measured)  # invariant: measured[:lo] feasible, measured[hi:] infeasible
    while lo < hi:
        mid = (lo + hi) // 2
        if row[measured[mid]] <= power_cap_w:
            lo = mid + 1
        else:
            hi = mid
    return measured[lo - 1] if lo else None


def _allowed_batch_sizes(table: ProfileTable, vector: RelationVector) -> list[int]:
    limit = table.max_batch_size or math.inf
    return [b for b in table.batch_sizes if b <= limit and vector.ratio(b) is not None]


def lowest_feasible_cap_w(table: ProfileTable, vector: RelationVector | None = None) -> float | None:
    """The smallest measured peak power over the allowed batch sizes (W)."""
    limit = table.max_batch_size or math.inf
    values = [
        p
        for b, row in zip(table.batch_sizes, table.peak_power_w)
        if b <= limit and (vector is None or vector.ratio(b) is not None)
        for p in row
        if p is not None
    ]
    return min(values) if values else None


def select(table: ProfileTable, vector: RelationVector, power_cap_w: float | None) -> Selection:
    """Equation (4). Raises InfeasibleCapError when C is empty because of the cap."""
    candidates = _allowed_batch_sizes(table, vector)
    if not candidates:
        raise SelectionError(
            "no batch size is both in the lookup table (within its memory limit "
            f"b_mem={table.max_batch_size}) and in the relation vector with a finite ratio: "
            f"table {table.batch_sizes}, vector {vector.batch_sizes}"
        )
    best: Selection | None = None
    for b in candidates:
        i = table.batch_sizes.index(b)
        j = highest_feasible_index(table.peak_power_w[i], power_cap_w)
        if j is None or table.time_s[i][j] is None:
            continue
        objective = table.time_s[i][j] * vector.ratio(b)
        if best is None or objective < best.estimated_time_s:
            best = Selection(
                batch_size=b,
                frequency_hz=table.frequencies_hz[j],
                estimated_time_s=objective,
                peak_power_w=table.peak_power_w[i][j],
            )
    if best is None:
        raise InfeasibleCapError(power_cap_w, lowest_feasible_cap_w(table, vector))
    return best


def baseline1(
    table: ProfileTable,
    vector: RelationVector,
    power_cap_w: float | None,
    power_envelope_w: list[float] | None,
) -> Selection:
    """Baseline 1: the largest batch that fits in memory, at the highest frequency whose
    model-agnostic full-load power (`power_envelope_w`, one value per table frequency) stays
    under the cap. Without an envelope the table's worst row stands in for it."""
    candidates = _allowed_batch_sizes(table, vector)
    if not candidates:
        raise SelectionError("Baseline 1: no batch size fits in memory")
    b = candidates[-1]
    i = table.batch_sizes.index(b)
    if power_envelope_w is None:
        power_envelope_w = [
            max((row[j] for row in table.peak_power_w if row[j] is not None), default=math.inf)
            for j in range(len(table.frequencies_hz))
        ]
    j = highest_feasible_index(list(power_envelope_w), power_cap_w)
    if j is None:
        raise InfeasibleCapError(power_cap_w, min(power_envelope_w))
    time_s = table.time_s[i][j]
    if time_s is None:
        raise SelectionError(f"Baseline 1: T[{b}][{table.frequencies_hz[j]}] was not measured")
    return Selection(
        batch_size=b,
        frequency_hz=table.frequencies_hz[j],
        estimated_time_s=time_s * vector.ratio(b),
        peak_power_w=table.peak_power_w[i][j] if table.peak_power_w[i][j] is not None else power_envelope_w[j],
    )


def estimated_time_to_accuracy_s(table: ProfileTable, vector: RelationVector, choice: Selection) -> float | None:
    """Equation (2) with the proxy's N_b: T_Ns(b, f) * N_b / N_s (s), None without N_b."""
    n_b = vector.samples_for(choice.batch_size)
    if n_b is None:
        return None
    i = table.batch_sizes.index(choice.batch_size)
    j = table.frequencies_hz.index(choice.frequency_hz)
    return table.time_s[i][j] * n_b / table.samples
