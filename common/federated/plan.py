"""Each device's configuration and local work in a round.

A device's (b, f*_b) comes from its own lookup table and cap, as for a fine-tune: equation (4)
(`Equation4`, with the job's relation vector; r_b = 1 without one: the most samples per
second under the cap) or Baseline 1. A round's local work is then either the same `local_steps`
steps for every device, so the round lasts as long as the slowest device's steps, or
time-balanced (edgetrain): every device trains for about the same device time, the time the
median device needs for `local_steps` steps, so a device slowed by its cap does fewer steps
and a fast one more, and the round no longer waits for the slowest. `baseline1-deadline`
balances time the same way at Baseline 1's configuration (each device trains until the round's
time budget: FedProx-style partial work), which separates time balancing from the (b, f) choice.
Under a fleet power budget (`local.fleet_power_w`, edgetrain) a plan that does not fit it is
chosen again by progress per joule (common/federated/budget.py).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..schemas import ProfileTable, RelationVector, Selection, Strict
from ..selection import SelectionError, strategy_for
from .budget import options, per_step, steps_within, within_budget
from .spec import DEADLINE, TIME_BALANCED, LocalWork


class Assignment(Strict):
    """What one device trains in one round: (b, f) under its cap, `local_steps` steps, and the
    device time (s) and energy (J) the table expects of them."""

    device_id: str
    device_type: str
    power_cap_w: float | None
    batch_size: int
    frequency_hz: int
    local_steps: int
    expected_time_s: float
    expected_energy_j: float | None
    strategy: str


@dataclass(frozen=True)
class DeviceInRound:
    """A device taking part in a round: its id, type, cap (W), table and power envelope."""

    device_id: str
    device_type: str
    power_cap_w: float | None
    table: ProfileTable
    power_envelope_w: list[float] | None = None


def assign(devices: Sequence[DeviceInRound], work: LocalWork, vector: RelationVector | None = None) -> list[Assignment]:
    """Every device's assignment for a round (SelectionError, naming the device, when a cap
    leaves a device no configuration; naming `local.fleet_power_w` when no plan fits it)."""
    chosen = []
    for d in devices:
        flat = vector or RelationVector.uniform(d.table.batch_sizes)
        try:
            strategy = strategy_for(work.method.removesuffix(DEADLINE), flat, power_envelope_w=d.power_envelope_w)
            choice = strategy.choose(d.table, d.power_cap_w)
        except SelectionError as exc:
            raise SelectionError(f"device {d.device_id}: {exc}") from exc
        step_s = per_step(d.table, d.table.time_s, choice)
        assert step_s is not None, "a chosen point is measured"
        chosen.append((d, choice, step_s))
    if work.method not in TIME_BALANCED:
        return [_assignment(d, c, work.local_steps) for d, c, _ in chosen]
    step_times_s = [s for *_, s in chosen]
    round_s = round_time_s(step_times_s, work)
    plan = [_assignment(d, c, k) for (d, c, _), k in zip(chosen, balanced_steps(step_times_s, work))]
    if work.fleet_power_w is None:
        return plan
    energy = [a.expected_energy_j for a in plan]
    if None not in energy and sum(e or 0.0 for e in energy) <= work.fleet_power_w * round_s:
        return plan  # it fits; a table without energy is refused by the re-plan, naming the device
    return _within_power(devices, work, vector, round_s)


def _within_power(devices: Sequence[DeviceInRound], work: LocalWork, vector: RelationVector | None, round_s: float) -> list[Assignment]:
    """The round's plan under the fleet power budget (common/federated/budget.py)."""
    assert work.fleet_power_w is not None
    device_options, by_table_and_cap = [], {}  # devices of one type under one cap share their options
    for d in devices:
        key = (id(d.table), d.power_cap_w)
        if key not in by_table_and_cap:
            try:
                flat = vector or RelationVector.uniform(d.table.batch_sizes)
                by_table_and_cap[key] = options(d.table, d.power_cap_w, flat, round_s, work.min_steps)
            except SelectionError as exc:
                raise SelectionError(f"device {d.device_id}: {exc}") from exc
        device_options.append(by_table_and_cap[key])
    plan = within_budget(device_options, work.fleet_power_w * round_s, work.min_steps, round_s)
    return [_assignment(d, o.choice, k) for d, (o, k) in zip(devices, plan)]


def _assignment(d: DeviceInRound, choice: Selection, steps: int) -> Assignment:
    step_s = per_step(d.table, d.table.time_s, choice)
    assert step_s is not None, "a chosen point is measured"
    return Assignment(
        device_id=d.device_id,
        device_type=d.device_type,
        power_cap_w=d.power_cap_w,
        batch_size=choice.batch_size,
        frequency_hz=choice.frequency_hz,
        local_steps=steps,
        expected_time_s=steps * step_s,
        expected_energy_j=None if (e := per_step(d.table, d.table.energy_j, choice)) is None else steps * e,
        strategy=choice.strategy,
    )


def round_time_s(step_times_s: list[float], work: LocalWork) -> float:
    """A time-balanced round's time budget (device s): the median device's `work.local_steps` steps."""
    return work.local_steps * statistics.median(step_times_s)


def balanced_steps(step_times_s: list[float], work: LocalWork) -> list[int]:
    """Local steps per device so that each trains about as long (device s) as the median device
    takes for `work.local_steps` steps; never fewer than `work.min_steps`."""
    budget_s = round_time_s(step_times_s, work)
    return [steps_within(budget_s, t, work.min_steps) for t in step_times_s]


def participants(available: Sequence[str], fraction: float, seed: int, round_number: int) -> list[str]:
    """A seeded choice of ceil(fraction * n) of the `available` devices (all of them at 1.0),
    different in every round, in the order given."""
    if not available:
        return []
    k = max(1, math.ceil(fraction * len(available)))
    picked = set(random.Random(f"{seed}:{round_number}").sample(sorted(available), k))
    return [d for d in available if d in picked]
