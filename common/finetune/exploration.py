"""Choosing a batch size on data the fleet knows little about: run what the belief says is
fastest among the choices that are safe against Baseline 1, and explore a batch size that may
be faster still when what a job may lose by it is within a budget.

The choice of a batch size on one data (model, weights, data identity, target) is a sequence
of decisions across jobs and across the devices of one job. Each decision sees the fleet's
belief (common/finetune/belief.py: N_b measured, bounded by measured neighbours, or the proxy's) and the
device's lookup table under its cap, which gives every candidate's device time per sample
t_b = T[b][f*_b] / N_s. Then, with N_b on the belief's scale:

- **Safe**: a candidate whose worst case is at most `bound` over Baseline 1's time, where the
  worst case is t_b * N_b at the top of its interval relative to N_{b_max}, never above 1
  (N_b grows with b, so no batch needs more samples than the largest): Baseline 1 runs b_max
  at a frequency at most f*, so t_b <= (1 + bound) * t_Baseline1 is safe whatever r_b is, and
  under a cap that forces Baseline 1's clock down most candidates are.
- **Exploit**: the safe candidate with the least expected time t_b * N_b.
- **Explore**: a batch size no run on this data measured, whose optimistic time (the fewest
  samples the data allows) beats the exploit choice by `min_gain`, run from the first sample
  so that its solo curve measures its N_b against a measured one (common/finetune/learned.py:
  warp matching) over `measure_evaluations` evaluations and at least `measure_share` of the
  exploit choice's expected samples: early in a run a small batch's test loss falls faster per
  sample than it goes on to, so a match of the first evaluations of a long run ranks small
  batches too well, and the exploration is compared only at the end of that window. It runs
  only while what it may cost the job
  stays inside `budget` of the exploit choice's expected time: samples run at it that turn out
  slower count at most (t_e - t_x * N_x / N_e,worst) each (a solo run's progress is the same
  test loss whatever the batch, so the samples are not lost, only their speed), plus one
  evaluation interval at the exploit choice for the switch; the loop gives it up when it is not
  measured in those samples, so the bound covers all it may run. Without a measured batch size to
  match it against, a candidate is explored only when its whole worst case fits the budget.
  Once measured, the loop keeps the faster of it and the exploit choice (common/finetune/closed_loop.py).
- **Spread**: a batch size that another run on this data trains solo now (its N_b is being
  measured: devices of the same job, or jobs at the same time) is not explored again; the next
  candidate is, within the same budget, so several devices measure several candidates at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from typing_extensions import override

from ..schemas import ProfileTable, Selection
from ..selection import Baseline1, SelectionError, Strategy, feasible_set
from .belief import Belief, Estimate

Role = Literal["exploit", "explore"]


@dataclass(frozen=True)
class Candidate:
    """A feasible (b, f*_b) with its device time per sample (s) and the belief's N_b."""

    selection: Selection
    per_sample_s: float
    estimate: Estimate

    @property
    def batch_size(self) -> int:
        """Its batch size."""
        return self.selection.batch_size

    @property
    def expected_s(self) -> float:
        """t_b * N_b at the belief's point (s on the belief's scale)."""
        return self.per_sample_s * self.estimate.samples

    @property
    def optimistic_s(self) -> float:
        """t_b * the fewest N_b the data allows."""
        return self.per_sample_s * self.estimate.optimistic


@dataclass(frozen=True)
class Choice:
    """What to run now: `selection` (its note says why), whether it exploits or explores, and for
    an exploration the samples by which its N_b should be measured against a measured batch size
    (the loop gives it up there, unmeasured) and the most it may cost the job in those samples
    (a fraction of the exploit choice's expected time)."""

    selection: Selection
    role: Role
    exploit: Selection
    measure_by_samples: int | None = None
    cost_bound: float = 0.0


def candidates(table: ProfileTable, power_cap_w: float | None, belief: Belief, name: str) -> list[Candidate]:
    """Every feasible (b, f*_b) under the cap that the belief has an estimate for."""
    template = belief.vector_like(table.batch_sizes)
    found = []
    for s in feasible_set(name, table, template, power_cap_w):
        time_s = table.time_s[table.batch_sizes.index(s.batch_size)][table.frequencies_hz.index(s.frequency_hz)]
        if time_s is not None and s.batch_size in belief.estimates:
            found.append(Candidate(s, time_s / table.samples, belief.estimates[s.batch_size]))
    return found


@dataclass(frozen=True)
class ExplorationPolicy:
    """How much a job may risk (see the module docstring): `bound` over Baseline 1's time in the
    worst case, `budget` of its expected time on exploring, a candidate explored only when it
    may win by `min_gain`, measured after `measure_evaluations` evaluations of its solo curve."""

    bound: float = 0.02
    budget: float = 0.03
    min_gain: float = 0.03
    measure_evaluations: int = 6
    measure_share: float = 0.15  # of the exploit choice's expected samples: an earlier match ranks small batches too well

    def measure_by(self, x: Candidate, eval_every_samples: int) -> int:
        """The samples an exploration runs before its N_b is compared with the exploit choice
        `x`'s: `measure_evaluations` evaluations, and at least `measure_share` of `x`'s
        expected samples (whole evaluation intervals)."""
        return max(self.measure_evaluations * eval_every_samples, self.share_samples(x.estimate.samples, eval_every_samples))

    def share_samples(self, expected_samples: float, eval_every_samples: int) -> int:
        """`measure_share` of `expected_samples`, in whole evaluation intervals: before it, a
        solo curve is not compared (for an exploration, and for a run's own first switch)."""
        return math.ceil(self.measure_share * expected_samples / eval_every_samples) * eval_every_samples

    def safe(self, c: Candidate, baseline1_per_sample_s: float, largest: Estimate) -> bool:
        """Whether `c`'s worst case is at most `bound` over Baseline 1's time."""
        ratio = min(1.0, c.estimate.high / largest.samples) if c.batch_size != largest.batch_size else 1.0
        return c.per_sample_s * ratio <= (1 + self.bound) * baseline1_per_sample_s

    def exploit(self, found: Sequence[Candidate], baseline1_per_sample_s: float) -> Candidate:
        """The safe candidate with the least expected time (the largest batch is always safe)."""
        largest = max(found, key=lambda c: c.batch_size)
        safe = [c for c in found if self.safe(c, baseline1_per_sample_s, largest.estimate)] or [largest]
        return min(safe, key=lambda c: c.expected_s)

    def choose(self, found: Sequence[Candidate], baseline1_per_sample_s: float, belief: Belief, eval_every_samples: int,
               explore: bool = True) -> Choice:  # fmt: skip
        """The exploit choice, or a batch size worth exploring within the budget (`explore`):
        not one that another run on this data measures now (`belief.measuring`), so the devices
        of a job, or jobs at the same time, measure different ones."""
        x = self.exploit(found, baseline1_per_sample_s)
        exploit = x.selection.model_copy(update={"note": _exploit_note(x)})
        if not explore:
            return Choice(exploit, "exploit", exploit)
        partners, elsewhere = belief.measured, belief.measuring
        for e in sorted(found, key=lambda c: c.optimistic_s):
            if e.batch_size in partners or e.batch_size in elsewhere or e.batch_size == x.batch_size:
                continue
            if e.optimistic_s >= x.expected_s * (1 - self.min_gain):
                continue
            samples = self.measure_by(x, eval_every_samples)
            if partners - {e.batch_size}:
                worst_progress = x.estimate.samples / e.estimate.high  # x's samples per sample at e, at e's worst N_b
                cost_s = samples * max(0.0, e.per_sample_s - x.per_sample_s * worst_progress) + eval_every_samples * x.per_sample_s
                measured_by: int | None = samples
            else:
                cost_s, measured_by = e.per_sample_s * e.estimate.high - x.expected_s, None
            cost = cost_s / x.expected_s
            if cost <= self.budget:
                note = _explore_note(e, x, cost, measured_by, partners, elsewhere)
                return Choice(e.selection.model_copy(update={"note": note}), "explore", exploit, measured_by, max(cost, 0.0))
        return Choice(exploit, "exploit", exploit)


def _exploit_note(x: Candidate) -> str:
    return f"b={x.batch_size}: the fastest expected that is safe against Baseline 1 ({x.estimate.describe()})"


def _explore_note(e: Candidate, x: Candidate, cost: float, measured_by: int | None, partners: frozenset[int],
                  elsewhere: Mapping[int, str]) -> str:  # fmt: skip
    gain = 1 - e.optimistic_s / x.expected_s
    how = (f"its solo curve is matched against b={sorted(partners - {e.batch_size})} by {measured_by} samples"
           if measured_by else "no run measured another batch size on this data")  # fmt: skip
    others = "".join(f"; b={b} is being measured by {r}" for b, r in sorted(elsewhere.items()))
    return (f"exploring b={e.batch_size}: it may be up to {gain:.0%} faster than b={x.batch_size} ({e.estimate.describe()}); "
            f"{how}; at most {cost:.1%} of the run's expected time at stake{others}")  # fmt: skip


@dataclass(frozen=True)
class Believed(Strategy):
    """The exploit choice on a belief (`ExplorationPolicy.exploit`), for every selection a run
    makes after its start (cap changes, the power guard's drift): the fastest expected among
    the choices safe against Baseline 1 at its per-sample time under the cap in force."""

    belief: Belief
    policy: ExplorationPolicy
    power_envelope_w: list[float] | None
    name: ClassVar[str] = "closed_loop"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        found = candidates(table, power_cap_w, self.belief, self.name)
        x = self.policy.exploit(found, baseline1_per_sample_s(table, power_cap_w, self.belief, self.power_envelope_w, found))
        return x.selection.model_copy(update={"note": _exploit_note(x)})


@dataclass(frozen=True)
class Pinned(Strategy):
    """Batch size `batch_size` at its f* under the cap in force while it is feasible (an
    exploration runs until it is measured, whatever the cap does), else `inner`'s choice."""

    inner: Believed
    batch_size: int
    name: ClassVar[str] = "closed_loop"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        vector = self.inner.belief.vector_like(table.batch_sizes)
        pinned = [s for s in feasible_set(self.name, table, vector, power_cap_w) if s.batch_size == self.batch_size]
        return pinned[0].model_copy(update={"note": f"exploring b={self.batch_size}"}) if pinned else self.inner.choose(table, power_cap_w)


def baseline1_per_sample_s(table: ProfileTable, power_cap_w: float | None, belief: Belief, power_envelope_w: list[float] | None,
                           found: Sequence[Candidate]) -> float:  # fmt: skip
    """Baseline 1's device time per sample under the cap (s); without a Baseline 1 configuration
    (a cap below the model-agnostic envelope), the largest feasible batch's at its f*. An
    envelope that is not the table's frequencies' (a table made elsewhere) is not used."""
    envelope = power_envelope_w if power_envelope_w and len(power_envelope_w) == len(table.frequencies_hz) else None
    try:
        b1 = Baseline1(belief.vector_like(table.batch_sizes), envelope).choose(table, power_cap_w)
    except SelectionError:
        return max(found, key=lambda c: c.batch_size).per_sample_s
    time_s = table.time_s[table.batch_sizes.index(b1.batch_size)][table.frequencies_hz.index(b1.frequency_hz)]
    return (time_s or 0.0) / table.samples
