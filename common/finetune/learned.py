"""Learning across jobs: what a completed fine-tune measured on its data (`FinetuneRecord`),
and the relation vector such records give a later job (`learned_vector`).

A fine-tune's curve from its first sample to its first switch is a *solo* run: training at one
batch size from the starting weights. Measured with the proxy's runs, solo runs at different
batch sizes from the same weights follow one loss curve stretched in samples (the samples a
batch size needs to reach any test loss are a near-constant multiple of another's), so two
solo curves on the same data give N_b / N_b' by matching their test losses
(`warp_ratio`), even when one stopped early. A run that reached the target without switching
gives its N_b outright. Records of the same data (model, weights, data identity, target
accuracy, learning-rate rule: `learned_key`) so give the target's own N_b at every batch size
some job ran; the proxy's vector fills in the others, scaled to them.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from pydantic import Field

from ..schemas import (
    DatasetRef,
    LearningRatePolicy,
    RelationVector,
    Strict,
    TrainingOutcome,
    VectorProvenance,
    utc_now,
)
from ..security import data_path

MIN_MATCHED_LEVELS = 3  # test-loss levels two solo curves must share to give a ratio
MIN_SOLO_EVALUATIONS = 4  # evaluations after the start a solo curve needs to be used
# with no run that reached the target, a run that has not is taken to need this many times what it
# ran: the median of what is left under a scale-free prior on N_b is as much again as it has run
UNREACHED_FACTOR = 2.0


class DataIdentity(Strict):
    """Which data a fine-tune trained on: the registered dataset's name and fraction, and for
    data read from a path, a digest of the path and of what is there (sizes, times)."""

    name: str
    fraction: float
    path_digest: str | None = None


def data_identity(ref: DatasetRef, roots: Sequence[Path]) -> DataIdentity:
    """The identity of `ref`'s data as seen from this host: for data at a path (inside the data
    `roots`, as the loaders read it), what is there now (names, sizes, times; nothing is read)."""
    if ref.path is None:
        return DataIdentity(name=ref.name, fraction=ref.fraction)
    digest = hashlib.sha256(ref.path.encode())
    path = data_path(ref.path, roots)
    entries = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    for entry in entries:
        stat = entry.stat()
        digest.update(f"{os.path.relpath(entry, path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return DataIdentity(name=ref.name, fraction=ref.fraction, path_digest=digest.hexdigest()[:24])


class Segment(Strict):
    """A stretch of a fine-tune at one batch size, with the evaluations in it: (samples, test
    accuracy, test loss in nats or None) from the one at its start to the one at its end."""

    batch_size: int
    frequency_hz: int = Field(description="the frequency it began at (the cap and the guard may move it)")
    start_samples: int = Field(ge=0)
    end_samples: int = Field(ge=0)
    device_time_s: float = Field(ge=0, description="device time spent in the segment (s)")
    curve: list[tuple[int, float, float | None]] = Field(default_factory=list)


class RecordIdentity(Strict):
    """What a fine-tune's record says about the run besides its curve and outcome."""

    record_id: str = Field(description="<job id>:<device id>")
    model: str
    weights: str
    data: DataIdentity
    target_accuracy: float
    lr: LearningRatePolicy
    eval_every_samples: int
    device_type: str
    seed: int

    def record(self, segments: list[Segment], outcome: TrainingOutcome | None, prior_key: str | None,
               posterior: RelationVector | None, power_cap_w: float | None) -> FinetuneRecord:  # fmt: skip
        """The record of a run with these segments (and its outcome, once finished)."""
        return FinetuneRecord(
            **dict(self), power_cap_w=power_cap_w, segments=[s.model_copy() for s in segments],
            reached=bool(outcome and outcome.reached), samples_to_accuracy=outcome.samples_to_accuracy if outcome else None,
            prior_key=prior_key, posterior=posterior, running=outcome is None,
        )  # fmt: skip


class FinetuneRecord(RecordIdentity):
    """What a completed fine-tune measured on the device's own data."""

    power_cap_w: float | None = Field(description="the cap in force at the start (W; None = no cap)")
    segments: list[Segment] = Field(min_length=1)
    reached: bool
    samples_to_accuracy: int | None
    prior_key: str | None = Field(None, description="the vector the fine-tune started from")
    posterior: RelationVector | None = Field(None, description="the closed loop's vector at the end")
    running: bool = Field(False, description="a partial record of a fine-tune still running, shown to the runs on the same data")
    created_at: datetime = Field(default_factory=utc_now)

    @property
    def batch_sizes_tried(self) -> list[int]:
        """Every batch size the fine-tune trained with, sorted."""
        return sorted({s.batch_size for s in self.segments})

    def solo_curve(self) -> tuple[int, list[tuple[int, float]]] | None:
        """(batch size, [(samples, test loss)]) of the first segment when it starts at sample 0
        and has test losses: training at one batch size from the starting weights."""
        first = self.segments[0]
        points = [(n, loss) for n, _, loss in first.curve if loss is not None]
        if first.start_samples or len(points) <= MIN_SOLO_EVALUATIONS:
            return None
        return first.batch_size, points

    def solo_samples(self) -> tuple[int, int] | None:
        """(batch size, N_b) when the fine-tune reached the target at the one batch size it started with."""
        if not self.reached or self.samples_to_accuracy is None or len({s.batch_size for s in self.segments}) > 1:
            return None
        return self.segments[0].batch_size, self.samples_to_accuracy


def measuring(records: Sequence[FinetuneRecord]) -> dict[int, str]:
    """The batch sizes that runs on this data still train solo now (running records of one
    segment), each with the record id of a run that does: their N_b is being measured."""
    return {r.segments[0].batch_size: r.record_id for r in records if r.running and len(r.segments) == 1}


class Envelope:
    """The running minimum of a solo curve's test loss: samples where it first reaches a loss."""

    def __init__(self, curve: list[tuple[int, float]]):
        self.samples, self.losses = [curve[0][0]], [curve[0][1]]
        for n, loss in curve[1:]:
            if loss < self.losses[-1]:
                self.samples.append(n)
                self.losses.append(loss)
        self._ascending = self.losses[::-1]

    def samples_at(self, loss: float) -> float | None:
        """Samples where the running minimum first reaches `loss`, linearly interpolated
        between evaluations; None when it never does."""
        if loss < self.losses[-1]:
            return None
        k = len(self.losses) - bisect.bisect_right(self._ascending, loss)  # the first index with losses[k] <= loss
        if k == 0:
            return float(self.samples[0])
        n0, l0, n1, l1 = self.samples[k - 1], self.losses[k - 1], self.samples[k], self.losses[k]
        return n0 + (l0 - loss) / (l0 - l1) * (n1 - n0)


def warp_ratio(curve: list[tuple[int, float]], reference: list[tuple[int, float]]) -> float | None:
    """N_b / N_ref from two solo curves [(samples, test loss)] on the same data and weights: the
    median, over the test losses `curve` reaches after its first two evaluations that
    `reference` also reaches, of the ratio of the samples each needed. None with fewer than
    MIN_MATCHED_LEVELS shared levels."""
    mine, theirs = Envelope(curve), Envelope(reference)
    ratios = []
    for n, loss in curve[2:]:
        m, k = theirs.samples_at(loss), mine.samples_at(loss)
        if m and k and n > 0:
            ratios.append(k / m)
    return statistics.median(ratios) if len(ratios) >= MIN_MATCHED_LEVELS else None


def distinct_draws(records: list[FinetuneRecord]) -> list[FinetuneRecord]:
    """One record per seed and starting batch size: the devices of one job train with the job's
    seed, so on the same data their solo runs at one batch size are one draw of N_b, not several
    (counted as several they would outweigh the other seeds' and narrow the spread between seeds).
    Of such records the one that tells most is kept: a run that reached the target at that batch
    size, else the longest solo curve."""
    kept: dict[tuple[int, int], FinetuneRecord] = {}
    for record in records:
        key = (record.seed, record.segments[0].batch_size)
        if key not in kept or _tells_more(record, kept[key]):
            kept[key] = record
    return list(kept.values())


def _tells_more(record: FinetuneRecord, other: FinetuneRecord) -> bool:
    """Whether `record` measures its starting batch size's N_b better than `other` does."""
    first, second = record.solo_samples() is not None, other.solo_samples() is not None
    if first != second:
        return first
    return record.segments[0].end_samples > other.segments[0].end_samples


def relative_samples(records: list[FinetuneRecord]) -> dict[int, list[float]]:
    """Per batch size, N_b on the records' data relative to one reference run (log-consistent):
    solo N_b where a run reached the target at one batch size (however few its evaluations),
    and solo curves of runs that did not, matched to the longest solo curve of a run that
    reached it (or, with no run that reached it, of any). Without a run that reached the
    target the curves give N_b's shape but not its scale, only that each run's N_b is above
    what it ran: every run is then taken to need UNREACHED_FACTOR times the samples it ran at
    the least (before, the longest run's samples so far stood for its N_b, so a run matched to
    it could read as past its own target). Curves at one batch size alone measure nothing: none.
    Runs that started at one batch size with one seed count once (`distinct_draws`)."""
    solo = [(r, r.solo_samples()) for r in distinct_draws(records)]
    reached = [(r, s) for r, s in solo if s is not None]
    values: dict[int, list[float]] = {}
    for _, (b, n) in reached:
        values.setdefault(b, []).append(float(n))
    solos = [(r, c) for r, s in solo if s is None and (c := r.solo_curve()) is not None]
    anchors = [(r, c, float(s[1])) for r, s in reached if (c := r.solo_curve()) is not None]
    if not anchors and not reached:
        anchors = [(r, c, float(c[1][-1][0])) for r, c in solos]
    if not anchors:
        return values
    anchor_record, (anchor_b, anchor_curve), anchor_n = max(anchors, key=lambda a: a[1][1][-1][0])
    found: list[tuple[int, float, float]] = [] if reached else [(anchor_b, anchor_n, anchor_n)]  # (b, N_b on the anchor's scale, ran)
    for record, (b, curve) in solos:
        if record is not anchor_record and (ratio := warp_ratio(curve, anchor_curve)) is not None:
            found.append((b, anchor_n * ratio, curve[-1][0]))
    scale = 1.0 if reached else UNREACHED_FACTOR * max(ran / relative for _, relative, ran in found)
    for b, relative, _ in found:
        values.setdefault(b, []).append(relative * scale)
    return values if reached or len(values) > 1 else {}


def learned_vector(records: list[FinetuneRecord], prior: RelationVector) -> RelationVector | None:
    """The relation vector that `records` (of one data key) give, over `prior`'s batch sizes:
    N_b measured where the records have it (mean over records), elsewhere the prior's N_b
    scaled by the geometric mean of measured / prior over the batch sizes both have (the
    prior's r_b when it has no N_b). None unless the records measured two batch sizes or more
    (one says nothing about how N_b changes with b)."""
    measured = {b: v for b, v in relative_samples(records).items() if b in prior.batch_sizes}
    shared = [b for b in measured if prior_samples(prior, b)]
    if len(measured) < 2 or not shared:
        return None
    scale = math.exp(statistics.fmean(math.log(statistics.fmean(measured[b]) / prior_samples(prior, b)) for b in shared))  # type: ignore[operator]
    means: list[float | None] = []
    stds: list[float | None] = []
    for b in prior.batch_sizes:
        n = prior_samples(prior, b)
        if b in measured:
            means.append(statistics.fmean(measured[b]))
            stds.append(statistics.stdev(measured[b]) if len(measured[b]) > 1 else None)
        else:
            means.append(None if n is None else n * scale)
            stds.append(None)
    tried = sorted(measured)
    scaled = sum(n is not None for n in means) > len(tried)
    rest = f"; the other batch sizes from the prior {prior.key or ''} scaled to them" if scaled else ""
    summary = f"learned from {len(records)} fine-tune record(s) of this data: N_b measured on the device's data at b={tried}{rest}"
    return _vector(prior, means, stds, records, summary, tried)


def similar_vector(groups: Mapping[str, list[FinetuneRecord]], prior: RelationVector) -> RelationVector | None:
    """The prior moved toward what runs on similar data measured (`groups`: records by data key,
    of other data of the same kind: another fraction or target accuracy). N_b of different data
    are on different scales, so each data key gives its own vector (`learned_vector`) and only
    their r_b are combined: r_b relative to the prior's largest batch size with an N_b, the
    geometric mean over the data keys that measured b (weighted by their records; over every
    key's scaled prior where none did), and where some key measured b, the geometric mean of
    that and the prior's r_b (similar data is a weaker prior than the same data). N_b are on the
    prior's scale. None unless some data key's records measured two batch sizes or more."""
    known = [b for b in prior.batch_sizes if prior_samples(prior, b)]
    vectors = [(v, len(rs)) for rs in groups.values() if (v := learned_vector(rs, prior)) is not None]
    if not vectors or not known:
        return None
    reference = known[-1]
    prior_reference: float = prior_samples(prior, reference)  # type: ignore[assignment]
    means: list[float | None] = []
    for b in prior.batch_sizes:
        logs = [(math.log(n / v.samples_for(reference)), w, b in v.provenance.measured_batch_sizes)  # type: ignore[operator,union-attr]
                for v, w in vectors if (n := v.samples_for(b)) is not None]  # fmt: skip
        if not logs:
            means.append(None)
            continue
        measuring = [(x, w) for x, w, measured in logs if measured]
        use = measuring or [(x, w) for x, w, _ in logs]
        log_r = sum(x * w for x, w in use) / sum(w for _, w in use)
        if measuring and (n := prior_samples(prior, b)):
            log_r = (log_r + math.log(n / prior_reference)) / 2
        means.append(prior_reference * math.exp(log_r))
    records = [r for rs in groups.values() for r in rs]
    summary = (f"learned from {len(records)} fine-tune record(s) of {len(vectors)} similar data: their r_b, each data's own, "
               f"blended with the prior's {prior.key or ''}")  # fmt: skip
    return _vector(prior, means, [None] * len(means), records, summary, [])


def prior_samples(prior: RelationVector, b: int) -> float | None:
    """The prior's N_b, or its r_b where it records no N_b."""
    return prior.samples_for(b) if prior.samples_mean is not None else prior.ratio(b)


def _vector(prior: RelationVector, means: list[float | None], stds: list[float | None], records: list[FinetuneRecord], summary: str,
            measured: list[int]) -> RelationVector:  # fmt: skip
    """A learned vector over the prior's batch sizes with N_b `means` (r_b relative to the largest one with an N_b)."""
    reference_b, reference_n = [(b, n) for b, n in zip(prior.batch_sizes, means) if n is not None][-1]
    return RelationVector(
        batch_sizes=prior.batch_sizes,
        ratios=[None if n is None else n / reference_n for n in means],
        samples_mean=means,
        samples_std=stds,
        censored=[n is None for n in means],
        resolution_samples=max(r.eval_every_samples for r in records),
        reference_batch_size=reference_b,
        request=prior.request,
        provenance=VectorProvenance(
            source="learned",
            summary=summary,
            prior_key=prior.key,
            records=[r.record_id for r in records],
            measured_batch_sizes=measured,
        ),
    )
