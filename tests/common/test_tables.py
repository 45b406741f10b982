"""The lookup-table policy: merging rows, what may be stored."""

import random

import pytest

from edgetrain.common.schemas import RelationVector
from edgetrain.common.selection import Baseline1
from edgetrain.common.tables import merge, missing_batch_sizes, rows_of, storable_problem
from edgetrain.common.testing.tables import B, random_monotone_table


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
