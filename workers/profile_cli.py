"""`edgetrain profile run|show`: profile a model on a fleet device, and show a stored lookup table.

`run` follows the workflow's protocol: it claims `table:<tid>` before dispatching
`edgetrain.profile_device` to the device's queue (the task releases the claim), and when the
claim is already held it waits for that profiling instead of starting another.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgetrain.common.models import ModelEntry
    from edgetrain.common.schemas import DeviceInfo, ProfileTable
    from edgetrain.common.store import Store

POLL_S = 0.5
DEFAULT_TIMEOUT_S = 3600.0


class ProfilingFailed(RuntimeError):
    """The device worker recorded why profiling failed."""


def _batch_sizes(text: str) -> list[int]:
    """Parse '4,8,16' into sorted unique positive batch sizes."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 4,8,16, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return values


def _status(text: str) -> None:
    """Progress messages go to stderr, so stdout holds only the result (text or JSON)."""
    print(text, file=sys.stderr, flush=True)


def describe(table: ProfileTable) -> str:
    """One line: which table, how it was profiled, how much of it was measured."""
    from edgetrain.common.plotting import measured_points
    from edgetrain.common.store import table_id

    tid = table_id(table.device_type, table.model, table.input_shape)
    mode = f"staircase for cap {table.power_cap_w} W" if table.mode == "staircase" else "grid"
    total = len(table.batch_sizes) * len(table.frequencies_hz)
    origin = "SIMULATED (figures from a twin)" if table.simulated else "measured on the device"
    return (
        f"table {tid}: {mode}, {measured_points(table)} of {total} points measured, "
        f"b_mem = {table.max_batch_size}, N_s = {table.samples} samples, "
        f"created {table.created_at:%Y-%m-%d %H:%M:%S %Z}, {origin}"
    )


def format_table(table: ProfileTable) -> str:
    """Both lookup tables as text grids, '-' for unmeasured points."""
    limit = table.max_batch_size
    header = "b \\ f MHz" + "".join(f"{f / 1e6:>9g}" for f in table.frequencies_hz)
    lines = [describe(table)]
    for name, values, fmt in (
        ("peak board power P[b][f] (W)", table.peak_power_w, ".2f"),
        (f"time T[b][f] for N_s = {table.samples} samples (s)", table.time_s, ".4g"),
    ):
        lines += ["", name, header]
        for b, row in zip(table.batch_sizes, values):
            cells = "".join(f"{'-' if v is None else format(v, fmt):>9}" for v in row)
            lines.append(f"{b:>9}{cells}" + ("  does not fit in memory" if limit is not None and b > limit else ""))
    return "\n".join(lines)


def _result(table: ProfileTable, as_json: bool) -> int:
    print(table.model_dump_json(indent=2) if as_json else describe(table))
    return 0


def _reuse_problem(current: ProfileTable, info: DeviceInfo, args: argparse.Namespace) -> str | None:
    """Why the stored table does not serve this request, or None when it is reused."""
    from edgetrain.tasks.workflow import table_problem

    if args.force:
        return "--force profiles again"
    if args.grid and current.mode != "grid":
        return "--grid asks for the full grid, the stored table is a staircase"
    return table_problem(current, info, args.power_cap_w)


def _new_table(s: Store, tid: str, before: datetime | None) -> ProfileTable | None:
    """The table once its created_at differs from `before`; raises ProfilingFailed on a failure."""
    from edgetrain.tasks.workflow import table_resource

    table = s.table(tid)
    if table is not None and table.created_at != before:
        return table
    reason = s.failure(table_resource(tid))
    if reason:
        raise ProfilingFailed(reason)
    return None


def _dispatch(info: DeviceInfo, entry: ModelEntry, args: argparse.Namespace, redis_url: str) -> None:
    """Send `edgetrain.profile_device` to the device's queue; the caller holds the claim."""
    from edgetrain.common.schemas import PAPER_BATCH_SIZES, LearningRatePolicy, ProfilingOptions
    from edgetrain.tasks.app import create_app, device_queue

    mode = "staircase" if args.power_cap_w is not None and not args.grid else "grid"
    create_app(redis_url).send_task(
        "edgetrain.profile_device",
        kwargs={
            "device_id": info.device_id,
            "model": entry.name,
            "batch_sizes": args.batch_sizes or PAPER_BATCH_SIZES,
            "options": ProfilingOptions(mode=mode).model_dump(),
            "lr": LearningRatePolicy(optimizer=entry.optimizer).model_dump(),
            "power_cap_w": args.power_cap_w,
        },
        queue=device_queue(info.device_id),
    )
    cap = f" for cap {args.power_cap_w} W" if mode == "staircase" else ""
    _status(f"profiling {entry.name} on {info.device_id} ({info.device_type}): {mode}{cap}; waiting up to {args.timeout:g} s")


def _profile_and_wait(
    s: Store, info: DeviceInfo, entry: ModelEntry, tid: str, before: datetime | None, args: argparse.Namespace, redis_url: str
) -> int:
    """Claim the table and dispatch its profiling (or wait for the holder of the claim)."""
    from edgetrain.common.store import CLAIM_TTL_S, PREFIX
    from edgetrain.tasks.client import poll_until
    from edgetrain.tasks.workflow import table_resource

    resource = table_resource(tid)
    if s.claim(resource, f"cli:{socket.gethostname()}:{os.getpid()}"):
        s.r.delete(f"{PREFIX}:failed:{resource}")  # a failure of an earlier attempt is not this one's
        try:
            _dispatch(info, entry, args, redis_url)
        except BaseException:
            s.release(resource)
            raise
    else:
        _status(f"{tid} is being profiled already (claim {resource!r} is held): waiting for it up to {args.timeout:g} s")
    try:
        table = poll_until(lambda: _new_table(s, tid, before), args.timeout, POLL_S, f"profiling of {tid}")
    except ProfilingFailed as exc:
        print(f"profiling failed: {exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:
        print(
            f"{exc}: is the worker of {info.device_id} running? If nothing is profiling, the claim "
            f"{resource!r} is stale; it expires {CLAIM_TTL_S / 3600:g} h after it was taken",
            file=sys.stderr,
        )
        return 1
    return _result(table, args.json)


def cmd_profile_run(args: argparse.Namespace) -> int:
    from edgetrain.common.models import get_model
    from edgetrain.common.store import Store, table_id

    from .cli import _redis_url

    redis_url = _redis_url(args)
    s = Store.from_url(redis_url)
    info = s.device(args.device_id)
    if info is None:
        known = [d.device_id for d in s.fleet()]
        print(f"unknown device {args.device_id!r}: not registered in the fleet (registered: {known})", file=sys.stderr)
        return 2
    try:
        entry = get_model(args.model)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    tid = table_id(info.device_type, entry.name, entry.input_shape)
    current = s.table(tid)
    if current is not None:
        problem = _reuse_problem(current, info, args)
        if problem is None:
            _status(f"a current table exists for {tid}: reused (--force profiles again)")
            return _result(current, args.json)
        _status(f"table {tid} not reused: {problem}")
    return _profile_and_wait(s, info, entry, tid, current.created_at if current else None, args, redis_url)


def cmd_profile_show(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from edgetrain.common.models import get_model
    from edgetrain.common.plotting import describe_selection, plot_profile
    from edgetrain.common.schemas import RelationVector
    from edgetrain.common.store import Store, table_id

    from .cli import _redis_url

    try:
        entry = get_model(args.model)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    vector = None
    if args.vector:
        try:
            vector = RelationVector.model_validate_json(Path(args.vector).read_text())
        except (OSError, ValidationError) as exc:
            print(f"cannot read the relation vector {args.vector}: {exc}", file=sys.stderr)
            return 2
    s = Store.from_url(_redis_url(args))
    tid = table_id(args.device_type, entry.name, entry.input_shape)
    table = s.table(tid)
    if table is None:
        stored = [table_id(t.device_type, t.model, t.input_shape) for t in s.tables()]
        print(f"no table {tid!r} in Redis (stored: {stored}); make one with "
              f"`edgetrain profile run --device-id ID --model {entry.name}`", file=sys.stderr)  # fmt: skip
        return 2
    cap = args.power_cap_w if args.power_cap_w is not None else table.power_cap_w
    if args.plot:
        plot_profile(table, args.plot, cap, vector)
        _status(f"plot written to {args.plot}")
    if args.json:
        print(table.model_dump_json(indent=2))
        return 0
    print(format_table(table))
    cap_note = f"power cap {cap} W" if cap is not None else "no power cap"
    print(f"\n{cap_note}: {describe_selection(table, vector, cap)[1]}")
    return 0


def add_profile_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `profile run` and `profile show` to the `edgetrain` command."""
    parser = subparsers.add_parser("profile", help="profile a model on a device, or show a stored lookup table")
    sub = parser.add_subparsers(dest="profile_command", required=True)

    p = sub.add_parser("run", help="profile a model on a registered device and store T[b][f], P[b][f]")
    p.add_argument("--device-id", required=True, help="a device registered in the fleet (edgetrain fleet)")
    p.add_argument("--model", required=True, help="registered model name or package.module:factory")
    p.add_argument("--power-cap-w", type=float, help="board power cap (W): staircase profiling for this cap")
    p.add_argument("--grid", action="store_true", help="measure the full grid even with a power cap")
    p.add_argument("--force", action="store_true", help="profile again even when a current table exists")
    p.add_argument("--batch-sizes", type=_batch_sizes, help="comma-separated, e.g. 4,8,16 (default 4..128)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the table")
    p.set_defaults(func=cmd_profile_run)

    p = sub.add_parser("show", help="show a stored lookup table (text, JSON or a PNG plot)")
    p.add_argument("device_type", help="device type, e.g. jetson-nano (see edgetrain fleet)")
    p.add_argument("model", help="model name; its input shape completes the table id")
    p.add_argument("--json", action="store_true", help="print the table as JSON (what `edgetrain select --profile` reads)")
    p.add_argument("--plot", type=Path, help="write heatmaps of the table to this PNG")
    p.add_argument("--power-cap-w", type=float, help="cap for the boundary and the selection (default: the table's)")
    p.add_argument("--vector", help="relation vector JSON for the selection (default: r_b = 1 for all b)")
    p.set_defaults(func=cmd_profile_show)
