"""Background sampling of board power (and the GPU clock) and the measured region shared
by the hardware backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..control_axis import ClockObservation
from .base import DeviceError, Measurement

MIN_RATE_HZ = 10.0
DEFAULT_RATE_HZ = 20.0


@dataclass(frozen=True)
class PowerStats:
    """Power over a sampled region: duration_s (s) from first to last sample, energy_j (J,
    trapezoid rule), peak_w and mean_w (W, mean = energy / duration), samples (count);
    clock: the GPU clock read with each sample, when a clock reader was given."""

    samples: int
    duration_s: float
    energy_j: float
    peak_w: float
    mean_w: float
    clock: ClockObservation | None = None


def power_stats(times_s: list[float], powers_w: list[float]) -> PowerStats:
    """Stats of power samples `powers_w` (W) taken at monotonic times `times_s` (s)."""
    if not powers_w:
        raise ValueError("power_stats needs at least one sample")
    energy = sum((t1 - t0) * (p0 + p1) / 2 for t0, t1, p0, p1 in zip(times_s, times_s[1:], powers_w, powers_w[1:]))
    duration = times_s[-1] - times_s[0]
    mean = energy / duration if duration > 0 else powers_w[0]
    return PowerStats(samples=len(powers_w), duration_s=duration, energy_j=energy, peak_w=max(powers_w), mean_w=mean)


def clock_stats(clocks_hz: list[int]) -> ClockObservation | None:
    """Mean and range of GPU clock readings (Hz); None without readings."""
    if not clocks_hz:
        return None
    return ClockObservation(mean_hz=sum(clocks_hz) / len(clocks_hz), min_hz=min(clocks_hz), max_hz=max(clocks_hz), samples=len(clocks_hz))


class PowerSampler:
    """Samples `read_power_w()` (W), and `read_clock_hz()` (Hz) when given, on a background
    thread at `rate_hz` between start() and stop(); also a context manager whose `stats`
    holds the result after the block.

    The first sample is taken in start() and the last in stop(), so the region is covered
    end to end. A failing read stops sampling and stop() raises DeviceError.
    """

    def __init__(
        self,
        read_power_w: Callable[[], float],
        rate_hz: float = DEFAULT_RATE_HZ,
        clock: Callable[[], float] = time.monotonic,
        read_clock_hz: Callable[[], int] | None = None,
    ):
        if rate_hz < MIN_RATE_HZ:
            raise ValueError(f"rate_hz={rate_hz} is too low: at least {MIN_RATE_HZ} Hz is needed to catch power peaks")
        self._read = read_power_w
        self._read_clock = read_clock_hz
        self._period_s = 1.0 / rate_hz
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._times: list[float] = []
        self._powers: list[float] = []
        self._clocks: list[int] = []
        self._error: BaseException | None = None
        self.stats: PowerStats | None = None

    def start(self) -> None:
        """Begin a region: reset the samples, take one now and start the thread."""
        if self._thread is not None:
            raise RuntimeError("PowerSampler is already running: call stop() first")
        with self._lock:
            self._times, self._powers, self._clocks, self._error = [], [], [], None
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="edgetrain-power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> PowerStats:
        """End the region: stop the thread, take a last sample and return the stats."""
        if self._thread is None:
            raise RuntimeError("PowerSampler is not running: call start() first")
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._error is None:
            self._sample()
        if self._error is not None:
            raise DeviceError(f"reading board power failed while sampling: {self._error}") from self._error
        with self._lock:
            stats = power_stats(list(self._times), list(self._powers))
            self.stats = replace(stats, clock=clock_stats(list(self._clocks)))
        return self.stats

    def __enter__(self) -> PowerSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _sample(self) -> None:
        try:
            t, p = self._clock(), float(self._read())
            hz = int(self._read_clock()) if self._read_clock else None
        except Exception as exc:  # reported by stop()
            self._error = exc
            self._stop.set()
            return
        with self._lock:
            self._times.append(t)
            self._powers.append(p)
            if hz is not None:
                self._clocks.append(hz)

    def _run(self) -> None:
        next_t = self._clock() + self._period_s
        while not self._stop.wait(max(0.0, next_t - self._clock())):
            self._sample()
            next_t = max(next_t + self._period_s, self._clock())  # after a stall: one sample now, no burst


def _cuda_synchronize() -> Callable[[], None]:
    """torch.cuda.synchronize when CUDA is available, else a no-op (torch imported lazily)."""
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def measure_steps(
    step: Callable[[], None],
    batch_size: int,
    steps: int,
    read_power_w: Callable[[], float],
    rate_hz: float = DEFAULT_RATE_HZ,
    read_energy_j: Callable[[], float] | None = None,
    read_clock_hz: Callable[[], int] | None = None,
) -> Measurement:
    """Run `step` `steps` times with the GPU synchronised before and after, sampling power
    and, when `read_clock_hz` is given, the GPU clock (Hz) that ran them.

    Energy (J) comes from `read_energy_j` (a cumulative counter, J) when given, else it is
    the sampled mean power (W) times the elapsed time (s); peak power (W) is the sampled peak.
    """
    synchronize = _cuda_synchronize()
    synchronize()
    sampler = PowerSampler(read_power_w, rate_hz, read_clock_hz=read_clock_hz)
    sampler.start()
    try:
        energy_start = read_energy_j() if read_energy_j else 0.0
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
        energy_end = read_energy_j() if read_energy_j else 0.0
    finally:
        stats = sampler.stop()
    if read_energy_j:
        energy = energy_end - energy_start
        mean = energy / elapsed if elapsed > 0 else stats.mean_w
    else:
        energy, mean = stats.mean_w * elapsed, stats.mean_w
    return Measurement(
        steps=steps,
        batch_size=batch_size,
        elapsed_s=elapsed,
        energy_j=energy,
        peak_power_w=stats.peak_w,
        mean_power_w=mean,
        simulated=False,
        clock=stats.clock,
    )


def measure_idle(seconds: float, read_power_w: Callable[[], float], rate_hz: float = DEFAULT_RATE_HZ) -> Measurement:
    """Wait `seconds` (s) sampling board power: a measured region of no steps."""
    return replace(measure_steps(lambda: time.sleep(seconds), 0, 1, read_power_w, rate_hz), steps=0)
