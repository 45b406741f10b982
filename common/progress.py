"""How far the work a job waits for has got while it runs: the proxy runs of a relation
vector's estimation, a device type's profiling and a fine-tune.

The tasks report it through a callback (common/estimation.py, common/profiling.py) at most
once per REPORT_EVERY_S; `status`, the client's `on_update`, `evaluate`'s board and Flower show
it. Durations come from the reporting worker's own clock (start and latest report), so hosts
with unsynchronised clocks do not skew them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import Field

from .schemas import EstimationRequest, Strict, TrainingOutcome, utc_now

if TYPE_CHECKING:
    from .jobs.state import FinetuneProgress

REPORT_EVERY_S = 1.0
T = TypeVar("T")


def throttled(callback: Callable[[T], None] | None, every_s: float = REPORT_EVERY_S) -> Callable[[T], None]:
    """`callback`, called at most once every `every_s` seconds (the first call at once; the
    calls in between are dropped); a no-op when `callback` is None."""
    last: float | None = None

    def call(value: T) -> None:
        nonlocal last
        now = time.monotonic()
        if callback is None or (last is not None and now - last < every_s):
            return
        last = now
        callback(value)

    return call


def _about(seconds: float | None, bound: bool = False) -> str:
    if seconds is None:
        return ""
    rounded = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
    return f", {'at most ' if bound else ''}about {rounded} left"


# --------------------------------------------------------------------------- estimation


class ProxyRunProgress(Strict):
    """A proxy run of an estimation while it trains: its latest evaluation (reported by the run)."""

    batch_size: int
    seed: int
    samples: int
    accuracy: float
    target_accuracy: float
    max_samples: int
    started_at: datetime = Field(description="when the run started, on its worker's clock")
    updated_at: datetime = Field(default_factory=utc_now, description="when this was reported, on the same clock")

    @property
    def elapsed_s(self) -> float:
        """How long it had been running at this report (s)."""
        return (self.updated_at - self.started_at).total_seconds()

    def line(self) -> str:
        """e.g. "b=8 seed=0: 1536/40000 samples, accuracy 0.712 (target 0.85), 9 s"."""
        return (f"b={self.batch_size} seed={self.seed}: {self.samples}/{self.max_samples} samples, accuracy "
                f"{self.accuracy:.3f} (target {self.target_accuracy:g}), {self.elapsed_s:.0f} s")  # fmt: skip


class RunState(str, Enum):
    """Where one (batch size, seed) run of an estimation is."""

    waiting = "waiting"  # not started (queued on the server pool)
    running = "running"
    done = "done"


class ProxyRun(Strict):
    """One (batch size, seed) run of an estimation as `status` shows it."""

    batch_size: int
    seed: int
    state: RunState
    samples: int | None = Field(None, description="samples trained: so far (running) or in all (done)")
    accuracy: float | None = Field(None, description="latest test accuracy (running) or the final one (done)")
    elapsed_s: float | None = Field(None, description="wall time so far (running) or in all (done)")
    reached: bool | None = Field(None, description="done: whether it reached the target")
    samples_to_accuracy: int | None = Field(None, description="done: N_b")

    def line(self, target_accuracy: float) -> str:
        """The run in a few words, e.g. "b=8 seed=0: running, 1536 samples, accuracy 0.712"."""
        head = f"b={self.batch_size} seed={self.seed}: {self.state.value}"
        if self.state == RunState.running:
            return f"{head}, {self.samples} samples, accuracy {self.accuracy:.3f} (target {target_accuracy:g}), {self.elapsed_s:.0f} s"
        if self.state == RunState.done:
            what = f"N_b {self.samples_to_accuracy} samples" if self.reached else f"target not reached in {self.samples} samples"
            return f"{head}, {what}, {self.elapsed_s:.0f} s"
        return head


class EstimationProgress(Strict):
    """A relation vector being estimated: every (batch size, seed) run, and the time left
    estimated from the runs done (their mean wall time), shared by the runs running at once."""

    vector_key: str
    target_accuracy: float
    runs: list[ProxyRun]
    time_left_s: float | None = Field(None, description="None until a run is done")

    def count(self, state: RunState) -> int:
        """How many runs are in `state`."""
        return sum(r.state == state for r in self.runs)

    def line(self) -> str:
        """e.g. "proxy runs 2/6 done, 2 running, 2 waiting, about 40 s left"."""
        running, waiting = self.count(RunState.running), self.count(RunState.waiting)
        return (f"proxy runs {self.count(RunState.done)}/{len(self.runs)} done, {running} running, {waiting} waiting"
                f"{_about(self.time_left_s)}")  # fmt: skip

    def running_lines(self) -> list[str]:
        """One line per running run."""
        return [r.line(self.target_accuracy) for r in self.runs if r.state == RunState.running]


def estimation_progress(
    key: str, request: EstimationRequest, outcomes: list[TrainingOutcome], running: list[ProxyRunProgress]
) -> EstimationProgress:
    """The runs of `request` (vector `key`): done (an outcome is stored), running (reported
    progress and no outcome) or waiting."""
    done = {(o.batch_size, o.seed): o for o in outcomes}
    live = {(r.batch_size, r.seed): r for r in running}
    runs = []
    for b in request.batch_sizes:
        for seed in request.seeds:
            if (o := done.get((b, seed))) is not None:
                runs.append(ProxyRun(batch_size=b, seed=seed, state=RunState.done, samples=o.samples_processed,
                                     accuracy=o.final_accuracy, elapsed_s=o.wall_s, reached=o.reached,
                                     samples_to_accuracy=o.samples_to_accuracy))  # fmt: skip
            elif (r := live.get((b, seed))) is not None:
                runs.append(ProxyRun(batch_size=b, seed=seed, state=RunState.running, samples=r.samples,
                                     accuracy=r.accuracy, elapsed_s=r.elapsed_s))  # fmt: skip
            else:
                runs.append(ProxyRun(batch_size=b, seed=seed, state=RunState.waiting))
    return EstimationProgress(vector_key=key, target_accuracy=request.target_accuracy, runs=runs, time_left_s=_time_left(runs))


def _time_left(runs: list[ProxyRun]) -> float | None:
    """Each unfinished run takes the mean wall time of the finished ones (a running one, what
    it has left of it), spread over as many runs at once as are running now."""
    walls = [r.elapsed_s for r in runs if r.state == RunState.done and r.elapsed_s is not None]
    if not walls:
        return None
    mean = statistics.fmean(walls)
    running = [r for r in runs if r.state == RunState.running]
    waiting = sum(r.state == RunState.waiting for r in runs)
    work = sum(max(mean - (r.elapsed_s or 0.0), 0.0) for r in running) + waiting * mean
    return work / max(len(running), 1)


# --------------------------------------------------------------------------- profiling


class ProfilingProgress(Strict):
    """A device type's lookup table being measured (reported by the profiling task)."""

    device_type: str
    model: str
    mode: Literal["grid", "staircase"]
    points_measured: int
    points_planned: int = Field(description="grid: every point; staircase: an upper bound (it stops sooner)")
    started_at: datetime = Field(description="when profiling started, on the device worker's clock")
    updated_at: datetime = Field(default_factory=utc_now, description="when this was reported, on the same clock")
    device_id: str | None = Field(None, description="the device that measures it (the task that reports it says)")
    done: bool = Field(False, description="every point is measured")

    @property
    def time_left_s(self) -> float | None:
        """The points left at the mean time per point so far (s); None before the first point."""
        if not self.points_measured:
            return None
        per_point = (self.updated_at - self.started_at).total_seconds() / self.points_measured
        return per_point * max(self.points_planned - self.points_measured, 0)

    def line(self) -> str:
        """e.g. "12/72 points measured on nano-1, about 30 s left"."""
        bound = self.mode == "staircase"
        planned = f"at most {self.points_planned}" if bound else str(self.points_planned)
        where = f" on {self.device_id}" if self.device_id else ""
        return f"{self.points_measured} of {planned} points measured{where}{_about(self.time_left_s, bound)}"


# --------------------------------------------------------------------------- a job


class Preparation(Strict):
    """What a job's unfinished parts wait for before they fine-tune, while it is made."""

    estimation: EstimationProgress | None = Field(None, description="the job's relation vector, while it is estimated")
    profiling: dict[str, ProfilingProgress] = Field(
        default_factory=dict, description="by device type: the lookup tables being measured for the job's parts"
    )


def finetune_line(progress: FinetuneProgress, state: str | None = None) -> str:
    """A fine-tune's latest evaluation in a few words, with the configuration it runs at now
    while it runs (`state` None or "finetuning")."""
    text = (f"samples {progress.samples}/{progress.max_samples}  accuracy {progress.accuracy:.3f}"
            f" (target {progress.target_accuracy})")  # fmt: skip
    if progress.batch_size and progress.frequency_hz and state in (None, "finetuning"):
        cap = "no cap" if progress.power_cap_w is None else f"cap {progress.power_cap_w:g} W"
        text += f"  now b={progress.batch_size} f={progress.frequency_hz / 1e6:g} MHz, {cap}"
    return text
