"""Selection of (batch size, GPU frequency) under a board power cap, as strategies.

A strategy chooses one configuration from a lookup table (T[b][f] in s for N_s samples,
peak P[b][f] in W) for a cap (W, None = no cap). The methods of docs/method.md:

- `Equation4`: C = {(b, f*_b) : b in B, b <= b_mem, f*_b = max{f : P[b][f] <= cap}},
  select argmin over C of T[b][f*_b] * r_b. Peak power grows with frequency, so f*_b is a
  binary search over the sorted frequencies of each row: O(|B| log |F|).
- `Robust` (edgetrain's default): equation (4)'s choice where its predicted gain over the
  largest batch exceeds the uncertainty of the proxy's r_b, else the largest batch at its f*,
  so a poor proxy does not make it much slower than Baseline 1.
- `Oracle`: equation (4) with r_b measured on the target data instead of the proxy.
- `Baseline1` (state of practice): the largest batch that fits in memory, at the highest
  frequency whose model-agnostic full-load power stays under the cap.
- `Baseline2`: Baseline 1's frequency, and the batch size that minimises T[b][f] * r_b there.
- Other objectives, over every measured (b, f) under the cap: `Energy` (energy to accuracy,
  E[b][f] * r_b), `ZeusCost` (zeus's eta * energy + (1 - eta) * max_power * time) and
  `TimeWithinEnergyBudget` (the fastest whose energy to accuracy fits a budget).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from typing_extensions import override

from .schemas import FixedConfiguration, Objective, ProfileTable, RelationVector, Selection


class SelectionError(ValueError):
    """No configuration can be selected; the message says why."""


class InfeasibleCapError(SelectionError):
    """No measured configuration meets the power cap."""

    PHRASE = "is below what any configuration needs"

    def __init__(self, power_cap_w: float, lowest_cap_w: float | None):
        self.power_cap_w = power_cap_w
        self.lowest_cap_w = lowest_cap_w
        need = f"the lowest cap that would work is {lowest_cap_w:.2f} W" if lowest_cap_w else "no configuration was measured"
        super().__init__(f"power cap {power_cap_w:.2f} W {self.PHRASE}: {need}")

    @classmethod
    def describes(cls, reason: str | None) -> bool:
        """Whether `reason` (a failed part's) is this error's message: its cap was too low."""
        return reason is not None and reason.startswith("power cap ") and cls.PHRASE in reason


def highest_feasible_index(row: list[float | None], power_cap_w: float | None) -> int | None:
    """Index of the highest frequency whose measured peak power (W) is <= the cap (binary search).

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
        if row[measured[mid]] <= power_cap_w:  # type: ignore[operator]  # measured: not None
            lo = mid + 1
        else:
            hi = mid
    return measured[lo - 1] if lo else None


def allowed_batch_sizes(table: ProfileTable, vector: RelationVector) -> list[int]:
    """Batch sizes within the memory limit b_mem that have a finite ratio in the vector."""
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


def envelope_index(table: ProfileTable, power_cap_w: float | None, power_envelope_w: list[float] | None) -> int:
    """Baseline 1's frequency index: the highest frequency whose model-agnostic full-load power
    (W, one value per table frequency) is under the cap; without an envelope the table's
    worst row stands in for it. InfeasibleCapError when even the lowest frequency is over."""
    if power_envelope_w is None:
        power_envelope_w = [
            max((p for row in table.peak_power_w if (p := row[j]) is not None), default=math.inf) for j in range(len(table.frequencies_hz))
        ]
    j = highest_feasible_index(list(power_envelope_w), power_cap_w)
    if j is None:
        assert power_cap_w is not None  # without a cap the highest frequency is feasible
        raise InfeasibleCapError(power_cap_w, min(power_envelope_w))
    return j


def _selection(strategy: str, table: ProfileTable, vector: RelationVector, i: int, j: int) -> Selection:
    time_s, ratio = table.time_s[i][j], vector.ratio(table.batch_sizes[i])
    assert time_s is not None and ratio is not None, "only measured points of uncensored batch sizes are selected"
    return Selection(
        strategy=strategy,
        batch_size=table.batch_sizes[i],
        frequency_hz=table.frequencies_hz[j],
        estimated_time_s=time_s * ratio,
        peak_power_w=table.peak_power_w[i][j],
    )


class Strategy(ABC):
    """Chooses (batch size, frequency) from a lookup table under a board power cap (W)."""

    name: ClassVar[str]

    @abstractmethod
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        """The configuration, or SelectionError (InfeasibleCapError for a cap too low) why none."""


def _nothing_selectable(table: ProfileTable, vector: RelationVector, power_cap_w: float | None, unmeasured: str) -> SelectionError:
    """Why no point could be selected: the cap (with the lowest that would work), or, without
    a cap, `unmeasured`."""
    if power_cap_w is None:
        return SelectionError(unmeasured)
    return InfeasibleCapError(power_cap_w, lowest_feasible_cap_w(table, vector))


def feasible_set(strategy: str, table: ProfileTable, vector: RelationVector, power_cap_w: float | None) -> list[Selection]:
    """C of equation (4): per allowed batch size, its highest frequency under the cap, with
    T[b][f*_b] * r_b as the estimate. SelectionError (InfeasibleCapError for a cap too low)
    when C is empty."""
    candidates = allowed_batch_sizes(table, vector)
    if not candidates:
        if all(r is None for r in vector.ratios):
            raise SelectionError(
                f"the proxy never reached the target accuracy at any batch size {vector.batch_sizes} within the job's "
                "max_samples, so there is no relation vector to choose with: lower the proxy's target (proxy_target_accuracy, "
                "else target_accuracy), raise max_samples, "
                "or choose a proxy closer to the target data"
            )
        raise SelectionError(
            "no batch size is both in the lookup table (within its memory limit "
            f"b_mem={table.max_batch_size}) and in the relation vector with a finite ratio: "
            f"table {table.batch_sizes}, vector {vector.batch_sizes}"
        )
    feasible = []
    for b in candidates:
        i = table.batch_sizes.index(b)
        j = highest_feasible_index(table.peak_power_w[i], power_cap_w)
        if j is not None and table.time_s[i][j] is not None:
            feasible.append(_selection(strategy, table, vector, i, j))
    if not feasible:
        raise _nothing_selectable(table, vector, power_cap_w, f"no configuration of batch sizes {candidates} was measured")
    return feasible


@dataclass(frozen=True)
class Equation4(Strategy):
    """Equation (4): argmin over C of T[b][f*_b] * r_b, with the proxy's relation vector."""

    vector: RelationVector
    name: ClassVar[str] = "equation4"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        return min(feasible_set(self.name, table, self.vector, power_cap_w), key=lambda s: s.estimated_time_s)


@dataclass(frozen=True)
class Robust(Strategy):
    """Edgetrain's default: equation (4)'s choice only where its predicted gain over the
    largest batch is larger than the uncertainty of the proxy's r_b; otherwise the largest
    batch (the reference, r = 1) at its highest frequency under the cap.

    The reference is never slower than Baseline 1, which runs the same batch at a frequency
    at most as high, so a poor proxy costs at most the gain it wrongly predicted beyond the
    uncertainty. The relative uncertainty of r_b = N_b / N_ref combines the relative standard
    deviations over seeds of N_b and N_ref (in quadrature), and is at least `margin` for what
    seeds cannot show: how the proxy's data differ from the device's."""

    vector: RelationVector
    margin: float = 0.05
    name: ClassVar[str] = "edgetrain"

    def uncertainty(self, batch_size: int, reference: int) -> float:
        """The relative uncertainty of N_b / N_reference (0 when they are the same batch)."""
        if batch_size == reference:
            return 0.0
        cv = [
            (std / mean) if (mean := self.vector.samples_for(b)) and (std := self.vector.samples_std_for(b)) else 0.0
            for b in (batch_size, reference)
        ]
        return max(self.margin, math.hypot(*cv))

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        feasible = feasible_set(self.name, table, self.vector, power_cap_w)
        best = min(feasible, key=lambda s: s.estimated_time_s)
        reference = max(feasible, key=lambda s: s.batch_size)
        if best == reference:
            return best
        gain = 1 - best.estimated_time_s / reference.estimated_time_s
        noise = self.uncertainty(best.batch_size, reference.batch_size)
        if best.estimated_time_s * (1 + noise) < reference.estimated_time_s:
            note = f"chose b={best.batch_size}: gain {gain:.0%} over b={reference.batch_size} beyond uncertainty {noise:.0%}"
            return best.model_copy(update={"note": note})
        note = f"kept b={reference.batch_size}: b={best.batch_size}'s gain {gain:.0%} within uncertainty {noise:.0%}"
        return reference.model_copy(update={"note": note})


@dataclass(frozen=True)
class Oracle(Equation4):
    """Equation (4) with N_b measured on the target data: the best choice the table allows
    (no uncertainty: the target's own N_b)."""

    name: ClassVar[str] = "oracle"


@dataclass(frozen=True)
class Baseline1(Strategy):
    """The largest batch that fits in memory at the model-agnostic frequency for the cap.

    `vector` only marks censored batch sizes and gives the estimate T * r_b."""

    vector: RelationVector
    power_envelope_w: list[float] | None
    name: ClassVar[str] = "baseline1"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        candidates = allowed_batch_sizes(table, self.vector)
        if not candidates:
            raise SelectionError("Baseline 1: no batch size fits in memory")
        i = table.batch_sizes.index(candidates[-1])
        j = envelope_index(table, power_cap_w, self.power_envelope_w)
        if table.time_s[i][j] is None:
            raise SelectionError(f"Baseline 1: T[{candidates[-1]}][{table.frequencies_hz[j]}] was not measured")
        choice = _selection(self.name, table, self.vector, i, j)
        if table.peak_power_w[i][j] is None and self.power_envelope_w is not None:
            choice = choice.model_copy(update={"peak_power_w": self.power_envelope_w[j]})
        return choice


@dataclass(frozen=True)
class Baseline2(Strategy):
    """Baseline 1's frequency, and the batch size minimising T[b][f] * r_b (proxy time to
    accuracy) at that frequency: the batch size is tuned, the frequency is not."""

    vector: RelationVector
    power_envelope_w: list[float] | None
    name: ClassVar[str] = "baseline2"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        j = envelope_index(table, power_cap_w, self.power_envelope_w)
        options = [
            _selection(self.name, table, self.vector, table.batch_sizes.index(b), j)
            for b in allowed_batch_sizes(table, self.vector)
            if table.time_s[table.batch_sizes.index(b)][j] is not None
        ]
        if not options:
            raise SelectionError(f"Baseline 2: no batch size was measured at {table.frequencies_hz[j]} Hz")
        return min(options, key=lambda s: s.estimated_time_s)


def measured_points(strategy: str, table: ProfileTable, vector: RelationVector, power_cap_w: float | None) -> list[Selection]:
    """Every measured (b, f) of an allowed batch size whose peak power (W) is under the cap,
    with T * r_b and E * r_b as estimates: what the energy objectives search (their best f is
    not the highest under the cap). SelectionError without energy in the table;
    InfeasibleCapError when no point meets the cap."""
    if table.energy_j is None:
        raise SelectionError(f"objective {strategy!r} needs the energy E[b][f] of the lookup table, which has none: profile again")
    found = []
    for b in allowed_batch_sizes(table, vector):
        i = table.batch_sizes.index(b)
        for j, (time_s, power_w, energy_j) in enumerate(zip(table.time_s[i], table.peak_power_w[i], table.energy_j[i])):
            if time_s is None or power_w is None or energy_j is None or power_cap_w is not None and power_w > power_cap_w:
                continue
            choice = _selection(strategy, table, vector, i, j)
            found.append(choice.model_copy(update={"estimated_energy_j": energy_j * (vector.ratio(b) or math.inf)}))
    if not found:
        raise _nothing_selectable(table, vector, power_cap_w,
                                  f"objective {strategy!r}: no configuration with time, power and energy was measured")  # fmt: skip
    return found


@dataclass(frozen=True)
class Energy(Strategy):
    """Energy to accuracy: argmin over every measured (b, f) under the cap of E[b][f] * r_b."""

    vector: RelationVector
    name: ClassVar[str] = "energy"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        return min(measured_points(self.name, table, self.vector, power_cap_w), key=_energy)


@dataclass(frozen=True)
class ZeusCost(Strategy):
    """Zeus's cost: argmin of eta * E[b][f] * r_b + (1 - eta) * max_power * T[b][f] * r_b
    (J), max_power the highest peak power of the table (W), over every (b, f) under the cap."""

    vector: RelationVector
    eta: float
    name: ClassVar[str] = "zeus"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        max_power_w = max(p for row in table.peak_power_w for p in row if p is not None)
        return min(
            measured_points(self.name, table, self.vector, power_cap_w),
            key=lambda s: self.eta * _energy(s) + (1 - self.eta) * max_power_w * s.estimated_time_s,
        )


@dataclass(frozen=True)
class TimeWithinEnergyBudget(Strategy):
    """The fastest (least T[b][f] * r_b) of the (b, f) under the cap whose estimated energy
    to accuracy E[b][f] * N_b / N_s is at most `energy_budget_j` (J); SelectionError naming
    the least energy needed when none is."""

    vector: RelationVector
    energy_budget_j: float
    name: ClassVar[str] = "time_within_energy_budget"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        points = measured_points(self.name, table, self.vector, power_cap_w)
        costs = [(s, estimated_energy_to_accuracy_j(table, self.vector, s)) for s in points]
        within = [s for s, energy_j in costs if energy_j <= self.energy_budget_j]
        if not within:
            least = min(energy_j for _, energy_j in costs)
            raise SelectionError(
                f"objective.energy_budget_j: no configuration under the cap reaches the target within "
                f"{self.energy_budget_j:g} J; the least estimated energy is {least:.4g} J"
            )
        return min(within, key=lambda s: s.estimated_time_s)


def estimated_energy_to_accuracy_j(table: ProfileTable, vector: RelationVector, choice: Selection) -> float:
    """E_Ns(b, f) * N_b / N_s (J) with the vector's N_b; infinite without N_b or E."""
    n_b = vector.samples_for(choice.batch_size)
    i, j = table.batch_sizes.index(choice.batch_size), table.frequencies_hz.index(choice.frequency_hz)
    energy_j = table.energy_j[i][j] if table.energy_j else None
    return math.inf if n_b is None or energy_j is None else energy_j * n_b / table.samples


def _energy(choice: Selection) -> float:
    assert choice.estimated_energy_j is not None, "measured_points sets the energy estimate"
    return choice.estimated_energy_j


def estimated_time_to_accuracy_s(table: ProfileTable, vector: RelationVector, choice: Selection) -> float | None:
    """Equation (2): T_Ns(b, f) * N_b / N_s (s) with the vector's N_b; None without N_b."""
    n_b = vector.samples_for(choice.batch_size)
    if n_b is None:
        return None
    time_s = table.time_s[table.batch_sizes.index(choice.batch_size)][table.frequencies_hz.index(choice.frequency_hz)]
    return None if time_s is None else time_s * n_b / table.samples


@dataclass(frozen=True)
class Fixed(Strategy):
    """A given (batch size, frequency), checked against the table: a row and a column of it,
    within b_mem, measured, with a finite r_b in `vector` (which gives the estimate T * r_b),
    and with a measured peak power under the cap."""

    vector: RelationVector
    batch_size: int
    frequency_hz: int
    name: ClassVar[str] = "fixed"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        b, f = self.batch_size, self.frequency_hz
        where = f"configuration b={b} at {f / 1e6:g} MHz"
        if b not in table.batch_sizes:
            raise SelectionError(f"{where}: batch size {b} is not a row of the lookup table {table.batch_sizes}")
        if f not in table.frequencies_hz:
            raise SelectionError(f"{where}: {f} Hz is not one of the device's frequencies {table.frequencies_hz}")
        if b > (table.max_batch_size or math.inf):
            raise SelectionError(f"{where}: batch size {b} does not fit in memory (b_mem={table.max_batch_size})")
        i, j = table.batch_sizes.index(b), table.frequencies_hz.index(f)
        if table.time_s[i][j] is None:
            raise SelectionError(f"{where}: this point of the lookup table was not measured")
        if self.vector.ratio(b) is None:
            raise SelectionError(f"{where}: batch size {b} never reached the target accuracy in the relation vector (censored)")
        power_w = table.peak_power_w[i][j]
        if power_cap_w is not None and (power_w is None or power_w > power_cap_w):
            peak = "an unmeasured peak power" if power_w is None else f"a peak power of {power_w:.2f} W"
            raise SelectionError(f"{where}: {peak} in the lookup table, over the power cap of {power_cap_w:g} W")
        return _selection(self.name, table, self.vector, i, j)


def strategy_for(
    objective: Objective | str, vector: RelationVector, fixed: FixedConfiguration | None = None,
    power_envelope_w: list[float] | None = None,
) -> Strategy:  # fmt: skip
    """The one place a job or a round names its selection: `fixed` (a configuration the job
    names) when given; else a job's `objective` (time: edgetrain's robust equation (4); energy;
    zeus's cost; time within an energy budget), or a federated round's method (`baseline1`: the
    largest batch at the cap's model-agnostic frequency, from `power_envelope_w`; `equation4` or
    `edgetrain`: equation (4))."""
    if fixed is not None:
        return Fixed(vector, fixed.batch_size, fixed.frequency_hz)
    if isinstance(objective, str):
        return Baseline1(vector, power_envelope_w) if objective == "baseline1" else Equation4(vector)
    if objective.name == "energy":
        return Energy(vector)
    if objective.name == "zeus":
        return ZeusCost(vector, objective.eta)
    if objective.name == "time_within_energy_budget":
        assert objective.energy_budget_j is not None, "the spec requires the budget with this objective"
        return TimeWithinEnergyBudget(vector, objective.energy_budget_j)
    return Robust(vector)
