"""Whether a stored lookup table can serve a device: the reuse policy."""

from __future__ import annotations

from datetime import datetime

from .schemas import DeviceInfo, ProfileTable


def reuse_problem(
    table: ProfileTable, device: DeviceInfo, power_cap_w: float | None, not_before: datetime | None = None
) -> str | None:
    """Why `table` cannot serve `device` under `power_cap_w` (W), or None when it can.

    A table made by other software than the device runs now (edgetrain, torch, CUDA or
    JetPack versions) is not reused; nor is a staircase table made for another cap, nor one
    older than `not_before` (a forced profile)."""
    changed = {k: (table.produced_by.get(k), v) for k, v in device.software.items() if table.produced_by.get(k) != v}
    if changed:
        return f"made by other software (table, device): {changed}"
    if table.mode == "staircase" and table.power_cap_w != power_cap_w:
        return f"staircase table for cap {table.power_cap_w} W, not {power_cap_w} W"
    if not_before is not None and table.created_at < not_before:
        return "the job asks to profile again (force)"
    return None
