"""Whether a stored lookup table can serve a device (the reuse policy), what to do when it
cannot (`table_need`: the one rule the job planner, the federated planner, `edgetrain
profile` and `edgetrain evaluate` follow), and merging, checking and cutting tables."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .schemas import DeviceInfo, ProfileTable


@dataclass(frozen=True)
class Reuse:
    """The stored table serves."""

    table: ProfileTable


@dataclass(frozen=True)
class Profile:
    """Profile the batch sizes `rows`: merged into the stored table (`merge`: it lacks only
    them), or a new table; `why` says why the stored one is not reused (None: none is stored),
    `stored_at` when the stored one was made (None: none is)."""

    rows: list[int]
    merge: bool
    why: str | None
    stored_at: datetime | None = None


@dataclass(frozen=True)
class NoTable:
    """Producing the table failed for this job: `reason` says why."""

    reason: str


TableNeed = Reuse | Profile | NoTable


def table_need(
    table: ProfileTable | None, device: DeviceInfo, batch_sizes: list[int], power_cap_w: float | None, failure: str | None = None,
    not_before: datetime | None = None, grid: bool = False,
) -> TableNeed:  # fmt: skip
    """What serving `batch_sizes` on `device` under `power_cap_w` (W) needs of the stored
    `table` (None: none stored): reuse it, profile the rows it lacks (merged into it), or
    profile anew when it cannot serve (`reuse_problem`); `NoTable` when it cannot serve and
    producing it failed for this job (`failure`, the reason). `not_before`: a table older than
    this is not reused (a forced profile); `grid`: a staircase table is not reused."""
    why = "not stored" if table is None else reuse_problem(table, device, power_cap_w, not_before, grid)
    missing = missing_batch_sizes(table, batch_sizes) if table is not None and why is None else []
    if table is not None and why is None and not missing:
        return Reuse(table)
    if failure:
        return NoTable(failure)
    stored_at = table.created_at if table is not None else None
    if missing:
        return Profile(missing, merge=True, why=None, stored_at=stored_at)
    return Profile(list(batch_sizes), merge=False, why=None if table is None else why, stored_at=stored_at)


def reuse_problem(
    table: ProfileTable, device: DeviceInfo, power_cap_w: float | None, not_before: datetime | None = None, grid: bool = False
) -> str | None:
    """Why `table` cannot serve `device` under `power_cap_w` (W), or None when it can.

    A table made on another control axis (locked clocks, power limits, the driver's choice) or
    by other software than the device runs now (edgetrain, torch, CUDA or JetPack versions) is
    not reused; nor is a staircase table made for another cap (or at all, with `grid`), nor one
    older than `not_before` (a forced profile)."""
    if grid and table.mode != "grid":
        return "a full grid is asked for, the stored table is a staircase"
    if table.control != device.control:
        return f"made on the {table.control.value} axis, the device uses {device.control.value}"
    changed = {k: (table.produced_by.get(k), v) for k, v in device.software.items() if table.produced_by.get(k) != v}
    if changed:
        return f"made by other software (table, device): {changed}"
    if table.mode == "staircase" and table.power_cap_w != power_cap_w:
        return f"staircase table for cap {table.power_cap_w} W, not {power_cap_w} W"
    if not_before is not None and table.created_at < not_before:
        return "asked to profile again (force)"
    return None


def missing_batch_sizes(table: ProfileTable, batch_sizes: list[int]) -> list[int]:
    """The batch sizes a job needs that the table has no row for."""
    return [b for b in batch_sizes if b not in table.batch_sizes]


def fitting_rows(table: ProfileTable) -> list[int]:
    """The table's batch sizes that fit in memory (b <= b_mem)."""
    return [b for b in table.batch_sizes if table.max_batch_size is not None and b <= table.max_batch_size]


ROWS = ("batch_sizes", *ProfileTable.GRIDS)  # one entry per batch size
COMBINED = ("max_batch_size", "points_measured", "created_at")  # recomputed by a merge


def merge(old: ProfileTable, new: ProfileTable) -> ProfileTable:
    """`old` with the rows of `new` added (a row of `new` replaces the same row of `old`): every
    per-row field (`ROWS`) row by row, a grid that either lacks left out; validated.

    ValueError when they were not measured alike (any other field but `COMBINED` differs:
    frequencies, N_s, mode and cap, software...): such rows cannot be compared, and `new`
    alone is stored instead."""
    differ = [f for f in ProfileTable.model_fields if f not in ROWS + COMBINED and getattr(old, f) != getattr(new, f)]
    if differ:
        raise ValueError(f"tables measured differently ({', '.join(differ)}): not merged")
    rows = {b: (old, old.batch_sizes.index(b)) for b in old.batch_sizes}
    rows |= {b: (new, new.batch_sizes.index(b)) for b in new.batch_sizes}
    sizes = sorted(rows)
    fits = set(fitting_rows(old)) - set(new.batch_sizes) | set(fitting_rows(new))

    def column(name: str) -> list | None:
        if getattr(old, name) is None or getattr(new, name) is None:
            return None
        return [getattr(rows[b][0], name)[rows[b][1]] for b in sizes]

    return new.validated_copy(
        **{name: column(name) for name in ProfileTable.GRIDS},
        batch_sizes=sizes,
        max_batch_size=max(fits) if fits else None,
        points_measured=(old.points_measured or 0) + (new.points_measured or 0),
    )


def storable_problem(table: ProfileTable) -> str | None:
    """Why a freshly profiled table must not be stored (it would replace a good one with
    nothing), or None."""
    if table.max_batch_size is None:
        return f"no batch size of {table.batch_sizes} fits in the memory of the {table.device_type}"
    if table.measured_points() == 0:
        return "no (batch size, frequency) point was measured"
    return None


def rows_of(table: ProfileTable, batch_sizes: list[int]) -> ProfileTable:
    """`table` with only its rows of `batch_sizes` (b_mem unchanged: it still excludes the rows
    that do not fit)."""
    keep = [i for i, b in enumerate(table.batch_sizes) if b in batch_sizes]
    if not keep:
        raise ValueError(f"the lookup table has no row of batch sizes {batch_sizes} (rows {table.batch_sizes})")

    def pick(values: list | None) -> list | None:
        return None if values is None else [values[i] for i in keep]

    return table.validated_copy(**{name: pick(getattr(table, name)) for name in ROWS})
