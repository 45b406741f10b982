"""Device profiling (docs/method.md, part 1): time T[b][f] for N_s samples and peak power P[b][f].

The columns f are the settings of the device's control axis (locked clocks, power limits,
or the driver's choice); the table records which, and the GPU clock observed at each point.

The data content does not matter, only its shape, so profiling trains on random inputs.
Peak power is stored non-decreasing in f (each point raised to the highest power measured
at a lower frequency of its row), so sensor noise never makes a higher frequency look
cheaper and the binary search of selection matches a linear scan.

A simulated device's figures come from its twin, whatever the host computes: there the first
point of each batch size runs its steps for real (the step is built and runs) and the others
time steps that do nothing on the host, so a twin's table costs |B| points of real work, not
|B| x |F|.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.data import TensorDataset

import edgetrain

from .control_axis import ClockObservation
from .devices.base import Device, Measurement
from .models import ModelEntry, build_model
from .progress import ProfilingProgress, throttled
from .schemas import LearningRatePolicy, ProfileTable, ProfilingOptions, utc_now
from .training import Trainer, make_optimizer
from .workload import measure_workload

PROFILE_CLASSES = 10
PROFILE_SAMPLES = 256  # random samples the profiling steps draw from


def software_versions() -> dict[str, str]:
    """What produced a table; a table is reused only by identical software."""
    versions = {"edgetrain": edgetrain.__version__, "torch": torch.__version__.split("+")[0]}
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
    return versions


def synthetic_data(entry: ModelEntry, classes: int, n: int = PROFILE_SAMPLES) -> TensorDataset:
    """Random inputs and labels of the model's shape: profiling times the step, whatever the data."""
    g = torch.Generator().manual_seed(0)
    if entry.task == "text":
        x = torch.randint(0, classes, (n, *entry.input_shape), generator=g)
        return TensorDataset(x, torch.randint(0, classes, (n, *entry.input_shape), generator=g))
    return TensorDataset(torch.randn(n, *entry.input_shape, generator=g), torch.randint(0, classes, (n,), generator=g))


class Profiler:
    """Measures one (batch size, frequency) point at a time on a device."""

    def __init__(self, device: Device, entry: ModelEntry, options: ProfilingOptions, lr: LearningRatePolicy):
        self.device, self.entry, self.options, self.lr = device, entry, options, lr
        self.data = synthetic_data(entry, PROFILE_CLASSES)
        model = build_model(entry.name, PROFILE_CLASSES, 0)
        self.device.bind_workload(measure_workload(entry.name, model, entry.example_input(PROFILE_CLASSES)))
        self.points = 0
        self.stepped: set[int] = set()  # batch sizes whose steps ran for real (simulated devices)

    def _trainer(self, batch_size: int) -> Trainer:
        model = build_model(self.entry.name, PROFILE_CLASSES, 0)
        data = TensorDataset(*(t.repeat_interleave(math.ceil(batch_size / PROFILE_SAMPLES), 0) for t in self.data.tensors))
        return Trainer(model, make_optimizer(model, self.lr, batch_size), batch_size, data, None, seed=0)

    def fits(self, batch_size: int) -> bool:
        """Whether a step of this batch size fits in memory (tries a step when only that tells)."""
        known = self.device.fits(batch_size)
        if known is not None:
            return known
        try:
            self._trainer(batch_size).step()
            return True
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False

    def measure(self, batch_size: int, frequency_hz: int) -> Measurement:
        """Pin `frequency_hz`, warm up, then measure `measure_batches` steps of `batch_size`
        (on a simulated device, real steps only at the first point of `batch_size`)."""
        self.device.set_frequency(frequency_hz)
        step = self._step(batch_size)
        if self.options.warmup_batches:
            self.device.run_steps(step, batch_size, self.options.warmup_batches)
        self.points += 1
        return self.device.run_steps(step, batch_size, self.options.measure_batches)

    def _step(self, batch_size: int) -> Callable[[], None]:
        """A training step of `batch_size` to time; one that does nothing where a twin's clock
        times it and a step of this batch size already ran."""
        if self.device.simulated and batch_size in self.stepped:
            return _no_step
        self.stepped.add(batch_size)
        return self._trainer(batch_size).step


def _no_step() -> None:
    """A step a twin times without the host computing it."""


def max_batch_size(fits: Callable[[int], bool], batch_sizes: list[int]) -> int | None:
    """Largest batch size that fits (memory use grows with b, so stop at the first miss)."""
    best = None
    for b in sorted(batch_sizes):
        if not fits(b):
            break
        best = b
    return best


def _monotone(row: list[float | None]) -> list[float | None]:
    out, running = [], -math.inf
    for p in row:
        if p is not None:
            running = max(running, p)
        out.append(None if p is None else running)
    return out


def grid_points(batch_sizes: list[int], frequencies_hz: list[int]) -> list[tuple[int, int]]:
    """Every (batch size, frequency) pair, batch size by batch size."""
    return [(b, f) for b in batch_sizes for f in frequencies_hz]


def staircase(
    measure_power: Callable[[int, int], float], batch_sizes: list[int], frequencies_hz: list[int], power_cap_w: float
) -> list[tuple[int, int]]:
    """The points staircase profiling measures: a path from the largest b at the lowest f,
    moving to a higher f while the power fits the cap and to the next smaller b (same f)
    when it does not; power grows with b, so a smaller b never needs a lower f. That is at
    most |B| + |F| points, plus one for each b whose first point is already over the cap
    (its f*_b is one step lower, where its time must still be measured)."""
    visited: list[tuple[int, int]] = []

    def fits(b: int, j: int) -> bool:
        visited.append((b, frequencies_hz[j]))
        return measure_power(b, frequencies_hz[j]) <= power_cap_w

    j = 0
    for b in sorted(batch_sizes, reverse=True):
        moved = False
        while j < len(frequencies_hz) and fits(b, j):
            moved, j = True, j + 1
        if not moved:  # f*_b is below the starting point: step down (noise may need more)
            k = j - 1
            while k >= 0 and not fits(b, k):
                k -= 1
            j = max(k + 1, 0)
    return visited


def staircase_bound(batch_sizes: int, frequencies: int) -> int:
    """The most points a staircase can measure: |B| + |F|, plus one per batch size whose first
    point is over the cap, and never more than the grid."""
    return min(2 * batch_sizes + frequencies, batch_sizes * frequencies)


def profile(
    device: Device,
    entry: ModelEntry,
    batch_sizes: list[int],
    options: ProfilingOptions,
    lr: LearningRatePolicy,
    power_cap_w: float | None = None,
    on_progress: Callable[[ProfilingProgress], None] | None = None,
) -> ProfileTable:
    """Profile `entry` on `device`: the full grid, or the staircase for a known cap.
    `on_progress` sees the points measured of those planned, at most about once a second
    (the first, with none measured yet, at once), and once more when every point is measured."""
    started = utc_now()
    profiler = Profiler(device, entry, options, lr)
    frequencies = device.frequencies_hz
    b_mem = max_batch_size(profiler.fits, batch_sizes)
    usable = [b for b in batch_sizes if b_mem is not None and b <= b_mem]
    measured: dict[tuple[int, int], Measurement] = {}
    staircase_mode = options.mode == "staircase" and power_cap_w is not None
    planned = staircase_bound(len(usable), len(frequencies)) if staircase_mode else len(usable) * len(frequencies)
    report = throttled(on_progress)

    def progress(done: bool = False) -> ProfilingProgress:
        return ProfilingProgress(device_type=device.device_type, model=entry.name, mode="staircase" if staircase_mode else "grid",
                                 points_measured=len(measured), points_planned=planned, started_at=started, done=done)  # fmt: skip

    def measure_power(b: int, f: int) -> float:
        if (b, f) not in measured:
            measured[(b, f)] = profiler.measure(b, f)
            report(progress())
        return measured[(b, f)].peak_power_w

    report(progress())
    try:
        if staircase_mode:
            assert power_cap_w is not None
            staircase(measure_power, usable, frequencies, power_cap_w)
        else:
            for b, f in grid_points(usable, frequencies):
                measure_power(b, f)
    finally:
        device.restore()

    def per_samples(b: int, f: int, total: float) -> float:
        """A measured total over the steps at (b, f) scaled to N_s samples."""
        return total / measured[(b, f)].steps * options.samples / b

    def table_of(value: Callable[[int, int, Measurement], float]) -> list[list[float | None]]:
        return [[value(b, f, measured[(b, f)]) if (b, f) in measured else None for f in frequencies] for b in batch_sizes]

    def observed(b: int, f: int) -> ClockObservation | None:
        return measured[(b, f)].clock if (b, f) in measured else None

    time_s = table_of(lambda b, f, m: per_samples(b, f, m.elapsed_s))
    energy_j = table_of(lambda b, f, m: per_samples(b, f, m.energy_j))
    power = [_monotone(row) for row in table_of(lambda b, f, m: m.peak_power_w)]
    if on_progress is not None:
        on_progress(progress(done=True))
    return ProfileTable(
        batch_sizes=batch_sizes,
        frequencies_hz=frequencies,
        samples=options.samples,
        time_s=time_s,
        peak_power_w=power,
        energy_j=energy_j,
        max_batch_size=b_mem,
        device_type=device.device_type,
        model=entry.name,
        input_shape=list(entry.input_shape),
        simulated=device.simulated,
        mode="staircase" if staircase_mode else "grid",
        power_cap_w=power_cap_w if staircase_mode else None,
        produced_by=software_versions() | device.software,
        points_measured=len(measured),
        control=device.control,
        observed_clock_hz=[[observed(b, f) for f in frequencies] for b in batch_sizes],
    )
