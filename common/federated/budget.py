"""A fleet power budget for time-balanced rounds (`local.fleet_power_w`).

Time-balanced, every device of a round trains for the round's time budget T (s) at its
equation (4) choice: the most progress the round can make, and the fast devices fill their slack
with more steps. Under a budget of P watts the round's devices together may spend at most P * T
joules on their steps, and each device chooses, among every measured (b, f) under its own cap,
between more local steps and a lower frequency by progress per joule. A step at batch size b
makes b / r_b of progress (samples, relative to what b needs to reach the target); a device
trains one (b, f) for k steps, min_steps <= k <= what fits in T. That is a knapsack with one
choice per device: each device starts at its least energy, and the moves up its hull of
progress over energy are taken across the fleet in order of progress per extra joule while
they fit; what is then left is spent device by device (within 5 % of the best plan on each of 60
seeded three-device fleets checked against every plan: tests/common/test_federated.py).
The time-balanced plan is kept as it is when it fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..schemas import ProfileTable, RelationVector, Selection
from ..selection import SelectionError, measured_points

STRATEGY = "fleet_power"
T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One (b, f) a device may train at: its selection, one step's energy (J) and progress
    (b / r_b), and the most steps that fit the round's time budget."""

    choice: Selection
    step_j: float
    progress: float
    steps: int


def steps_within(round_s: float, step_s: float, min_steps: int) -> int:
    """The steps of `step_s` (s) each that fill a round's time budget `round_s` (s), rounded,
    never fewer than `min_steps`: a time-balanced device's local work."""
    return max(min_steps, round(round_s / step_s))


def per_step(table: ProfileTable, values: list[list[float | None]] | None, choice: Selection) -> float | None:
    """A table value for N_s samples at the chosen point, per step of its batch size."""
    if values is None:
        return None
    value = values[table.batch_sizes.index(choice.batch_size)][table.frequencies_hz.index(choice.frequency_hz)]
    return None if value is None else value * choice.batch_size / table.samples


def options(table: ProfileTable, cap_w: float | None, vector: RelationVector, round_s: float, min_steps: int) -> list[Option]:
    """Every measured (b, f) of `table` under the cap `cap_w` (W) with its per-step figures
    (SelectionError without energy in the table or without a point under the cap)."""
    found = []
    for s in measured_points(STRATEGY, table, vector, cap_w):
        step_s, step_j, ratio = per_step(table, table.time_s, s), per_step(table, table.energy_j, s), vector.ratio(s.batch_size)
        assert step_s is not None and step_j is not None and ratio is not None, "measured_points returns measured points"
        found.append(Option(s, step_j, s.batch_size / ratio, steps_within(round_s, step_s, min_steps)))
    return found


def energy_j(plan: Sequence[tuple[Option, int]]) -> float:
    """The energy a plan's steps take (J)."""
    return sum(o.step_j * k for o, k in plan)


def hull(device_options: Sequence[Option], min_steps: int) -> list[tuple[Option, int]]:
    """A device's (option, steps) on the upper hull of progress over energy, from its least
    energy (`min_steps` steps at its most frugal option) to its most progress: each next one
    adds less progress per extra joule. A step count between an option's fewest and most lies
    on the line between them, so only those two of each option can be corners."""
    points = sorted(((o, k) for o in device_options for k in {min_steps, o.steps}),
                    key=lambda p: (p[0].step_j * p[1], -p[0].progress * p[1]))  # fmt: skip
    corners: list[tuple[Option, int]] = []
    for o, k in points:
        if corners and o.progress * k <= corners[-1][0].progress * corners[-1][1]:
            continue  # no more progress for more energy
        while len(corners) >= 2 and _slope(corners[-2], corners[-1]) <= _slope(corners[-1], (o, k)):
            corners.pop()
        corners.append((o, k))
    return corners


def _slope(a: tuple[Option, int], b: tuple[Option, int]) -> float:
    """Progress per extra joule from `a` to `b`."""
    return (b[0].progress * b[1] - a[0].progress * a[1]) / (b[0].step_j * b[1] - a[0].step_j * a[1])


def _per_options(device_options: Sequence[Sequence[Option]], compute: Callable[[Sequence[Option]], T]) -> list[T]:
    """`compute(options)` for each device, once per distinct options list (the devices of one
    type under one cap are given the same list)."""
    done: dict[int, T] = {}
    for opts in device_options:
        if id(opts) not in done:
            done[id(opts)] = compute(opts)
    return [done[id(opts)] for opts in device_options]


def within_budget(device_options: Sequence[Sequence[Option]], allowed_j: float, min_steps: int, round_s: float) -> list[tuple[Option, int]]:
    """The plan whose steps take at most `allowed_j` (J) with the most progress the greedy
    finds: every device starts at its least energy, and the hulls' moves are taken in order of
    progress per extra joule while they fit (a device whose move does not fit moves no further,
    but as many more steps as fit when the move only adds steps of the same option); what is
    left is then spent (`spend_rest`). SelectionError naming `local.fleet_power_w` when
    even the least energy of every device is more."""
    hulls = _per_options(device_options, lambda opts: hull(opts, min_steps))
    plan = [h[0] for h in hulls]
    least_j = energy_j(plan)
    if least_j > allowed_j:
        raise SelectionError(
            f"local.fleet_power_w: {allowed_j / round_s:.4g} W over the round's time budget of {round_s:.4g} s allows "
            f"{allowed_j:.4g} J; its {len(device_options)} devices need at least {least_j / round_s:.4g} W "
            f"({min_steps} step(s) each at its most frugal configuration): raise the budget or lower local.min_steps"
        )
    left_j, stuck = allowed_j - least_j, set()
    moves = sorted(((_slope(h[i - 1], h[i]), d, i) for d, h in enumerate(hulls) for i in range(1, len(h))), key=lambda m: -m[0])
    for _, d, i in moves:
        if d in stuck:
            continue
        (option, steps), (now, k) = hulls[d][i], plan[d]
        if option.step_j * steps - now.step_j * k > left_j:
            stuck.add(d)
            if option != now:
                continue
            steps = k + int(left_j / option.step_j)  # a move along one option's steps can stop part-way
        left_j -= option.step_j * steps - now.step_j * k
        plan[d] = (option, steps)
    return spend_rest(device_options, plan, allowed_j, min_steps)


def spend_rest(
    device_options: Sequence[Sequence[Option]], plan: list[tuple[Option, int]], allowed_j: float, min_steps: int
) -> list[tuple[Option, int]]:
    """`plan` with what `allowed_j` (J) leaves spent: one device after another (most progress
    per joule first) takes the (b, f) and steps that add the most progress within what is left."""
    plan, left_j = list(plan), allowed_j - energy_j(plan)
    best_rate = _per_options(device_options, lambda opts: max(o.progress / o.step_j for o in opts))
    order = sorted(range(len(plan)), key=lambda i: -best_rate[i])
    for i in order:
        current, k = plan[i]
        spent_j, made = current.step_j * k, current.progress * k
        best = (made, current, k)
        for o in device_options[i]:
            steps = min(o.steps, int((left_j + spent_j) / o.step_j))
            if steps >= min_steps and o.progress * steps > best[0]:
                best = (o.progress * steps, o, steps)
        _, option, steps = best
        left_j -= option.step_j * steps - spent_j
        plan[i] = (option, steps)
    return plan
