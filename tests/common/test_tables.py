"""The lookup-table policy: what a stored table serves (`table_need`), merging rows, what may be stored."""

import random
from datetime import timedelta

import pytest
from pydantic import ValidationError

from edgetrain.common.control_axis import ClockObservation
from edgetrain.common.schemas import DeviceInfo, ProfileTable, RelationVector, utc_now
from edgetrain.common.selection import Baseline1
from edgetrain.common.tables import NoTable, Profile, Reuse, merge, missing_batch_sizes, rows_of, storable_problem, table_need
from edgetrain.common.testing.tables import B, F, random_monotone_table


def rows(table, keep: list[int], **changes):
    return table.model_copy(update={
        "batch_sizes": [table.batch_sizes[i] for i in keep], "time_s": [table.time_s[i] for i in keep],
        "peak_power_w": [table.peak_power_w[i] for i in keep], "points_measured": 8 * len(keep),
    } | changes)  # fmt: skip


def test_merging_rows_rebuilds_the_full_table() -> None:
    full = random_monotone_table(random.Random(0)).model_copy(update={"max_batch_size": 128})
    small, large = rows(full, [0, 1, 2], max_batch_size=16), rows(full, [3, 4, 5], max_batch_size=128)
    assert missing_batch_sizes(small, B) == [32, 64, 128]
    merged = merge(small, large)
    assert merged.batch_sizes == B and merged.time_s == full.time_s and merged.peak_power_w == full.peak_power_w
    assert merged.max_batch_size == 128 and merged.points_measured == 48


def test_the_memory_limit_of_merged_rows_is_the_largest_that_fits() -> None:
    full = random_monotone_table(random.Random(1))
    small = rows(full, [0, 1, 2], max_batch_size=16)
    large = rows(full, [3, 4, 5], max_batch_size=32)  # 64 and 128 did not fit
    assert merge(small, large).max_batch_size == 32


def test_tables_measured_differently_are_not_merged() -> None:
    full = random_monotone_table(random.Random(2))
    with pytest.raises(ValueError, match="samples"):
        merge(rows(full, [0]), rows(full, [1], samples=2048))
    with pytest.raises(ValueError, match="mode, power_cap_w"):
        merge(rows(full, [0]), rows(full, [1], mode="staircase", power_cap_w=4.0))


def test_an_empty_profile_is_not_stored() -> None:
    full = random_monotone_table(random.Random(3))
    assert "no batch size of" in storable_problem(full.model_copy(update={"max_batch_size": None}))
    unmeasured = [[None] * len(full.frequencies_hz) for _ in B]
    assert "no (batch size, frequency) point" in storable_problem(
        full.model_copy(update={"max_batch_size": 4, "time_s": unmeasured, "peak_power_w": unmeasured})
    )
    assert storable_problem(full.model_copy(update={"max_batch_size": 128})) is None


def test_rows_of_keeps_the_asked_rows_and_the_memory_limit() -> None:
    full = random_monotone_table(random.Random(2)).model_copy(update={"max_batch_size": 64})
    some = rows_of(full, [8, 32, 128, 256])  # 256 is not a row
    assert some.batch_sizes == [8, 32, 128] and some.max_batch_size == 64  # 128 still does not fit
    assert some.time_s == [full.time_s[i] for i in (1, 3, 5)] and some.peak_power_w == [full.peak_power_w[i] for i in (1, 3, 5)]
    assert Baseline1(RelationVector.uniform(some.batch_sizes), None).choose(some, None).batch_size == 32
    with pytest.raises(ValueError, match="no row of batch sizes"):
        rows_of(full, [256])


def random_rows(rng: random.Random, sizes: list[int], frequencies: list[int], grids: set[str]) -> ProfileTable:
    """A table of rows `sizes` with random values (some unmeasured), every grid of `grids` and a random b_mem."""

    def grid(value) -> list[list]:
        return [[value() if rng.random() > 0.2 else None for _ in frequencies] for _ in sizes]

    clock = lambda: ClockObservation(mean_hz=rng.uniform(1, 9), min_hz=1, max_hz=9, samples=rng.randint(1, 5))  # noqa: E731
    values = {
        "time_s": grid(lambda: rng.uniform(0.1, 5)), "peak_power_w": grid(lambda: rng.uniform(1, 9)),
        "energy_j": grid(lambda: rng.uniform(0, 40)), "observed_clock_hz": grid(clock),
    }  # fmt: skip
    return ProfileTable(
        batch_sizes=sizes, frequencies_hz=frequencies, samples=512, device_type="jetson-nano", model="smallcnn",
        input_shape=[1, 28, 28], max_batch_size=rng.choice([None, *sizes]), points_measured=rng.randint(1, 40),
        **{name: values[name] for name in ("time_s", "peak_power_w") + tuple(grids)},
    )  # fmt: skip


def test_merging_random_row_sets_keeps_every_per_row_field_of_the_right_source() -> None:
    rng = random.Random(20)
    for _ in range(300):
        frequencies = sorted(rng.sample(range(100, 2000, 100), rng.randint(1, 5)))
        old_sizes, new_sizes = (sorted(rng.sample(B, rng.randint(1, len(B)))) for _ in range(2))
        optional = ("energy_j", "observed_clock_hz")
        old_grids, new_grids = ({g for g in optional if rng.random() < 0.8} for _ in range(2))
        old, new = random_rows(rng, old_sizes, frequencies, old_grids), random_rows(rng, new_sizes, frequencies, new_grids)
        merged = merge(old, new)
        assert ProfileTable.model_validate_json(merged.model_dump_json()) == merged  # it validates, and loads again
        assert merged.batch_sizes == sorted(set(old_sizes) | set(new_sizes))
        for name in ProfileTable.GRIDS:
            if getattr(old, name) is None or getattr(new, name) is None:
                assert getattr(merged, name) is None, name
                continue
            for b, row in zip(merged.batch_sizes, getattr(merged, name)):
                source = new if b in new_sizes else old
                assert row == getattr(source, name)[source.batch_sizes.index(b)], (name, b)
        fits = [b for b in merged.batch_sizes if b <= ((new if b in new_sizes else old).max_batch_size or 0)]
        assert merged.max_batch_size == max(fits, default=None)
        assert merged.points_measured == old.points_measured + new.points_measured
        keep = rng.sample(merged.batch_sizes, rng.randint(1, len(merged.batch_sizes)))
        some = rows_of(merged, keep)
        assert ProfileTable.model_validate_json(some.model_dump_json()) == some and some.batch_sizes == sorted(keep)
        for name in ProfileTable.GRIDS:
            assert getattr(some, name) == (None if getattr(merged, name) is None else
                                           [getattr(merged, name)[merged.batch_sizes.index(b)] for b in sorted(keep)])  # fmt: skip


def test_a_job_adding_a_row_keeps_the_clock_readings_of_every_row() -> None:
    rng = random.Random(1)  # the case seen: rows 16 and 64 stored, row 32 profiled for another job
    stored, added = random_rows(rng, [16, 64], [100, 200], {"observed_clock_hz"}), random_rows(rng, [32], [100, 200], {"observed_clock_hz"})
    merged = merge(stored, added)
    assert merged.batch_sizes == [16, 32, 64] and len(merged.observed_clock_hz) == 3
    assert merged.observed_clock_hz[1] == added.observed_clock_hz[0] and merged.observed_clock_hz[2] == stored.observed_clock_hz[1]


def test_the_per_row_fields_come_from_the_model() -> None:
    assert ProfileTable.GRIDS == ("time_s", "peak_power_w", "energy_j", "observed_clock_hz")
    assert RelationVector.PER_BATCH_SIZE == ("ratios", "samples_mean", "samples_std", "censored")
    with pytest.raises(ValueError, match="samples_mean must have one value per batch size"):
        RelationVector(batch_sizes=[4, 8], ratios=[0.5, 1.0], samples_mean=[10.0])


def test_a_merge_that_would_not_validate_raises_instead_of_returning_a_table() -> None:
    rng = random.Random(2)
    stored = random_rows(rng, [16, 64], [100, 200], set())
    skewed = random_rows(rng, [32], [100, 200], set()).model_copy(update={"time_s": [[1.0]]})  # 1 value for 2 frequencies
    with pytest.raises(ValidationError, match="time_s must have 3 rows .* of 2 values"):
        merge(stored, skewed)
    with pytest.raises(ValueError, match="simulated"):  # every field not per row must match, a field added later included
        merge(stored, random_rows(rng, [32], [100, 200], set()).model_copy(update={"simulated": True}))


def test_table_need_reuses_profiles_missing_rows_profiles_anew_or_fails_in_one_rule() -> None:
    device = DeviceInfo(device_id="d", device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True)
    full = random_monotone_table(random.Random(0)).model_copy(update={"max_batch_size": 128})
    small = rows(full, [0, 1, 2], max_batch_size=16)
    stairs = full.model_copy(update={"mode": "staircase", "power_cap_w": 4.0})
    assert table_need(full, device, B, None) == Reuse(full)
    assert table_need(None, device, B, None) == Profile(B, merge=False, why=None)
    assert table_need(small, device, B, None) == Profile([32, 64, 128], merge=True, why=None, stored_at=small.created_at)
    assert table_need(stairs, device, B, 5.0).why == "staircase table for cap 4.0 W, not 5.0 W"
    assert table_need(stairs, device, B, 4.0) == Reuse(stairs)
    assert table_need(stairs, device, B, 4.0, grid=True).why == "a full grid is asked for, the stored table is a staircase"
    assert "force" in table_need(full, device, B, None, not_before=utc_now() + timedelta(seconds=1)).why
    # a failure for the job ends it only where the stored table cannot serve
    assert table_need(full, device, B, None, failure="profiling failed") == Reuse(full)
    for unusable in (None, small, stairs):
        assert table_need(unusable, device, B, 5.0, failure="profiling failed") == NoTable("profiling failed")
