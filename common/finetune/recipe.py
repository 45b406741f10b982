"""A fine-tune on one device as a recipe with named phases, driven by a thin task
(tasks/device.py `finetune`) and tested without Celery:

    recipe = FineTune(request, device, writer, options)
    recipe.setup(checkpoint)    data, model, trainer and the workload the device's time model
                                needs; continue from a checkpoint when an earlier attempt left one
    report = recipe.run()       select: pin the frequency, follow the cap with the job's
                                strategy (re-select on a new cap, the power guard, pauses);
                                train step by step, evaluating every `eval_every_samples`;
                                checkpoint; and return what ran as a RunReport

Everything the run writes goes through an `AttemptWriter`, which names the attempt: a write
of an attempt that no longer holds its part is refused, and the run stops (`Superseded`)
without writing anything more. The writer's answer also says when the job was cancelled, and
`Options.stop_requested` when the worker is shutting down; the run then checkpoints and
stops (`Cancelled`, `Stopping`), so a re-queued part continues from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..artifacts import initial_model
from ..datasets.loading import load_dataset
from ..devices.base import Device, Measurement
from ..jobs.state import CheckpointRef, EventKind, FinetuneProgress, Started
from ..models import get_model
from ..payloads import FinetuneRequest
from ..schemas import (
    ConfigSwitch,
    ConfigurationRun,
    DeviceCap,
    PowerGuardReport,
    ProfileTable,
    RelationVector,
    RunReport,
    VectorProvenance,
)
from ..selection import Baseline1, SelectionError, estimated_time_to_accuracy_s, strategy_for
from ..store.jobs import Written
from ..training import DeviceTotals, Trainer, make_optimizer, set_batch_size, train_to_accuracy
from ..workload import measure_workload
from .adaptive import AdaptiveControl, CapFollower
from .belief import PAPER_TRUST
from .checkpoints import checkpoint_name, load_checkpoint, remove_checkpoints, save_checkpoint
from .closed_loop import ClosedLoop
from .learned import DataIdentity, FinetuneRecord, RecordIdentity, similar_vector

logger = logging.getLogger(__name__)
SPLIT_SEED = 0  # the train/test split every fine-tune of a dataset uses


class AttemptWriter(Protocol):
    """Writes what one attempt of a fine-tune measures, only while it holds its part."""

    def write(self, progress: FinetuneProgress | None = None, checkpoint: CheckpointRef | None = None,
              event: tuple[EventKind, str] | None = None) -> Written:  # fmt: skip
        """Write any of these (nothing: only ask); refused unless the attempt holds the part."""

    def notice(self, notice: str | None) -> Written:
        """Set (None: clear) the part's notice for status, e.g. why training is paused."""

    def started(self, started: Started) -> Written:
        """Record that the run trains from its first step at another (b, f) than the dispatched one."""


class Stop(Exception):
    """The run stops before the target; `samples` trained so far."""

    def __init__(self, samples: int, reason: str):
        super().__init__(reason)
        self.samples, self.reason = samples, reason


class CancelledRun(Stop):
    """The job was cancelled: the run checkpointed and stopped."""


class Stopping(Stop):
    """The worker is shutting down: the run checkpointed and stopped, to continue elsewhere."""


class Superseded(Stop):
    """The attempt no longer holds its part (another replaced it, or the part is gone)."""


@dataclass(frozen=True)
class Options:
    """How a run checkpoints and checks in.

    `attempt`: the attempt's token (its checkpoint file is its own); `checkpoint_every_s`:
    the first evaluation this long (wall s) after the last checkpoint checkpoints;
    `check_every_s`: how often (wall s) the run asks whether it must stop between
    evaluations; `stop_requested`: the worker's reason to stop (None: go on);
    `table`, `vector`, `device_cap`: what re-selection on a new cap needs (without them the
    run keeps its first selection); `records`: reads what fine-tunes measured on this data
    (common/finetune/learned.py), the closed loop's evidence (finished runs and those running on it
    now), read at set-up and as the run goes; `similar`: records of similar data by data key (a weaker
    prior); `publish`: shows this run's partial record to the runs on the same data meanwhile;
    `claim`: shows its start unless another run trains that batch size solo now, naming that run
    (None: `publish`); `trust`: how far the proxy's r_b is trusted on this data (common/finetune/trust.py); `data`: the
    identity of this data, for the record this run leaves."""

    attempt: str
    artifact_dir: Path
    checkpoint_every_s: float = 30.0
    check_every_s: float = 1.0
    stop_requested: Callable[[], str | None] = lambda: None
    table: ProfileTable | None = None
    vector: RelationVector | None = None
    device_cap: Callable[[], DeviceCap | None] = lambda: None
    records: Callable[[], list[FinetuneRecord]] = lambda: []
    similar: dict[str, list[FinetuneRecord]] = field(default_factory=dict)
    publish: Callable[[FinetuneRecord], None] = lambda _: None
    claim: Callable[[FinetuneRecord], str | None] | None = None
    trust: float = PAPER_TRUST
    data: DataIdentity | None = None


class FineTune:
    """One attempt of a fine-tune (see the module docstring)."""

    def __init__(self, request: FinetuneRequest, device: Device, writer: AttemptWriter, options: Options):
        self.request, self.device, self.writer, self.options = request, device, writer, options
        self.trainer: Trainer | None = None
        self.totals = DeviceTotals()
        self.control: AdaptiveControl | None = None
        self.loop: ClosedLoop | None = None
        self.vector: RelationVector | None = None  # the vector it selects with from its start (the proxy's, or learned)
        self.record: FinetuneRecord | None = None  # what the run measured, once it reached its end
        self._saves = 0  # checkpoints saved by this attempt
        self._checked = self._checkpointed = time.monotonic()
        self._checkpoint_failed = False
        self._starting = False  # selecting before the first step
        self._runs: dict[tuple[int, int], ConfigurationRun] = {}
        self._reported = (0, 0.0, 0.0)  # samples, device time (s) and energy (J) at the last progress report

    # ------------------------------------------------------------------ set up

    def setup(self, checkpoint: CheckpointRef | None = None) -> None:
        """Load the data and the starting weights, bind the workload to the device, and
        continue from `checkpoint` when given (with the dispatched batch size)."""
        r = self.request
        entry = get_model(r.model)
        data = load_dataset(r.dataset, entry, SPLIT_SEED)
        model = initial_model(r.model, r.weights, data.num_classes, self.options.artifact_dir)
        self.device.bind_workload(measure_workload(r.model, model, entry.example_input(data.num_classes)))
        self.trainer = Trainer(model, make_optimizer(model, r.lr, r.batch_size), r.batch_size, data.train, data.test, seed=r.seed)
        self.totals = DeviceTotals()
        if checkpoint is not None:
            self.totals = load_checkpoint(checkpoint.url, self.options.artifact_dir, self.trainer)
            if self.trainer.batch_size != r.batch_size:  # re-queued with another selection: keep weights and optimizer
                set_batch_size(self.trainer, r.lr, r.batch_size)
        self._reported = (self.trainer.samples, self.totals.elapsed_s, self.totals.energy_j)

    # ------------------------------------------------------------------ run

    def run(self) -> RunReport:
        """Select, train to the target (or the budget) and report; the device's settings are
        restored whatever happens. Raises a `Stop` when the run must stop before."""
        assert self.trainer is not None, "setup() first"
        r, started = self.request, time.perf_counter()
        try:
            self._starting = True
            self.control = self._select()
            self.loop = self._closed_loop()  # its first selection may switch, and a switch writes: it may stop the run
            self._starting = False
            self._say_started()
            self.device.set_frequency(self._frequency())
            outcome, totals = train_to_accuracy(
                self.trainer, r.target_accuracy, r.eval_every_samples, r.max_samples, r.seed, self.device,
                self._evaluated, self.totals, _Steps(self),
            )  # fmt: skip
        finally:
            self.device.restore()
            # the control calls this recipe's methods back: dropped now, or the cycle would keep the
            # model and data until the collector's next full pass (a worker grew by every job's)
            if self.control is not None:
                self.control.on_switch = self.control.while_paused = None
        if self.loop is not None:
            self.record = self.loop.finish(totals, outcome)
        control = self.control
        return RunReport(
            device_id=r.device_id, device_type=self.device.device_type, simulated=self.device.simulated,
            batch_size=self.trainer.batch_size, frequency_hz=self._frequency(), configurations=list(self._runs.values()),
            reached=outcome.reached, final_accuracy=outcome.final_accuracy, samples_to_accuracy=outcome.samples_to_accuracy,
            samples_processed=outcome.samples_processed, steps=totals.steps, device_time_s=totals.elapsed_s,
            energy_j=totals.energy_j, peak_power_w=totals.peak_power_w, power_resolution_w=self.device.power_resolution_w,
            wall_s=time.perf_counter() - started,
            switches=control.switches if control else [], paused_s=control.paused_s if control else 0.0,
            guard=control.guard.report if control else PowerGuardReport(peak_power_w=totals.peak_power_w),
            learned=self._learned(), exploration=self.loop.exploration if self.loop else None,
        )  # fmt: skip

    def _learned(self) -> VectorProvenance | None:
        """What the belief that chose the batch size the run ended at rests on, when records of
        this data made it: the belief of its last switch for evidence, else the one it started with."""
        if self.loop is not None and self.loop.decisions:
            return self.loop.provenance()
        provenance = self.vector.provenance if self.vector is not None else None
        return provenance if provenance is not None and provenance.source != "proxy" else None

    def _say_started(self) -> None:
        """When the run trains from its first step at another (b, f) than the dispatched one
        (the closed loop's evidence, the guard against Baseline 1), record it with the estimates
        under the vector that chose it, for the report's headline."""
        r, c, table, vector = self.request, self.control, self.options.table, self.vector
        if c is None or c.paused or c.selection is None or table is None or vector is None:
            return
        choice = c.selection
        if (choice.batch_size, choice.frequency_hz) == (r.batch_size, r.frequency_hz):
            return
        envelope = dict(zip(self.device.frequencies_hz, self.device.power_envelope_w or []))
        try:  # the device's full-load power at the table's frequencies, where it knows it
            base = Baseline1(vector, [envelope[f] for f in table.frequencies_hz] if envelope else None).choose(table, c.cap_w)
        except (SelectionError, KeyError):
            base = None
        words = vector.provenance.summary if vector.provenance and vector.provenance.source != "proxy" else "the proxy's r_b"
        self._answer(self.writer.started(Started(
            selection=choice, estimated_time_to_accuracy_s=estimated_time_to_accuracy_s(table, vector, choice),
            baseline1=base, baseline1_estimated_time_to_accuracy_s=estimated_time_to_accuracy_s(table, vector, base) if base else None,
            vector=words,
        )))  # fmt: skip

    def _closed_loop(self) -> ClosedLoop | None:
        """The closed loop around the cap control (common/finetune/closed_loop.py): a job that selects for
        time to accuracy starts from the exploration policy's choice on what runs on this data
        measured, and re-selects as its own curve matches theirs; every run (a fixed
        configuration's too) follows its curve for the record it leaves later jobs, and shows it
        to the runs on the same data meanwhile."""
        r, o, control = self.request, self.options, self.control
        if control is None or o.vector is None or o.data is None:
            return None
        closed = r.objective.name == "time" and r.target.configuration is None
        identity = RecordIdentity(record_id=f"{r.job_id}:{r.device_id}", model=r.model, weights=r.weights, data=o.data,
                                  target_accuracy=r.target_accuracy, lr=r.lr, eval_every_samples=r.eval_every_samples,
                                  device_type=self.device.device_type, seed=r.seed)  # fmt: skip
        similar = similar_vector(o.similar, o.vector)  # records of similar data move the prior toward them
        prior = similar.model_copy(update={"key": o.vector.key}) if similar else o.vector
        loop = ClosedLoop(control, prior, o.records if closed else list, identity, seen=len(self.totals.history), trust=o.trust,
                          power_envelope_w=self.device.power_envelope_w, publish=o.publish, claim=o.claim)  # fmt: skip
        if closed:
            loop.start(self.totals, explore=not self.totals.history)  # a resumed run keeps to what it explored
            if (provenance := loop.provenance()) is not None and loop.belief is not None:
                self.vector = loop.belief.vector_like(prior.batch_sizes).model_copy(update={"provenance": provenance})
            elif similar is not None:
                self.vector = prior
        return loop

    def _select(self) -> AdaptiveControl | None:
        """The control that follows the device's cap with the job's strategy, or None (with an
        event saying so) when the table or vector it needs is not stored."""
        r, o = self.request, self.options
        if o.table is None or o.vector is None:
            self._write(event=(EventKind.reconfigured, "the lookup table or relation vector is gone: cap changes are not followed"))
            return None
        assert self.trainer is not None
        self.vector = o.vector
        return AdaptiveControl(
            self.device, self.trainer, r.lr, o.table, strategy_for(r.objective, o.vector, r.target.configuration),
            CapFollower(r.target, o.device_cap), r.target.cap_at(0.0), r.frequency_hz,
            on_switch=self._switched, while_paused=self._check,
        )  # fmt: skip

    def _frequency(self) -> int:
        return self.control.frequency_hz if self.control else self.request.frequency_hz

    # ------------------------------------------------------------------ between steps

    def _check(self) -> None:
        """Ask, at most every `check_every_s`, whether the run must stop."""
        if time.monotonic() - self._checked >= self.options.check_every_s:
            self._write()

    def _stepped(self, m: Measurement) -> None:
        """Count what a measured region trained at the configuration it ran at."""
        key = (m.batch_size, self._frequency())
        done = self._runs.setdefault(key, ConfigurationRun(batch_size=key[0], frequency_hz=key[1]))
        done.samples += m.steps * m.batch_size
        done.device_time_s += m.elapsed_s

    def _evaluated(self, samples: int, accuracy: float, run: DeviceTotals) -> None:
        """An evaluation: report progress, and checkpoint when one is due."""
        self._write(progress=self._progress(samples, accuracy, run))
        if time.monotonic() - self._checkpointed >= self.options.checkpoint_every_s:
            self._checkpoint(run)

    def _switched(self, switch: ConfigSwitch, run: DeviceTotals) -> None:
        if not (self._starting and switch.cause == "evidence"):  # the selection at its start: `_say_started` records it
            self._write(event=(EventKind.reconfigured, switch.line().strip()))
        if switch.cause in ("pause", "resume"):
            self._answer(self.writer.notice(f"paused: {switch.note}" if switch.cause == "pause" else None))
        if run.history and self.trainer is not None:
            self._write(progress=self._progress(self.trainer.samples, run.history[-1][1], run))

    def _progress(self, samples: int, accuracy: float, run: DeviceTotals) -> FinetuneProgress:
        """The progress report of an evaluation, with the mean power and samples per second of
        device time since the previous report (the figures of what runs now)."""
        r, c = self.request, self.control
        assert self.trainer is not None
        interval_s = run.elapsed_s - self._reported[1]
        power_w = (run.energy_j - self._reported[2]) / interval_s if interval_s > 0 else None
        samples_per_s = (samples - self._reported[0]) / interval_s if interval_s > 0 else None
        self._reported = (samples, run.elapsed_s, run.energy_j)
        return FinetuneProgress(
            samples=samples, accuracy=accuracy, device_time_s=run.elapsed_s, energy_j=run.energy_j,
            target_accuracy=r.target_accuracy, max_samples=r.max_samples, batch_size=self.trainer.batch_size,
            frequency_hz=self._frequency(), power_cap_w=c.cap_w if c else r.target.cap_at(0.0), paused=c.paused if c else None,
            power_w=power_w, peak_power_w=run.peak_power_w or None, samples_per_s=samples_per_s,
            over_cap_s=c.guard.report.over_cap_s if c else 0.0, guard_step_downs=c.guard.report.step_downs if c else 0,
            switches=len(c.switches) if c else 0,
        )  # fmt: skip

    def _checkpoint(self, run: DeviceTotals, final: bool = False) -> None:
        """Save a checkpoint and record it (`final`: the run is stopping anyway); one that
        cannot be saved (a full disk) is a warning, once, and the run goes on without."""
        assert self.trainer is not None
        folder = self.options.artifact_dir
        self._saves += 1
        file = checkpoint_name(self.request.job_id, self.request.device_id, self.options.attempt, self._saves)
        try:
            url = save_checkpoint(self.trainer, run, file, folder)
        except OSError as exc:
            if not self._checkpoint_failed:
                self._checkpoint_failed = True
                logger.warning("checkpoint of %s/%s failed: %s", self.request.job_id, self.request.device_id, exc)
                self._write(event=(EventKind.checkpoint_failed, f"checkpoint failed ({exc.strerror or exc}); the run goes on "
                                   "without one, and a lost attempt would start over"))  # fmt: skip
            return
        ref = CheckpointRef(url=url, samples=self.trainer.samples, steps=self.trainer.steps, device_time_s=run.elapsed_s,
                            energy_j=run.energy_j)  # fmt: skip
        written = self.writer.write(checkpoint=ref)
        if written in (Written.stale, Written.gone):
            (folder / file).unlink(missing_ok=True)
        else:
            remove_checkpoints(self.request.job_id, self.request.device_id, folder, keep=file)
            self._checkpointed = time.monotonic()
        if not final:
            self._answer(written)

    def _write(self, progress: FinetuneProgress | None = None, checkpoint: CheckpointRef | None = None,
               event: tuple[EventKind, str] | None = None) -> None:  # fmt: skip
        self._answer(self.writer.write(progress, checkpoint, event))

    def _answer(self, written: Written) -> None:
        """Stop when the store or the worker says so (see the module docstring)."""
        self._checked = time.monotonic()
        samples = self.trainer.samples if self.trainer else 0
        if written in (Written.stale, Written.gone):
            why = "its part is no longer in the store" if written == Written.gone else "another attempt holds its part"
            raise Superseded(samples, f"stopped after {samples} samples: {why}")
        stopping = self.options.stop_requested()
        if written == Written.cancel or stopping:
            if self.totals.history:  # kept, so that a re-queued part continues from here
                self._checkpoint(self.totals, final=True)
            if written == Written.cancel:
                raise CancelledRun(samples, f"cancelled after {samples} samples; the device's settings were restored")
            raise Stopping(samples, f"{stopping} after {samples} samples")


class _Steps:
    """The step control of a run: the recipe's checks and counts around its cap control."""

    def __init__(self, recipe: FineTune):
        self.recipe = recipe

    def before_step(self, run: DeviceTotals) -> None:
        self.recipe._check()
        if inner := self.recipe.loop or self.recipe.control:
            inner.before_step(run)

    def after_step(self, m: Measurement, run: DeviceTotals) -> None:
        self.recipe._stepped(m)
        if inner := self.recipe.loop or self.recipe.control:
            inner.after_step(m, run)
