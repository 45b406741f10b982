"""Lookup tables and relation vectors for tests: random monotone tables and selection by
brute force, to check the binary-search selection and the profilers against."""

from __future__ import annotations

import random

from edgetrain.common.schemas import ProfileTable, RelationVector

B = [4, 8, 16, 32, 64, 128]  # batch sizes of the random tables
F = [100, 200, 300, 400, 500, 600, 700, 800]  # their frequencies (Hz)


def random_monotone_table(rng: random.Random, holes: float = 0.0, time_noise: bool = True) -> ProfileTable:
    """Power rises with b and f; time falls with f (exactly as 1/f without `time_noise`, else
    with a random factor per point); some points unmeasured (None)."""
    steps = [rng.uniform(0.2, 0.6) for _ in B]
    coef = [sum(steps[: i + 1]) for i in range(len(B))]  # rises with the batch size
    power: list[list[float | None]] = [[2 + coef[i] * 0.3 * (j + 1) ** 1.3 for j in range(len(F))] for i in range(len(B))]
    time: list[list[float | None]]
    if time_noise:
        time = [[rng.uniform(1, 3) * 1000 / F[j] * (1 + 8 / b) for j in range(len(F))] for b in B]
    else:
        time = [[scale * 1000 / F[j] * (1 + 8 / b) for j in range(len(F))] for b, scale in ((b, rng.uniform(1, 3)) for b in B)]
    if holes:
        for row in (power, time):
            for r in row:
                for j in range(len(F)):
                    if rng.random() < holes:
                        r[j] = None
        for i in range(len(B)):  # a hole in time must be a hole in power too
            for j in range(len(F)):
                if time[i][j] is None:
                    power[i][j] = None
    return ProfileTable(batch_sizes=B, frequencies_hz=F, samples=1000, time_s=time, peak_power_w=power)


def brute_force(table: ProfileTable, vector: RelationVector, cap: float | None) -> tuple[float, int, int] | None:
    """Equation (4) by linear scans: for each b the highest feasible f, then the argmin;
    (objective, batch size, frequency) or None when nothing is feasible."""
    best: tuple[float, int, int] | None = None
    for i, b in enumerate(table.batch_sizes):
        if table.max_batch_size and b > table.max_batch_size or vector.ratio(b) is None:
            continue
        feasible = [j for j, p in enumerate(table.peak_power_w[i]) if p is not None and (cap is None or p <= cap)]
        if not feasible:
            continue
        j = max(feasible)
        value = table.time_s[i][j] * vector.ratio(b)  # type: ignore[operator]
        if best is None or value < best[0]:
            best = (value, b, table.frequencies_hz[j])
    return best
