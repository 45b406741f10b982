"""Profiling and selection on each control axis: the driver's choice (read-only NVML) and
the power limit (NVML with --allow-power-limit), against the fake NVML."""

import pytest

from edgetrain.common.control_axis import (
    DRIVER_CHOICE,
    ClockObservation,
    ControlAxis,
    describe_setting,
)
from edgetrain.common.devices.nvml import NvmlDevice
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile, software_versions
from edgetrain.common.schemas import (
    LearningRatePolicy,
    ProfileTable,
    ProfilingOptions,
    RelationVector,
)
from edgetrain.common.selection import Baseline1, Equation4
from edgetrain.common.testing.fake_nvml import FakeNvml

SMALL = get_model("smallcnn")
OPTIONS = ProfilingOptions(warmup_batches=0, measure_batches=2)
MHZ = 1_000_000


def test_read_only_table_is_on_the_drivers_axis_with_the_clocks_that_ran() -> None:
    nvml = FakeNvml()
    device = NvmlDevice(nvml=nvml)
    with nvml.busy():  # the GPU boosts while it trains
        table = profile(device, SMALL, [4, 16], OPTIONS, LearningRatePolicy())
    assert table.control is ControlAxis.DRIVER_CLOCK and table.frequencies_hz == [DRIVER_CHOICE]
    assert table.produced_by == software_versions() | {"nvidia_driver": "580.65.06"}
    for row in table.observed_clock_hz:
        (clock,) = row
        assert clock is not None and clock.min_hz == clock.max_hz == FakeNvml.BOOST_MHZ * MHZ
    assert FakeNvml.IDLE_MHZ * MHZ not in {c.min_hz for row in table.observed_clock_hz for c in row}
    text = describe_setting(table.control, table.frequencies_hz[0], table.observed_clock_hz[0][0])
    assert text == "driver's choice, observed 1980 MHz"
    assert ProfileTable.model_validate_json(table.model_dump_json()) == table


def test_power_limit_table_has_the_limits_as_ascending_columns_and_is_restored() -> None:
    nvml = FakeNvml()
    device = NvmlDevice(nvml=nvml, allow_power_limit=True, power_limit_step_w=100)
    with nvml.busy():
        table = profile(device, SMALL, [4, 16], OPTIONS, LearningRatePolicy())
    assert table.control is ControlAxis.POWER_LIMIT_MW
    assert table.frequencies_hz == [200_000, 300_000, 400_000, 500_000, 600_000, 700_000]
    assert nvml.limit_mw == 700_000  # put back after profiling
    for row in table.peak_power_w:  # the fake draws 250 W, held to 200 W by the lowest limit
        assert row == [200.0, 250.0, 250.0, 250.0, 250.0, 250.0]
    clocks = [c.mean_hz for c in table.observed_clock_hz[0]]
    assert clocks == sorted(clocks) and clocks[0] < clocks[-1] == FakeNvml.BOOST_MHZ * MHZ  # the driver's clock under each limit


def power_limit_table() -> ProfileTable:
    """Two batch sizes on four power limits (mW): peak power (W) and time (s) per setting."""
    return ProfileTable(
        batch_sizes=[16, 128],
        frequencies_hz=[150_000, 200_000, 250_000, 300_000],
        samples=1024,
        time_s=[[9.0, 7.0, 6.0, 5.5], [8.0, 6.0, 4.5, 4.0]],
        peak_power_w=[[100.0, 130.0, 160.0, 190.0], [140.0, 185.0, 230.0, 260.0]],
        control=ControlAxis.POWER_LIMIT_MW,
    )


def test_selection_works_unchanged_over_the_power_limit_axis() -> None:
    table = power_limit_table()
    vector = RelationVector(batch_sizes=[16, 128], ratios=[0.6, 1.0])
    choice = Equation4(vector).choose(table, 200.0)
    # f*_16 = 300 W limit (190 W peak): 5.5 * 0.6 = 3.3; f*_128 = 200 W limit (185 W): 6.0
    assert (choice.batch_size, choice.frequency_hz) == (16, 300_000)
    assert table.control.describe(choice.frequency_hz) == "300 W limit"
    uncapped = Equation4(RelationVector(batch_sizes=[16, 128], ratios=[1.0, 1.0])).choose(table, None)
    assert (uncapped.batch_size, uncapped.frequency_hz) == (128, 300_000)
    baseline = Baseline1(vector, None).choose(table, 200.0)  # the worst row sets the limit for any model
    assert (baseline.batch_size, baseline.frequency_hz) == (128, 200_000)


def test_tables_made_before_the_axis_existed_are_on_locked_clocks() -> None:
    old = power_limit_table().model_dump(mode="json")
    del old["control"], old["observed_clock_hz"]
    table = ProfileTable.model_validate(old)
    assert table.control is ControlAxis.GPU_CLOCK_HZ and table.observed_clock_hz is None
    with pytest.raises(ValueError, match="observed_clock_hz must have 2 rows"):
        ProfileTable.model_validate(old | {"observed_clock_hz": [[None] * 4]})


def test_a_locked_clock_is_described_once_unless_the_gpu_ran_elsewhere() -> None:
    pinned = ClockObservation(mean_hz=921.6e6, min_hz=921_600_000, max_hz=921_600_000, samples=5)
    assert describe_setting(ControlAxis.GPU_CLOCK_HZ, 921_600_000, pinned) == "921.6 MHz"
    held = ClockObservation(mean_hz=700e6, min_hz=614_400_000, max_hz=921_600_000, samples=5)
    assert describe_setting(ControlAxis.GPU_CLOCK_HZ, 921_600_000, held) == "921.6 MHz, observed 614.4-921.6 MHz (mean 700)"
