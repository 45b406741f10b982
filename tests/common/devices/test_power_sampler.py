import threading
import time

import pytest

from edgetrain.common.devices.base import DeviceError
from edgetrain.common.devices.power_sampler import PowerSampler, measure_steps, power_stats


def test_power_stats_uses_the_trapezoid_rule() -> None:
    stats = power_stats([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 3.0, 1.0])
    assert stats.energy_j == pytest.approx(2.0 + 3.0 + 2.0)
    assert stats.peak_w == 3.0
    assert stats.mean_w == pytest.approx(7.0 / 3.0)
    assert stats.duration_s == 3.0 and stats.samples == 4


def test_a_single_sample_has_no_energy_and_its_own_mean() -> None:
    stats = power_stats([5.0], [4.2])
    assert (stats.energy_j, stats.mean_w, stats.peak_w) == (0.0, 4.2, 4.2)


class RecordingClock:
    """time.monotonic that remembers its last reading, so a signal can be a function of the
    exact time the sampler stamps on each sample."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()

    def __call__(self) -> float:
        self.last = time.monotonic()
        return self.last


def test_ramp_signal_energy_peak_and_mean() -> None:
    """P(t) = 2 + 4 t (W) from t0: the trapezoid rule is exact on a line."""
    clock = RecordingClock()
    sampler = PowerSampler(lambda: 2.0 + 4.0 * (clock.last - clock.t0), rate_hz=50, clock=clock)
    with sampler:
        time.sleep(0.4)
    stats = sampler.stats
    assert stats is not None
    first = (stats.peak_w - 2.0) / 4.0 - stats.duration_s  # time of the first sample after t0 (s)
    a, b = first, first + stats.duration_s
    expected_energy = 2.0 * (b - a) + 2.0 * (b**2 - a**2)  # integral of 2 + 4 t from a to b (J)
    assert stats.energy_j == pytest.approx(expected_energy, rel=1e-9)
    assert stats.mean_w == pytest.approx(expected_energy / stats.duration_s, rel=1e-9)
    assert 0.0 <= first < 0.05 and stats.duration_s == pytest.approx(0.4, abs=0.15)
    assert stats.samples >= 0.4 * 50 * 0.5


def test_a_short_spike_is_caught_as_the_peak() -> None:
    t0 = time.monotonic()

    def pulse() -> float:  # 3 W, with 12 W between 0.15 s and 0.3 s
        return 12.0 if 0.15 <= time.monotonic() - t0 < 0.3 else 3.0

    with PowerSampler(pulse, rate_hz=20) as sampler:
        time.sleep(0.45)
    stats = sampler.stats
    assert stats is not None and stats.peak_w == 12.0
    assert 3.0 < stats.mean_w < 12.0


def test_start_stop_returns_stats_and_the_thread_ends() -> None:
    sampler = PowerSampler(lambda: 5.0)
    sampler.start()
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start()
    time.sleep(0.15)
    stats = sampler.stop()
    assert stats.peak_w == stats.mean_w == 5.0 and stats.energy_j == pytest.approx(5.0 * stats.duration_s)
    assert stats.samples >= 3
    assert not any(t.name == "edgetrain-power-sampler" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="not running"):
        sampler.stop()


def test_rate_below_10_hz_is_refused() -> None:
    with pytest.raises(ValueError, match="rate_hz=5"):
        PowerSampler(lambda: 1.0, rate_hz=5)


def test_a_failing_sensor_is_reported_by_stop() -> None:
    readings = iter([4.0, 4.0])

    def sensor() -> float:
        return next(readings)  # StopIteration after two reads

    sampler = PowerSampler(sensor, rate_hz=50)
    sampler.start()
    time.sleep(0.1)
    with pytest.raises(DeviceError, match="reading board power failed"):
        sampler.stop()


def test_measure_steps_times_the_steps_and_integrates_power() -> None:
    calls = []
    m = measure_steps(lambda: (calls.append(1), time.sleep(0.03)), batch_size=16, steps=4, read_power_w=lambda: 6.0)
    assert len(calls) == 4 and m.steps == 4 and m.batch_size == 16 and m.simulated is False
    assert m.elapsed_s >= 0.12
    assert m.peak_power_w == m.mean_power_w == 6.0
    assert m.energy_j == pytest.approx(6.0 * m.elapsed_s)


def test_measure_steps_prefers_an_energy_counter() -> None:
    t0 = time.monotonic()
    m = measure_steps(
        lambda: time.sleep(0.05), batch_size=1, steps=2, read_power_w=lambda: 100.0, read_energy_j=lambda: 40.0 * (time.monotonic() - t0)
    )
    assert m.mean_power_w == pytest.approx(40.0, rel=0.05)
    assert m.energy_j == pytest.approx(40.0 * m.elapsed_s, rel=0.05)
    assert m.peak_power_w == 100.0
