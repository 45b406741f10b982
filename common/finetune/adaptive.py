"""Fine-tuning under a power cap that changes: the cap in force, the power guard, and the
controller that re-selects (b, f) at step boundaries.

- `CapFollower`: the cap in force at a device time: the job's schedule for the device,
  unless a cap set on the device (`DeviceCap`) is newer than the schedule's current step.
- `PowerGuard`: a measured peak over the cap steps the frequency down at once, as far as the
  reading's ratio to the table says it must; it
  goes back up after `recover_s` of device time with every reading `margin` under the cap,
  when the level above, at the drift the readings show against the table, meets the cap.
  When even the lowest frequency would be over the cap at the drift a reading shows, the
  controller selects again with the table's peaks scaled by that drift: a smaller batch, or a
  pause.
- `AdaptiveControl`: the step control of `train_to_accuracy`. On a new cap it re-selects with
  the job's strategy from the lookup table, re-pins the frequency and changes the batch size
  (learning rate rescaled, weights and optimizer state kept); a cap no configuration meets
  pauses training at the lowest frequency, in idle slices of device time, until one does.
  The closed loop (common/finetune/closed_loop.py) hands it a strategy on the evidence (`reselect`):
  it selects with that one now and at every later cap change.

A staircase table is measured for one cap: under another it cannot select, so the run
pauses with that reason (jobs with a schedule are refused a staircase table up front).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..devices.base import Device, Measurement
from ..schemas import (
    ConfigSwitch,
    DeviceCap,
    DeviceTarget,
    LearningRatePolicy,
    PowerGuardReport,
    ProfileTable,
    Selection,
)
from ..selection import SelectionError, Strategy
from ..training import DeviceTotals, Trainer, set_batch_size

logger = logging.getLogger(__name__)
PAUSE_SLICE_S = 1.0  # device time between two looks at the cap while paused, at most (s); a schedule's step ends a slice


class CapFollower:
    """The board power cap in force (W; None = no cap) at a device time of a fine-tune:
    `target`'s schedule, overridden by a cap set on the device after the fine-tune started
    and after the schedule's current step began. `read_device_cap` is polled at most every
    `poll_s` seconds of wall time."""

    def __init__(self, target: DeviceTarget, read_device_cap: Callable[[], DeviceCap | None], poll_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.target, self._read, self._poll_s, self._clock = target, read_device_cap, poll_s, clock
        self._device_cap = read_device_cap()
        self._followed = self._version()  # device caps up to this version are older than what the run follows
        self._step = target.schedule_step(0.0)
        self._polled_at = clock()

    def _version(self) -> int:
        return self._device_cap.version if self._device_cap else 0

    def cap_at(self, device_time_s: float) -> float | None:
        """The cap in force `device_time_s` seconds into the fine-tune (W)."""
        if self._clock() - self._polled_at >= self._poll_s:
            self._device_cap, self._polled_at = self._read(), self._clock()
        step = self.target.schedule_step(device_time_s)
        if step != self._step:  # the schedule moves on: it overrides earlier device caps
            self._step, self._followed = step, max(self._followed, self._version())
        if self._device_cap is not None and self._device_cap.version > self._followed:
            return self._device_cap.power_cap_w
        return self.target.cap_at(device_time_s)


@dataclass
class PowerGuard:
    """Watches each measured region's peak power (W) against the cap in force.

    A reading over the cap steps the frequency down; one over it by more than the sensor's
    `resolution_w` counts as over the cap in the report (`over_cap_s`, the highest such reading
    and the cap it was over): a reading within a step of the sensor of the cap may be at it.
    `observe` returns the frequency level (index into the table's frequencies) to run next:
    on a reading over the cap, the highest lower level whose table peak, scaled as that
    reading is to the table, meets the cap (else the lowest); one above (never past `ceiling`, the selected level)
    after `recover_s` seconds of device time whose readings were all at least `margin` (a
    fraction) under the cap, when the table's peak at that level times the drift (the median
    ratio of the last `window` readings to the table's peak where they ran) meets the cap."""

    recover_s: float = 5.0
    margin: float = 0.02
    window: int = 20
    resolution_w: float = 0.0
    report: PowerGuardReport = field(default_factory=PowerGuardReport)
    _ratios: deque[float] = field(default_factory=deque)
    _calm_s: float = 0.0

    def drift(self) -> float:
        """Measured over table peak power, median of the recent readings (1 without readings)."""
        return statistics.median(self._ratios) if self._ratios else 1.0

    def observe(self, m: Measurement, cap_w: float | None, row: list[float | None], level: int, ceiling: int) -> int:
        """The level to run next after region `m` ran at `level` of a table row of peak powers `row` (W)."""
        r = self.report
        r.peak_power_w = max(r.peak_power_w, m.peak_power_w)
        if (table_w := row[level]) and m.steps:
            self._ratios.append(m.peak_power_w / table_w)
            while len(self._ratios) > self.window:
                self._ratios.popleft()
        if cap_w is None:
            self._calm_s = 0.0
            return level
        if m.peak_power_w > cap_w:
            if m.peak_power_w > cap_w + self.resolution_w:
                r.over_cap_s += m.elapsed_s
                if m.peak_power_w > r.peak_over_cap_w:
                    r.peak_over_cap_w, r.over_cap_w = m.peak_power_w, cap_w
            self._calm_s = 0.0
            if level > 0:
                r.step_downs += 1
                ratio = m.peak_power_w / table_w if table_w else 1.0
                fits = [k for k in range(level) if (p := row[k]) is not None and p * ratio <= cap_w]
                return fits[-1] if fits else 0
            return level
        above = row[level + 1] if level < ceiling else None
        if above is None or m.peak_power_w > cap_w * (1 - self.margin) or above * self.drift() > cap_w:
            self._calm_s = 0.0
            return level
        self._calm_s += m.elapsed_s
        if self._calm_s < self.recover_s:
            return level
        self._calm_s = 0.0
        r.step_ups += 1
        return level + 1


Cause = Literal["cap", "guard", "pause", "resume", "evidence"]
Switched = Callable[[ConfigSwitch, DeviceTotals], None]  # a switch, and the run's totals when it happened


class AdaptiveControl:
    """The step control of a fine-tune whose cap may change (see the module docstring).

    `strategy` selects from `table` for a cap; training starts at (`batch_size`,
    `frequency_hz`), selected for `cap_w`. `on_switch` sees every ConfigSwitch (also kept in
    `switches`); `while_paused` is called before each idle slice (it may raise to stop).
    With `trace`, each measured region appends (device time s, cap W, peak power W,
    frequency Hz, batch size)."""

    def __init__(
        self, device: Device, trainer: Trainer, policy: LearningRatePolicy, table: ProfileTable, strategy: Strategy,
        caps: CapFollower, cap_w: float | None, frequency_hz: int, guard: PowerGuard | None = None,
        on_switch: Switched | None = None, while_paused: Callable[[], None] | None = None,
        trace: list[tuple[float, float | None, float, int, int]] | None = None,
    ):  # fmt: skip
        self.device, self.trainer, self.policy, self.table, self.strategy = device, trainer, policy, table, strategy
        self.caps, self.cap_w, self.guard = caps, cap_w, guard or PowerGuard(resolution_w=device.power_resolution_w)
        self.on_switch, self.while_paused, self.trace = on_switch, while_paused, trace
        self.level = self.ceiling = table.frequencies_hz.index(frequency_hz)
        self.paused: str | None = None
        self.paused_s = 0.0
        self.drift_seen = 1.0  # the largest drift that ruled a whole batch size out under the cap
        self.switches: list[ConfigSwitch] = []
        self.selection: Selection | None = None  # the last selection it applied (its note: why), None: the starting one

    @property
    def frequency_hz(self) -> int:
        """The frequency training runs at now (Hz)."""
        return self.table.frequencies_hz[self.level]

    def before_step(self, run: DeviceTotals) -> None:
        """Follow the cap in force; while no configuration meets it, idle until one does."""
        cap = self.caps.cap_at(run.elapsed_s)
        if cap != self.cap_w:
            self.cap_w = cap
            self._select(run)
        while self.paused:
            if self.while_paused:
                self.while_paused()
            next_change_s = self.caps.target.next_change_s(run.elapsed_s)
            m = self.device.idle(PAUSE_SLICE_S if next_change_s is None else min(PAUSE_SLICE_S, next_change_s - run.elapsed_s))
            run.add(m)
            self.paused_s += m.elapsed_s
            if self.trace is not None:
                self.trace.append((run.elapsed_s, self.cap_w, m.peak_power_w, self.device.current_frequency(), 0))
            if (cap := self.caps.cap_at(run.elapsed_s)) != self.cap_w:
                self.cap_w = cap
                self._select(run)

    def after_step(self, m: Measurement, run: DeviceTotals) -> None:
        """Let the power guard see the region just measured, and step the frequency if it says so."""
        if self.trace is not None:
            self.trace.append((run.elapsed_s, self.cap_w, m.peak_power_w, self.frequency_hz, self.trainer.batch_size))
        row = self.table.peak_power_w[self.table.batch_sizes.index(self.trainer.batch_size)]
        level = self.guard.observe(m, self.cap_w, row, self.level, self.ceiling)
        if self.cap_w is not None and m.peak_power_w > self.cap_w and (table_w := row[self.level]):
            ratio = m.peak_power_w / table_w
            if (lower_w := row[level]) is None or lower_w * ratio > self.cap_w:
                # even the level the guard steps to is over the cap at this reading's drift: this batch size cannot meet it
                self.drift_seen = max(self.drift_seen, ratio)
                self._select(run, "guard")
                return
        if level != self.level:
            b = self.trainer.batch_size
            note = f"measured {m.peak_power_w:.2f} W" + (" over the cap" if level < self.level else "; margin held")
            self._switch(run, "guard", (b, self.frequency_hz), (b, self.table.frequencies_hz[level]), note)
            self.level = level
            self.device.set_frequency(self.frequency_hz)

    def selecting(self) -> tuple[ProfileTable, float | None]:
        """The table and the cap (W) a selection is made against now: the cap in force, with
        the table's peaks scaled by the drift (the guard's, or the largest that forced a
        selection, whichever is more). SelectionError when the table cannot select for it."""
        drift = max(self.guard.drift(), self.drift_seen)
        return self._table_for(self.cap_w), _derated(self.cap_w, drift)

    def choose(self, strategy: Strategy | None = None) -> Selection:
        """What `strategy` (default: the job's) selects now (see `selecting`). SelectionError
        when nothing can be selected."""
        return (strategy or self.strategy).choose(*self.selecting())

    def reselect(self, run: DeviceTotals, strategy: Strategy, note: str | None) -> None:
        """Adopt `strategy` for this and every later selection (cap changes, the guard) and
        select with it now: a switch with cause "evidence" and `note` (default: the choice's)
        when the configuration changes. Nothing changes while paused; the next selection uses
        `strategy`."""
        self.strategy = strategy
        if not self.paused:
            self._select(run, "evidence", note)

    def _select(self, run: DeviceTotals, cause: Cause = "cap", why: str | None = None) -> None:
        """Select for `cap_w` (see `choose`) and apply it; pause when nothing can be selected.
        A selection for evidence (`why`) that keeps the configuration is not a switch."""
        before = None if self.paused else (self.trainer.batch_size, self.frequency_hz)
        drift = max(self.guard.drift(), self.drift_seen)
        try:
            choice = self.choose()
        except SelectionError as exc:
            if not self.paused:
                self.paused = str(exc)
                self.device.set_frequency(self.table.frequencies_hz[0])
                self._switch(run, "pause", before, None, self.paused)
            return
        if cause == "evidence" and before == (choice.batch_size, choice.frequency_hz):
            return
        cause = "resume" if self.paused else cause
        self.paused = None
        set_batch_size(self.trainer, self.policy, choice.batch_size)
        self.level = self.ceiling = self.table.frequencies_hz.index(choice.frequency_hz)
        self.device.set_frequency(choice.frequency_hz)
        note = why or (f"table peaks derated by the measured drift x{drift:.2f}" if drift > 1 else choice.note)
        self.selection = choice.model_copy(update={"note": note})
        self._switch(run, cause, before, (choice.batch_size, choice.frequency_hz), note)

    def _table_for(self, cap_w: float | None) -> ProfileTable:
        if self.table.mode == "staircase" and cap_w != self.table.power_cap_w:
            raise SelectionError(
                f"the lookup table is a staircase table measured for a cap of {self.table.power_cap_w} W and cannot select "
                f"for {cap_w} W; a job whose cap changes needs a grid table (profiling.mode 'grid'); training resumes "
                "when the cap returns"
            )
        return self.table

    def _switch(self, run: DeviceTotals, cause: Cause, old: tuple[int, int] | None, new: tuple[int, int] | None,
                note: str | None) -> None:  # fmt: skip
        switch = ConfigSwitch(
            device_time_s=run.elapsed_s, samples=self.trainer.samples, cause=cause, power_cap_w=self.cap_w,
            old_batch_size=old[0] if old else None, old_frequency_hz=old[1] if old else None,
            new_batch_size=new[0] if new else None, new_frequency_hz=new[1] if new else None, note=note,
        )  # fmt: skip
        self.switches.append(switch)
        logger.info("%s switch on %s: %s", cause, self.device.device_type, switch.line().strip())
        if self.on_switch:
            self.on_switch(switch, run)


def _derated(cap_w: float | None, drift: float) -> float | None:
    """The cap to select the table's peaks against when readings run `drift` times above them."""
    return cap_w / drift if cap_w is not None and drift > 1 and math.isfinite(drift) else cap_w
