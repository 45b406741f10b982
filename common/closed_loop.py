"""The closed-loop fine-tune: the proxy's relation vector is the prior, what the device measures
on its own data is the evidence, and (b, f) is re-selected at step boundaries through
`AdaptiveControl` (common/adaptive.py), so cap changes, the power guard and pauses keep working.

The evidence is the device's own solo curve: from its first sample until its first switch it
trains at one batch size from the job's weights, and solo runs on the same data and weights at
two batch sizes trace one test-loss curve stretched in samples by N_b / N_b'
(`learned.warp_ratio`). Matched at every evaluation against the solo curves that earlier
fine-tunes on this data recorded at other batch sizes (`learned.FinetuneRecord`), it gives the
target's own N_b at those batch sizes relative to the running one; `learned_vector` turns all
of it into the posterior relation vector. The records are read again at every evaluation of the
solo segment, so a curve another device stores meanwhile (a job's other parts on the same data)
is evidence from then on. Without such records there is no evidence and the fine-tune runs the
prior's choice, under the guard against Baseline 1 (`Guarded`): a smaller batch whose gain over
the largest rests on an r_b no run on this data measured runs only if it is at most 2 % slower
than the largest batch even at r_b = 1.

A decision switches only to another batch size (the frequency at a batch size follows the cap
and the power guard), when, under the posterior, the new configuration is predicted faster
than the running one by more than `hysteresis`, after `min_dwell_samples` at the running one,
and at most `max_switches` times; a batch size no run measured on this data must beat the best
measured one by `margin` (`Posterior`). Each decision that changes the configuration is a
`ConfigSwitch` with cause "evidence" whose note gives the evidence. The loop adds no work on the
device: the test loss comes from the evaluations every fine-tune makes (the same pass as the
accuracy) and the matching is a few arithmetic operations on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from typing_extensions import override

from .adaptive import AdaptiveControl
from .devices.base import Measurement
from .learned import DataIdentity, FinetuneRecord, Segment, learned_vector, solo_batch_sizes
from .schemas import LearningRatePolicy, ProfileTable, RelationVector, Selection, TrainingOutcome
from .selection import SelectionError, Strategy, feasible_set
from .training import DeviceTotals


@dataclass(frozen=True)
class Posterior(Strategy):
    """Equation (4) on a vector learned from the device's data, where a batch size no run on
    this data measured (its r_b is the prior's, scaled) is chosen only if it beats the best
    measured one by `margin`; with nothing measured, equation (4)."""

    vector: RelationVector
    measured: frozenset[int]
    margin: float = 0.05
    name: ClassVar[str] = "closed_loop"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        feasible = feasible_set(self.name, table, self.vector, power_cap_w)
        best = min(feasible, key=lambda s: s.estimated_time_s)
        known = [s for s in feasible if s.batch_size in self.measured]
        if not known or best.batch_size in self.measured:
            return best
        anchor = min(known, key=lambda s: s.estimated_time_s)
        gain = 1 - best.estimated_time_s / anchor.estimated_time_s
        if best.estimated_time_s * (1 + self.margin) < anchor.estimated_time_s:
            note = f"b={best.batch_size} (not measured on this data) {gain:.0%} faster than measured b={anchor.batch_size}"
            return best.model_copy(update={"note": note})
        note = f"kept measured b={anchor.batch_size}: unmeasured b={best.batch_size}'s gain {gain:.0%} within {self.margin:.0%}"
        return anchor.model_copy(update={"note": note})


@dataclass(frozen=True)
class Guarded(Strategy):
    """`inner`'s choice, unless its gain over the largest batch at its f* (never slower than
    Baseline 1) rests on an r_b that no run on the device's data measured: a smaller batch runs
    when solo runs on this data (`solo`: their batch sizes) measured it and the largest, or
    when, needing as many samples as the largest (r_b = 1, the most a smaller batch needs), it
    is at most `tolerance` slower. Otherwise the largest batch runs: its solo curve measures it,
    and the loop moves down when runs on this data measured a smaller batch faster."""

    inner: Strategy
    vector: RelationVector
    solo: frozenset[int]
    tolerance: float = 0.02
    name: ClassVar[str] = "closed_loop"

    @override
    def choose(self, table: ProfileTable, power_cap_w: float | None) -> Selection:
        choice = self.inner.choose(table, power_cap_w)
        reference = max(feasible_set(self.name, table, self.vector, power_cap_w), key=lambda s: s.batch_size)
        if choice.batch_size == reference.batch_size or {choice.batch_size, reference.batch_size} <= self.solo:
            return choice
        worst_s = _table_time_s(table, (choice.batch_size, choice.frequency_hz))
        reference_s = _table_time_s(table, (reference.batch_size, reference.frequency_hz))
        if worst_s is None or reference_s is None or worst_s <= reference_s * (1 + self.tolerance):
            return choice
        note = (
            f"b={reference.batch_size} until this data measures both: b={choice.batch_size} is faster only if r_b "
            f"{self.vector.ratio(choice.batch_size) or 0:.2f} holds here (at r_b = 1 it is {worst_s / reference_s - 1:.0%} slower)"
        )
        return reference.model_copy(update={"note": note})


def measured_batch_sizes(vector: RelationVector | None) -> frozenset[int]:
    """The batch sizes whose N_b a learned vector took from runs on the device's data."""
    return frozenset(vector.provenance.measured_batch_sizes) if vector and vector.provenance else frozenset()


def starting_vector(prior: RelationVector, records: list[FinetuneRecord], similar: list[FinetuneRecord]) -> RelationVector:
    """What a fine-tune starts from: learned from records of its own data when they measured
    two batch sizes or more, else from records of similar data (blended with the prior), else
    the prior."""
    return learned_vector(records, prior) or learned_vector(similar, prior, similar=True) or prior


def loop_strategy(vector: RelationVector, fallback: Strategy, solo: frozenset[int], margin: float = 0.05) -> Strategy:
    """`Posterior` on a vector learned from records (of this data or of similar data),
    `fallback` (the job's strategy) on a proxy's, `Guarded` by the batch sizes `solo` runs on
    the data measured."""
    learned = vector.provenance is not None and vector.provenance.source != "proxy"
    return Guarded(Posterior(vector, measured_batch_sizes(vector), margin) if learned else fallback, vector, solo)


@dataclass(frozen=True)
class LoopSettings:
    """How readily the loop switches: `hysteresis` is the predicted gain (fraction of the time
    to accuracy) a switch needs: N_b differs by 5-15 % between seeds, and a run that switches
    does not at once train as one that began at the new batch size (bench/closed_loop.py: a
    switch predicted 4-9 % faster cost 8-13 %), so smaller gains are not worth a switch;
    `min_dwell_evaluations` the evaluations to run at a batch size first; `max_switches`
    bounds the switches for evidence; `margin` is `Posterior`'s for unmeasured batch sizes."""

    hysteresis: float = 0.10
    min_dwell_evaluations: int = 4
    max_switches: int = 2
    margin: float = 0.05


@dataclass
class EvidenceSwitch:
    """A switch for evidence, after `samples` at `device_time_s` (s): from the running (b, f)
    to the chosen one, with what the posterior predicts for each (T * r_b, s) and the note
    that says why (also the ConfigSwitch's)."""

    samples: int
    device_time_s: float
    running: tuple[int, int]
    choice: tuple[int, int]
    running_estimate_s: float
    choice_estimate_s: float
    note: str


@dataclass
class _Curve:
    segments: list[Segment] = field(default_factory=list)
    started_s: float = 0.0


class ClosedLoop:
    """The step control of a closed-loop fine-tune (see the module docstring): wraps the
    `AdaptiveControl` of the run, follows its evaluations, and re-selects through
    `adaptive.reselect` when the evidence says so. `records` reads the fine-tunes on the same
    data kept so far (read now and at each evaluation until the solo segment ends; `records`
    holds the last read); `identity` fills the record this run leaves (`record()`);
    `on_decision` sees every EvidenceSwitch (also kept in `decisions`); `seen`: the evaluations of
    earlier attempts in a resumed run's history, which are not this attempt's curve (its
    evidence starts afresh)."""

    def __init__(self, adaptive: AdaptiveControl, prior: RelationVector, records: Callable[[], list[FinetuneRecord]],
                 identity: RecordIdentity, settings: LoopSettings | None = None,
                 on_decision: Callable[[EvidenceSwitch], None] | None = None, seen: int = 0):  # fmt: skip
        self.adaptive, self.prior, self.identity = adaptive, prior, identity
        self.read_records = records
        self.records = records()
        self.settings = settings or LoopSettings()
        self.on_decision = on_decision
        self.decisions: list[EvidenceSwitch] = []
        self.posterior: RelationVector | None = None
        self._curve = _Curve()
        self._seen = seen  # evaluations seen
        self._since_switch = 0  # evaluations at the running configuration
        self._start_cap_w = adaptive.cap_w

    @property
    def switches(self) -> int:
        """Switches made for evidence."""
        return len(self.decisions)

    def before_step(self, run: DeviceTotals) -> None:
        """Take in a new evaluation (and decide), then let the adaptive control follow the cap."""
        if len(run.history) > self._seen:
            self._evaluated(run)
        self.adaptive.before_step(run)
        self._track(run)

    def after_step(self, m: Measurement, run: DeviceTotals) -> None:
        """The adaptive control's power guard sees the step."""
        self.adaptive.after_step(m, run)
        self._track(run)

    def _config(self) -> tuple[int, int]:
        return self.adaptive.trainer.batch_size, self.adaptive.frequency_hz

    def _track(self, run: DeviceTotals) -> None:
        """Open a segment when the batch size changed (any cause) since the last one began: N_b
        depends on the batch size, not on the frequency, which the cap and the guard move."""
        segments = self._curve.segments
        b, f = self._config()
        if segments and segments[-1].batch_size == b:
            return
        samples = self.adaptive.trainer.samples
        start: list[tuple[int, float, float | None]] = []
        if segments:
            last = segments[-1]
            last.end_samples, last.device_time_s = samples, run.elapsed_s - self._curve.started_s
            start = last.curve[-1:] if last.curve and last.curve[-1][0] == samples else []
        segments.append(Segment(batch_size=b, frequency_hz=f, start_samples=samples, end_samples=samples, device_time_s=0.0, curve=start))
        self._curve.started_s = run.elapsed_s
        self._since_switch = 0

    def _take_in(self, run: DeviceTotals) -> None:
        """Add the evaluations since the last look to the running segment."""
        self._track(run)
        current = self._curve.segments[-1]
        for samples, accuracy in run.history[self._seen :]:
            current.curve.append((samples, accuracy, self.adaptive.trainer.test_loss))
            self._since_switch += samples > current.start_samples
        self._seen = len(run.history)
        current.end_samples = self.adaptive.trainer.samples
        current.device_time_s = run.elapsed_s - self._curve.started_s

    def _evaluated(self, run: DeviceTotals) -> None:
        self._take_in(run)
        self._decide(run)

    def partial_record(self, outcome: TrainingOutcome | None = None) -> FinetuneRecord:
        """This run's record so far (or at its end, with `outcome`)."""
        return self.identity.record(self._curve.segments, outcome, self.prior.key, self.posterior, self._start_cap_w)

    def finish(self, run: DeviceTotals, outcome: TrainingOutcome) -> FinetuneRecord:
        """The record of the finished run, its last evaluations taken in."""
        self._take_in(run)
        return self.partial_record(outcome)

    def _decide(self, run: DeviceTotals) -> None:
        solo_over = len(self._curve.segments) > 1  # the evidence is the records and the first segment: fixed from here
        if not solo_over:
            self.records = self.read_records()
        if not self.records or self.adaptive.paused:
            return
        evidence = [*self.records, self.partial_record()]
        posterior = self.posterior if solo_over else learned_vector(evidence, self.prior)
        if posterior is None:
            return
        self.posterior = posterior
        solo = solo_batch_sizes(evidence)
        strategy = Guarded(Posterior(posterior, measured_batch_sizes(posterior), self.settings.margin), posterior, solo)
        self.adaptive.strategy = strategy  # cap changes and the guard select with the evidence from now on
        s = self.settings
        if self._since_switch < s.min_dwell_evaluations or self.switches >= s.max_switches:
            return
        try:
            choice = self.adaptive.choose(strategy)
        except SelectionError:
            return
        running = self._config()
        if choice.batch_size == running[0]:  # the frequency at a batch size is the cap's and the guard's business
            return
        running_s = _estimate(self.adaptive.table, posterior, running)
        if running_s is None or choice.estimated_time_s * (1 + s.hysteresis) >= running_s:
            return
        note = (
            f"evidence: r_b on this data {_ratios(posterior)} (N_b measured at b={sorted(measured_batch_sizes(posterior))}); "
            f"b={choice.batch_size} predicted {running_s / choice.estimated_time_s - 1:.0%} faster than b={running[0]}"
        )
        decision = EvidenceSwitch(
            samples=self.adaptive.trainer.samples, device_time_s=run.elapsed_s, running=running,
            choice=(choice.batch_size, choice.frequency_hz), running_estimate_s=running_s,
            choice_estimate_s=choice.estimated_time_s, note=note,
        )  # fmt: skip
        self.decisions.append(decision)
        if self.on_decision:
            self.on_decision(decision)
        self.adaptive.reselect(run, strategy, note)


def _table_time_s(table: ProfileTable, config: tuple[int, int]) -> float | None:
    """T[b][f] (s for the table's samples) of a configuration; None when not measured."""
    b, f = config
    if b not in table.batch_sizes or f not in table.frequencies_hz:
        return None
    return table.time_s[table.batch_sizes.index(b)][table.frequencies_hz.index(f)]


def _estimate(table: ProfileTable, vector: RelationVector, config: tuple[int, int]) -> float | None:
    """T[b][f] * r_b (s) of a configuration under `vector`; None when either is unknown."""
    time_s, ratio = _table_time_s(table, config), vector.ratio(config[0])
    return None if time_s is None or ratio is None else time_s * ratio


def _ratios(vector: RelationVector) -> str:
    """r_b per batch size, for notes."""
    return ", ".join(f"{b}: {r:.2f}" for b, r in zip(vector.batch_sizes, vector.ratios) if r is not None)


@dataclass(frozen=True)
class RecordIdentity:
    """What a fine-tune's record says about the run besides its curve."""

    record_id: str
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
            **vars(self), power_cap_w=power_cap_w, segments=[s.model_copy() for s in segments],
            reached=bool(outcome and outcome.reached), samples_to_accuracy=outcome.samples_to_accuracy if outcome else None,
            prior_key=prior_key, posterior=posterior,
        )  # fmt: skip
