"""What the fleet believes about one data's N_b: a point estimate and an interval per batch size.

Three kinds of knowledge, weakest first:
- the proxy's N_b (the prior), scaled to this data where runs on it measured some batch size,
  trusted within `trust_width` (a factor e^w either way: common/finetune/trust.py learns w from how far
  the proxy's r_b were from what later runs measured on other data; the paper's results set it
  where there is no such history);
- monotonicity: N_b never falls as b grows (every vector measured here), so measured batch
  sizes bound the ones between and beside them: a measured r_32 and r_128 bound r_64 (where
  seed noise made measured N_b fall as b grows, they are pooled first so the bounds never cross);
- solo runs on this data (common/finetune/learned.py): N_b measured, within the spread between seeds;
  a batch size that a running fine-tune trains solo now is being measured (`measuring`).

The interval of an unmeasured batch size is the prior's, cut by the monotone bounds; its point
estimate is the prior's, moved inside the interval; its `optimistic` value, the fewest samples
the data still allows (the measured neighbour below it, else the interval's low end), is what
exploration ranks candidates by. Every estimate says where it comes from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..schemas import RelationVector
from .learned import FinetuneRecord, measuring, prior_samples, relative_samples

SEED_SPREAD = 0.06  # relative spread of a measured N_b between seeds when the records show none (5-15 % measured here)
PAPER_TRUST = 0.08  # the proxy's r_b trusted within 8 %: equation (4) within 8 % of the oracle in the paper's results

Source = Literal["measured", "bounded", "prior"]


@dataclass(frozen=True)
class Estimate:
    """N_b on this data (samples, on the scale of the runs that measured it, else the
    proxy's): a point, the interval [low, high] it is trusted within, the fewest samples the
    data allows (`optimistic`), and where they come from."""

    batch_size: int
    samples: float
    low: float
    high: float
    source: Source
    runs: int = 0  # solo runs on this data that measured it
    optimistic: float = 0.0

    def describe(self) -> str:
        """Where the estimate comes from, in a few words."""
        if self.source == "measured":
            return f"b={self.batch_size} measured by {self.runs} run(s)"
        if self.source == "bounded":
            return f"b={self.batch_size} bounded by measured neighbours"
        return f"b={self.batch_size} from the proxy"


@dataclass(frozen=True)
class Belief:
    """Every batch size's estimate of one data's N_b, and the records it rests on."""

    estimates: dict[int, Estimate]
    records: int
    trust_width: float
    measuring: dict[int, str] = field(default_factory=dict)  # unmeasured batch sizes runs train solo now -> one such run's record id

    @property
    def measured(self) -> frozenset[int]:
        """The batch sizes runs on this data measured."""
        return frozenset(b for b, e in self.estimates.items() if e.source == "measured")

    def vector_like(self, batch_sizes: Sequence[int]) -> RelationVector:
        """The point estimates as a relation vector over `batch_sizes` (r_b relative to the
        largest estimated one; None where the belief has none)."""
        means: list[float | None] = [self.estimates[b].samples if b in self.estimates else None for b in batch_sizes]
        reached = [n for n in means if n is not None]
        reference = reached[-1] if reached else 1.0
        return RelationVector(batch_sizes=list(batch_sizes), ratios=[None if n is None else n / reference for n in means],
                              samples_mean=means, censored=[n is None for n in means])  # fmt: skip

    def line(self) -> str:
        """The belief for people: r_b with where each comes from."""
        top = max((e.samples for e in self.estimates.values()), default=1.0)
        marks = {"measured": "", "bounded": "~", "prior": "?"}
        each = ", ".join(f"{b}: {marks[e.source]}{e.samples / top:.2f}" for b, e in sorted(self.estimates.items()))
        now = "".join(f"; b={b} being measured by {r}" for b, r in sorted(self.measuring.items()))
        return f"r_b {each} (? the proxy's within {self.trust_width:.0%}, ~ bounded by measured neighbours; {self.records} record(s){now})"


def belief(records: Sequence[FinetuneRecord], prior: RelationVector, trust_width: float = PAPER_TRUST) -> Belief:
    """What `records` (solo runs on one data) and the prior say about every batch size of the
    prior (see the module docstring)."""
    measured = {b: v for b, v in relative_samples(list(records)).items() if b in prior.batch_sizes}
    prior_n = {b: n for b in prior.batch_sizes if (n := prior_samples(prior, b)) is not None}
    shared = [b for b in measured if b in prior_n]
    scale = math.exp(statistics.fmean(math.log(statistics.fmean(measured[b]) / prior_n[b]) for b in shared)) if shared else 1.0
    known: dict[int, Estimate] = {}
    for b, values in measured.items():
        mean = statistics.fmean(values)
        spread = max(SEED_SPREAD, statistics.stdev(values) / mean if len(values) > 1 else 0.0)
        known[b] = Estimate(b, mean, mean * (1 - spread), mean * (1 + spread), "measured", runs=len(values), optimistic=mean * (1 - spread))
    estimates = dict(known)
    monotone = _monotone(known)
    for b, n in prior_n.items():
        if b in known:
            continue
        point = n * scale
        low, high = point * math.exp(-trust_width), point * math.exp(trust_width)
        below = [interval[0] for m, interval in monotone.items() if m < b]
        above = [interval[1] for m, interval in monotone.items() if m > b]
        floor, ceiling = max(below, default=0.0), min(above, default=math.inf)
        bounded_low, bounded_high = max(low, floor), min(high, ceiling)
        if bounded_low > bounded_high:  # the prior contradicts what the neighbours measured: they hold
            bounded_low, bounded_high = floor, ceiling if math.isfinite(ceiling) else max(floor, high)
        source: Source = "bounded" if below and above else "prior"
        estimates[b] = Estimate(b, min(max(point, bounded_low), bounded_high), bounded_low, bounded_high, source,
                                optimistic=floor if below else bounded_low)  # fmt: skip
    running = {b: r for b, r in measuring(records).items() if b not in known}
    return Belief(estimates=dict(sorted(estimates.items())), records=len(records), trust_width=trust_width, measuring=running)


def _monotone(known: dict[int, Estimate]) -> dict[int, tuple[float, float]]:
    """The intervals (low, high) of the measured batch sizes for the bounds they put on the
    others, their points made non-decreasing in b first (pool adjacent violators, weighted by
    runs; each keeps its relative spread): seed noise can make a measured N_b fall as b grows,
    and bounds from such neighbours would cross."""
    blocks: list[tuple[int, float, list[int]]] = []  # (runs, mean, batch sizes) of each pooled block
    for b in sorted(known):
        blocks.append((known[b].runs, known[b].samples, [b]))
        while len(blocks) > 1 and blocks[-2][1] > blocks[-1][1]:
            (w2, m2, b2), (w1, m1, b1) = blocks.pop(), blocks.pop()
            blocks.append((w1 + w2, (w1 * m1 + w2 * m2) / (w1 + w2), b1 + b2))
    return {b: (mean * known[b].low / known[b].samples, mean * known[b].high / known[b].samples) for _, mean, bs in blocks for b in bs}
