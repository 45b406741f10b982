"""Caps that change while fine-tuning: the cap in force, the power guard, and re-selection
at step boundaries on a replayed table (deterministic time and power, SIMULATED)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.data import TensorDataset

from edgetrain.common.devices.base import Measurement
from edgetrain.common.finetune.adaptive import AdaptiveControl, CapFollower, PowerGuard
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceCap, DeviceTarget, JobSpec, LearningRatePolicy, ProfileTable, RelationVector
from edgetrain.common.selection import Equation4
from edgetrain.common.testing.devices import RecordedDevice, ReplayDevice
from edgetrain.common.training import Trainer, make_optimizer, train_to_accuracy

# b=32 is fastest at every frequency it can afford; each cap below picks another point.
TABLE = ProfileTable(
    batch_sizes=[8, 32], frequencies_hz=[100, 200, 300], samples=1000,
    time_s=[[3.0, 2.0, 1.5], [2.5, 1.2, 1.0]], peak_power_w=[[2.0, 3.0, 4.0], [3.0, 4.0, 5.0]], max_batch_size=32,
)  # fmt: skip
VECTOR = RelationVector.uniform([8, 32])
POLICY = LearningRatePolicy(lr_ref=0.02)


def cap(w: float | None, version: int) -> DeviceCap:
    return DeviceCap(power_cap_w=w, version=version, set_at=datetime.now(timezone.utc))


def test_schedule_gives_the_cap_in_force_and_a_newer_device_cap_overrides_it_until_the_next_step() -> None:
    target = DeviceTarget(device_id="d", power_cap_w=6.0, power_cap_schedule=[[10, 3.5], [20, None]])
    assert [target.cap_at(t) for t in (0, 9.9, 10, 19, 20, 99)] == [6.0, 6.0, 3.5, 3.5, None, None]
    stored = [cap(2.0, 4)]  # set before the fine-tune started: not followed
    follower = CapFollower(target, lambda: stored[-1], poll_s=0.0)
    assert follower.cap_at(0) == 6.0
    stored.append(cap(4.5, 5))  # set while it runs: followed at once
    assert follower.cap_at(1) == 4.5 and follower.cap_at(9) == 4.5
    assert follower.cap_at(10) == 3.5  # the schedule's next step overrides it
    stored.append(cap(None, 6))
    assert follower.cap_at(11) is None and follower.cap_at(20) is None


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[5, 3.0], [5, 4.0]], "strictly increasing"),
        ([[-1, 3.0]], "non-negative"),
        ([[0, 0.0]], "above 0 W"),
        ([[0, "x"]], "power_cap_schedule"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(schedule, message) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        DeviceTarget(device_id="d", power_cap_schedule=schedule)
    assert "power_cap_schedule" in str(info.value)


def test_a_schedule_needs_a_grid_table() -> None:
    job = quick_job([{"device_id": "n", "power_cap_schedule": [[0, 5.0], [30, 3.5]]}], profiling={"mode": "staircase"})
    with pytest.raises(ValidationError, match=r"devices.0.power_cap_schedule: a cap that changes needs a grid table"):
        JobSpec.model_validate(job)
    assert JobSpec.model_validate(job | {"profiling": {"mode": "grid"}}).devices[0].cap_at(40) == 3.5


def region(peak_w: float, elapsed_s: float = 1.0) -> Measurement:
    return Measurement(1, 32, elapsed_s, peak_w * elapsed_s, peak_w, peak_w, True)


def test_guard_steps_down_at_once_on_an_over_cap_reading_and_up_after_a_sustained_margin() -> None:
    guard, row = PowerGuard(recover_s=3.0), TABLE.peak_power_w[1]
    assert guard.observe(region(4.9), 5.0, row, 2, 2) == 2
    assert guard.observe(region(5.4), 5.0, row, 2, 2) == 1  # one level down at once
    assert guard.report.step_downs == 1 and guard.report.over_cap_s == 1.0 and guard.report.peak_over_cap_w == 5.4
    levels = [guard.observe(region(3.9), 5.0, row, 1, 2) for _ in range(3)]  # a transient: readings back at the table
    assert levels == [1, 1, 2] and guard.report.step_ups == 1


def test_a_reading_within_the_sensor_s_resolution_of_the_cap_steps_down_but_is_not_over_it() -> None:
    guard, row = PowerGuard(recover_s=3.0, resolution_w=0.1), TABLE.peak_power_w[1]
    assert guard.observe(region(5.05), 5.0, row, 2, 2) == 1  # the guard keeps on the safe side
    assert guard.report.over_cap_s == 0 and guard.report.peak_over_cap_w == 0 and guard.report.over_cap_w is None
    guard.observe(region(5.3), 5.0, row, 1, 2)
    assert guard.report.over_cap_s == 1.0 and (guard.report.peak_over_cap_w, guard.report.over_cap_w) == (5.3, 5.0)


def test_guard_stays_down_while_the_drift_would_put_the_level_above_over_the_cap() -> None:
    guard, row = PowerGuard(recover_s=1.0), TABLE.peak_power_w[1]
    assert guard.observe(region(5.5), 5.0, row, 2, 2) == 1  # +10 % over the table
    assert [guard.observe(region(4.4), 5.0, row, 1, 2) for _ in range(5)] == [1] * 5  # 5.0 W x 1.1 > 5 W above
    assert guard.drift() == pytest.approx(1.1)


class DriftingDevice(ReplayDevice):
    """The replayed table, with every reading `factor` times higher from step `after` on."""

    def __init__(self, table: ProfileTable, after: int, factor: float):
        super().__init__(table)
        self.after, self.factor, self.steps = after, factor, 0

    def run_steps(self, step, batch_size, steps):
        m = super().run_steps(step, batch_size, steps)
        self.steps += steps
        k = self.factor if self.steps > self.after else 1.0
        return Measurement(m.steps, m.batch_size, m.elapsed_s, m.energy_j * k, m.peak_power_w * k, m.mean_power_w * k, True)


def linear_task(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x[:1536], y[:1536]), TensorDataset(x[1536:], y[1536:])


def adaptive_run(target: DeviceTarget, device: RecordedDevice, table: ProfileTable = TABLE, max_samples: int = 3000,
                 caps: list[DeviceCap] | None = None, guard: PowerGuard | None = None, vector: RelationVector = VECTOR):  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    choice = Equation4(vector).choose(table, target.cap_at(0))
    train, test = linear_task()
    trainer = Trainer(model, make_optimizer(model, POLICY, choice.batch_size), choice.batch_size, train, test, seed=0,
                      device=torch.device("cpu"))  # fmt: skip
    device.set_frequency(choice.frequency_hz)
    follower = CapFollower(target, lambda: caps[-1] if caps else None, poll_s=0.0)
    control = AdaptiveControl(device, trainer, POLICY, table, Equation4(vector), follower, target.cap_at(0),
                              choice.frequency_hz, guard=guard, trace=[])  # fmt: skip
    outcome, totals = train_to_accuracy(trainer, 0.999, 256, max_samples, 0, device, control=control)
    return control, trainer, totals


def test_a_cap_change_mid_run_switches_configuration_and_keeps_the_accuracy_progress() -> None:
    device = ReplayDevice(TABLE)
    target = DeviceTarget(device_id="d", power_cap_w=5.0, power_cap_schedule=[[1.0, 3.0]])
    control, trainer, totals = adaptive_run(target, device)
    [switch] = control.switches
    assert (switch.cause, switch.power_cap_w) == ("cap", 3.0)
    assert (switch.old_batch_size, switch.old_frequency_hz, switch.new_batch_size, switch.new_frequency_hz) == (32, 300, 8, 200)
    assert 1.0 <= switch.device_time_s < 1.0 + 0.032 + 1e-9  # at the first step boundary past the change
    assert trainer.batch_size == 8 and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(POLICY.lr_for(8))
    assert device.frequency_hz == 200
    assert int(trainer.optimizer.state_dict()["state"][0]["step"]) == trainer.steps  # one optimizer, never reset
    before = [a for s, a in totals.history if s <= switch.samples]
    after = [a for s, a in totals.history if s > switch.samples]
    assert before[-1] > before[0] + 0.2  # it had learned before the switch ...
    assert after[0] >= before[-1] - 0.05  # ... and went on from there
    assert all(b <= 3.0 for _, c, b, _, _ in control.trace if c == 3.0)  # never over the new cap


def test_a_cap_below_every_configuration_pauses_at_idle_clocks_and_resumes_when_it_rises() -> None:
    device = ReplayDevice(TABLE)
    target = DeviceTarget(device_id="d", power_cap_w=5.0, power_cap_schedule=[[0.5, 1.0], [3.0, 4.0]])
    control, trainer, totals = adaptive_run(target, device)
    assert [s.cause for s in control.switches] == ["pause", "resume"]
    pause, resume = control.switches
    assert "power cap 1.00 W is below what any configuration needs" in pause.note and pause.new_batch_size is None
    assert resume.power_cap_w == 4.0 and (resume.new_batch_size, resume.new_frequency_hz) == (32, 200)
    assert resume.samples == pause.samples  # nothing trained, nothing lost while paused
    # idle from the pause to the schedule's step at 3 s, not a slice later
    assert control.paused_s == pytest.approx(3.0 - pause.device_time_s) and resume.device_time_s == pytest.approx(3.0)
    paused = [f for t, c, _, f, b in control.trace if c == 1.0]
    assert paused and set(paused) == {100}  # the lowest frequency while paused
    assert control.paused is None and trainer.samples > resume.samples


def test_a_device_cap_set_while_running_is_followed_and_a_staircase_table_pauses_for_another_cap() -> None:
    stairs = TABLE.model_copy(update={"mode": "staircase", "power_cap_w": 5.0})
    target = DeviceTarget(device_id="d", power_cap_w=5.0, power_cap_schedule=[[1.0, 4.0], [4.0, 5.0]])
    control, trainer, _ = adaptive_run(target, ReplayDevice(stairs), table=stairs, max_samples=3000)
    assert [s.cause for s in control.switches] == ["pause", "resume"]
    assert "staircase table measured for a cap of 5.0 W" in control.switches[0].note
    assert "grid" in control.switches[0].note
    assert control.switches[1].power_cap_w == 5.0  # back at the table's cap
    caps = [cap(4.5, 1)]  # a cap set on the device while it runs (after the one seen at start)
    target = DeviceTarget(device_id="d", power_cap_w=5.0)
    torch.manual_seed(0)
    control, trainer, _ = adaptive_run(target, ReplayDevice(TABLE), max_samples=1000, caps=caps)
    assert control.switches == []  # version 1 was there before it started


def test_the_guard_steps_down_on_an_injected_drift_and_the_run_goes_on_under_the_cap() -> None:
    device = DriftingDevice(TABLE, after=20, factor=1.1)
    target = DeviceTarget(device_id="d", power_cap_w=5.0)
    control, trainer, totals = adaptive_run(target, device, max_samples=3000)
    report = control.guard.report
    assert report.step_downs == 1 and report.step_ups == 0
    assert report.peak_over_cap_w == pytest.approx(5.5) and report.over_cap_s == pytest.approx(0.032)
    [switch] = control.switches
    assert (switch.cause, switch.old_frequency_hz, switch.new_frequency_hz) == ("guard", 300, 200)
    assert device.frequency_hz == 200 and trainer.samples == 3008


def test_over_the_cap_at_the_lowest_frequency_selects_a_smaller_batch_or_pauses() -> None:
    favour_32 = RelationVector(batch_sizes=[8, 32], ratios=[1.0, 0.5])  # b=32 at 100 Hz (3.0 W) under 3.05 W
    control, trainer, _ = adaptive_run(DeviceTarget(device_id="d", power_cap_w=3.05), DriftingDevice(TABLE, after=20, factor=1.1),
                                       vector=favour_32)  # fmt: skip
    [switch] = control.switches  # 3.3 W measured at the lowest frequency: b=32 cannot meet 3.05 W
    assert (switch.cause, switch.old_batch_size, switch.new_batch_size, switch.new_frequency_hz) == ("guard", 32, 8, 100)
    assert "drift x1.10" in switch.note and trainer.batch_size == 8
    assert all(p <= 3.05 for t, _, p, _, _ in control.trace if t > switch.device_time_s)
    # under 2.1 W nothing meets the cap at that drift (b=8 at 100 Hz reads 2.2 W): it pauses until the cap rises
    rising = DeviceTarget(device_id="d", power_cap_w=2.1, power_cap_schedule=[[3.0, 4.0]])
    paused, trainer, _ = adaptive_run(rising, DriftingDevice(TABLE, after=20, factor=1.1), max_samples=1000)
    assert [s.cause for s in paused.switches][:2] == ["pause", "resume"]
    pause, resume = paused.switches[:2]
    assert "below what any configuration needs" in pause.note and resume.power_cap_w == 4.0
    over = [(t, p) for t, c, p, _, b in paused.trace if b and c is not None and p > c]
    assert over == [(pause.device_time_s, pytest.approx(2.2))]  # the one reading that made it pause; none after resuming
