"""The closed-loop fine-tune: the proxy's relation vector is the prior, what runs on the device's
own data measured is the evidence, and (b, f) is chosen at the start and re-chosen at step
boundaries through `AdaptiveControl` (common/finetune/adaptive.py), so cap changes, the power guard and
pauses keep working.

The evidence is solo curves: from its first sample until its first switch a fine-tune trains at
one batch size from the job's weights, and solo runs on the same data and weights at two batch
sizes trace one test-loss curve stretched in samples by N_b / N_b' (`learned.warp_ratio`). The
fleet's belief about the data's N_b (common/finetune/belief.py) combines the records earlier fine-tunes
left on it (`learned.FinetuneRecord`; read again at every evaluation of the solo segment, so a
curve another device keeps meanwhile is evidence from then on), the run's own solo curve,
monotonicity (N_b grows with b), and the proxy's N_b trusted as far as the proxy earned on other
data (common/finetune/trust.py).

At the start the run takes the exploration policy's choice (common/finetune/exploration.py): the fastest
expected configuration whose worst case is safe against Baseline 1, or a batch size no run on
this data measured that may be faster still, explored within the job's budget: it runs from the
first sample, its solo curve measures its N_b against a measured one (given up, unmeasured, at
the samples planned: what its cost bound covers), and then the run keeps the faster of it and
the exploit choice. The run shows its start (its batch size) to the runs on the same data at
once, before its first evaluation, and an exploration leaves out a batch size another run there
measures now: the devices of one job, and jobs at the same time, measure different candidates.
At every evaluation the belief is updated and the run
switches to another batch size (the frequency at a batch size follows the cap and the power
guard) when the new choice is predicted faster than the running one by more than `hysteresis`
(`min_gain` once an exploration is measured), after `min_dwell_evaluations` at the running one
(and, on the batch size it started with, the exploration window's share of its samples), and
at most `max_switches` times. Each switch is a `ConfigSwitch` with cause "evidence" whose
note gives the evidence. The loop adds no work on the device: the test loss comes from the
evaluations every fine-tune makes (the same pass as the accuracy) and the matching is a few
arithmetic operations on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..devices.base import Measurement
from ..schemas import ExplorationReport, RelationVector, TrainingOutcome, VectorProvenance
from ..selection import SelectionError
from ..training import DeviceTotals
from .adaptive import AdaptiveControl
from .belief import PAPER_TRUST, Belief, belief
from .exploration import Believed, Choice, ExplorationPolicy, Pinned, baseline1_per_sample_s, candidates
from .learned import FinetuneRecord, RecordIdentity, Segment

START_CLAIMS = 3  # choices of a start whose exploration other runs may claim first; the last one exploits


@dataclass(frozen=True)
class LoopSettings:
    """How readily the loop switches: `hysteresis` is the predicted gain (fraction of the time
    to accuracy) a switch needs: N_b differs by 5-15 % between seeds, and a run that switches
    does not at once train as one that began at the new batch size, so smaller gains are not
    worth a switch; `min_dwell_evaluations` the evaluations to run at a batch size first;
    `max_switches` bounds the switches for evidence; `policy` chooses the start and how far an
    exploration may go (common/finetune/exploration.py)."""

    hysteresis: float = 0.10
    min_dwell_evaluations: int = 4
    max_switches: int = 2
    policy: ExplorationPolicy = field(default_factory=ExplorationPolicy)


@dataclass
class EvidenceSwitch:
    """A switch for evidence, after `samples` at `device_time_s` (s): from the running (b, f)
    to the chosen one, with what the belief expects each to take for the rest of the run (s, on
    the belief's scale) and the note that says why (also the ConfigSwitch's)."""

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
    `AdaptiveControl` of the run, follows its evaluations, chooses the start (`start`) and
    re-selects through `adaptive.reselect` when the evidence says so. `records` reads the
    fine-tunes on the same data kept so far, and those running on it now (read now and at each
    evaluation until the solo segment ends; `records` holds the last read); `identity` fills the
    record this run leaves (`record()`); `publish` sees the run's partial record at each
    evaluation of its solo segment (so runs on the same data at the same time match against
    it); `claim` shows its start unless another run trains that batch size solo now, and then
    names that run (default: `publish`, which always shows it); `trust` is the width within
    which the proxy's r_b is trusted (common/finetune/trust.py);
    `power_envelope_w` is the device's model-agnostic envelope (Baseline 1's frequency);
    `on_decision` sees every EvidenceSwitch (also kept in `decisions`); `seen`: the evaluations
    of earlier attempts in a resumed run's history, which are not this attempt's curve (its
    evidence starts afresh)."""

    def __init__(self, adaptive: AdaptiveControl, prior: RelationVector, records: Callable[[], list[FinetuneRecord]],
                 identity: RecordIdentity, settings: LoopSettings | None = None,
                 on_decision: Callable[[EvidenceSwitch], None] | None = None, seen: int = 0, trust: float = PAPER_TRUST,
                 power_envelope_w: list[float] | None = None,
                 publish: Callable[[FinetuneRecord], None] = lambda _: None,
                 claim: Callable[[FinetuneRecord], str | None] | None = None):  # fmt: skip
        self.adaptive, self.prior, self.identity = adaptive, prior, identity
        self.read_records, self.publish = records, publish
        self.claim = claim or (lambda start: publish(start))
        self.records = records()
        self.settings = settings or LoopSettings()
        self.on_decision = on_decision
        self.trust, self.power_envelope_w = trust, power_envelope_w
        self.decisions: list[EvidenceSwitch] = []
        self.belief: Belief | None = None
        self.exploration: ExplorationReport | None = None
        self._exploring: Choice | None = None
        self._curve = _Curve()
        self._seen = seen  # evaluations seen
        self._since_switch = 0  # evaluations at the running configuration
        self._start_cap_w = adaptive.cap_w

    @property
    def switches(self) -> int:
        """Switches made for evidence."""
        return len(self.decisions)

    def start(self, run: DeviceTotals, explore: bool = True) -> Choice | None:
        """Choose the start on the belief: the exploit choice, or a batch size to explore
        (`explore`); None while no configuration meets the cap (the run is paused). The start is
        shown at once, before the first evaluation; an exploration whose batch size another run
        claimed meanwhile (runs starting at once) is chosen again on the records read anew."""
        for attempt in range(START_CLAIMS):
            chosen = self._choose(explore and attempt < START_CLAIMS - 1)  # the last try exploits: it is always shown
            if chosen is None:
                return None
            known, strategy, choice = chosen
            if self._show_start(choice):
                break
            self.records = self.read_records()
        if choice.role == "explore":
            self._exploring = choice
            partners = sorted(known.measured - {choice.selection.batch_size})
            self.exploration = ExplorationReport(
                batch_size=choice.selection.batch_size, exploit_batch_size=choice.exploit.batch_size, against=partners,
                cost_bound=choice.cost_bound, measure_by_samples=choice.measure_by_samples, note=choice.selection.note or "",
            )  # fmt: skip
            self.adaptive.reselect(run, Pinned(strategy, choice.selection.batch_size), choice.selection.note)
        else:
            self.adaptive.reselect(run, strategy, f"{choice.selection.note}; {known.line()}")
        return choice

    def _choose(self, explore: bool) -> tuple[Belief, Believed, Choice] | None:
        """The belief on the records read last, its strategy and the policy's choice on it; None
        while no configuration meets the cap (the strategy is kept for when one does)."""
        self.belief = known = belief(self.records, self.prior, self.trust)
        strategy = Believed(known, self.settings.policy, self.power_envelope_w)
        try:
            table, cap = self.adaptive.selecting()
            found = candidates(table, cap, known, strategy.name)
            b1 = baseline1_per_sample_s(table, cap, known, self.power_envelope_w, found)
            return known, strategy, self.settings.policy.choose(found, b1, known, self.identity.eval_every_samples, explore)
        except (SelectionError, ValueError):
            self.adaptive.strategy = strategy
            return None

    def _show_start(self, choice: Choice) -> bool:
        """Show the run's start (its batch size, no evaluation yet) to the runs on the same data;
        False when it explores a batch size another run claimed first (nothing is shown)."""
        segment = Segment(batch_size=choice.selection.batch_size, frequency_hz=choice.selection.frequency_hz, start_samples=0,
                          end_samples=0, device_time_s=0.0)  # fmt: skip
        start = self.identity.record([segment], None, self.prior.key, None, self._start_cap_w)
        if self.claim(start) is None:
            return True
        if choice.role == "explore":
            return False
        self.publish(start)  # an exploit choice runs whoever else trains its batch size
        return True

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
        posterior = self.belief.vector_like(self.prior.batch_sizes) if self.belief and self.belief.records else None
        return self.identity.record(self._curve.segments, outcome, self.prior.key, posterior, self._start_cap_w)

    def finish(self, run: DeviceTotals, outcome: TrainingOutcome) -> FinetuneRecord:
        """The record of the finished run, its last evaluations taken in."""
        self._take_in(run)
        if self._exploring is not None:
            if outcome.reached and len(self._curve.segments) == 1:  # its solo run to the target measured it
                self.belief = belief([*self.records, self.partial_record(outcome)], self.prior, self.trust)
                self._ended_exploration(None)
                self._explored(True, "")
            else:
                self._ended_exploration("the run reached its end before its N_b was measured")
        return self.partial_record(outcome)

    def provenance(self) -> VectorProvenance | None:
        """What the belief the run last selected with rests on, when records of this data made it."""
        if self.belief is None or not self.belief.records:
            return None
        ids = [r.record_id for r in self.records]
        return VectorProvenance(source="learned", summary=self.belief.line(), prior_key=self.prior.key, records=ids,
                                measured_batch_sizes=sorted(self.belief.measured))  # fmt: skip

    def _decide(self, run: DeviceTotals) -> None:
        solo_over = len(self._curve.segments) > 1  # the evidence is the records and the first segment: fixed from here
        if not solo_over:
            self.records = self.read_records()
            self.publish(self.partial_record())
        if self.adaptive.paused or (not self.records and self._exploring is None):
            return
        now = self.belief if solo_over and self.belief else belief([*self.records, self.partial_record()], self.prior, self.trust)
        self.belief = now
        strategy = Believed(now, self.settings.policy, self.power_envelope_w)
        ending = self._exploring is not None
        threshold = self._threshold()
        if threshold is None:
            if not ending:
                self.adaptive.strategy = strategy  # cap changes and the guard select with the evidence from now on
            return
        self.adaptive.strategy = strategy
        note = self._switch_if_faster(run, now, strategy, threshold)
        if ending:
            self._explored(note is None, note or "")

    def _threshold(self) -> float | None:
        """The predicted gain a switch needs now; None when none may happen now (an exploration
        not compared yet: with a batch size to match against, until the samples planned,
        measured or not (an early match misleads), which its cost bound covers; without, until
        its own solo run measures it at the target; while the run is at the explored batch
        size; the dwell, the switch budget)."""
        s = self.settings
        if self._exploring is not None:
            assert self.belief is not None
            explored = self._exploring.selection.batch_size
            measured = explored in self.belief.measured
            moved = self.adaptive.trainer.batch_size != explored  # the cap made it infeasible: `Pinned` fell back
            planned = self._exploring.measure_by_samples
            if not moved and (self.adaptive.trainer.samples < planned if planned is not None else not measured):
                return None  # measured or not, a planned exploration runs its planned samples: an early match misleads
            why_not = "the cap moved the run off it" if moved else "its N_b was not measured in the samples planned"
            self._ended_exploration(None if measured else why_not)
            return s.policy.min_gain
        if self._since_switch < s.min_dwell_evaluations or self.switches >= s.max_switches:
            return None
        if len(self._curve.segments) == 1 and self.adaptive.trainer.samples < self._solo_window():
            return None  # the run's own solo curve is compared no earlier than an exploration's
        return s.hysteresis

    def _solo_window(self) -> int:
        """The samples before which a run's solo curve is not compared for a switch: the share of
        its expected samples an exploration is measured over (`ExplorationPolicy.share_samples`),
        as early in a long run a small batch's test loss falls faster per sample than it goes on
        to, and a larger one's slower."""
        assert self.belief is not None
        running = self.belief.estimates.get(self.adaptive.trainer.batch_size)
        return 0 if running is None else self.settings.policy.share_samples(running.samples, self.identity.eval_every_samples)

    def _exploration_cost(self) -> float | None:
        """What the exploration has cost so far, as a fraction of the exploit choice's expected
        time: its device time less the exploit choice's for the same progress (its samples over
        its N_b as the belief matches its curve now); negative where it gained. None where the
        belief cannot tell."""
        assert self._exploring is not None and self.belief is not None
        e, x, segment = self._exploring.selection.batch_size, self._exploring.exploit.batch_size, self._curve.segments[0]
        try:
            found = {c.batch_size: c for c in candidates(*self.adaptive.selecting(), self.belief, Believed.name)}
        except SelectionError:
            return None
        if x not in found or e not in self.belief.estimates or segment.end_samples <= 0:
            return None
        exploit = found[x]
        return segment.device_time_s / exploit.expected_s - segment.end_samples / self.belief.estimates[e].samples

    def _switch_if_faster(self, run: DeviceTotals, now: Belief, strategy: Believed, threshold: float) -> str | None:
        """Switch to the belief's choice when it is predicted faster than the running
        configuration by more than `threshold` over the rest of the run: the share of the
        progress left (each segment's samples over its N_b done) at each, plus one evaluation
        interval at the choice for the switch (a switched run resumes about an interval behind
        one begun at the new batch size); returns the switch's note (None: no switch)."""
        running = self._config()
        try:
            table, cap = self.adaptive.selecting()
            found = {c.batch_size: c for c in candidates(table, cap, now, strategy.name)}
            choice = self.adaptive.choose(strategy)
        except SelectionError:
            return None
        if choice.batch_size == running[0] or running[0] not in found or choice.batch_size not in found:
            return None
        done = sum((s.end_samples - s.start_samples) / now.estimates[s.batch_size].samples
                   for s in self._curve.segments if s.batch_size in now.estimates)  # fmt: skip
        left = 1.0 - done
        if left <= 0:
            return None  # the run is about to reach its target where it is
        x = found[choice.batch_size]
        running_s = found[running[0]].expected_s * left
        choice_s = x.per_sample_s * (x.estimate.samples * left + self.identity.eval_every_samples)
        if choice_s * (1 + threshold) >= running_s:
            return None
        note = (f"evidence: {now.line()}; b={choice.batch_size} predicted {running_s / choice_s - 1:.0%} faster than "
                f"b={running[0]} over the {left:.0%} of the run left")  # fmt: skip
        decision = EvidenceSwitch(
            samples=self.adaptive.trainer.samples, device_time_s=run.elapsed_s, running=running,
            choice=(choice.batch_size, choice.frequency_hz), running_estimate_s=running_s, choice_estimate_s=choice_s, note=note,
        )  # fmt: skip
        self.decisions.append(decision)
        if self.on_decision:
            self.on_decision(decision)
        self.adaptive.reselect(run, strategy, note)
        return note

    def _ended_exploration(self, why_not: str | None) -> None:
        """Close the exploration: its N_b measured (`why_not` None) or given up (why)."""
        assert self._exploring is not None and self.exploration is not None
        b, samples = self._exploring.selection.batch_size, self.adaptive.trainer.samples
        if (cost := self._exploration_cost()) is not None:
            self.exploration = self.exploration.model_copy(update={"cost": cost})
        if why_not is None and self.belief is not None:
            top = max(e.samples for e in self.belief.estimates.values())
            outcome = f"measured at {samples} samples: r_b {self.belief.estimates[b].samples / top:.2f} on this data"
            self.exploration = self.exploration.model_copy(update={"measured_at_samples": samples, "outcome": outcome})
        else:
            self.exploration = self.exploration.model_copy(update={"outcome": why_not})
        self._exploring = None

    def _explored(self, kept: bool, note: str) -> None:
        """Say what a measured exploration ended in: kept, or left (the switch's note)."""
        if self.exploration is not None and self.exploration.outcome and self.exploration.measured_at_samples is not None:
            more = "kept: nothing is predicted faster" if kept else f"left: {note.split('; ')[-1]}"
            self.exploration = self.exploration.model_copy(update={"outcome": f"{self.exploration.outcome}; {more}"})
