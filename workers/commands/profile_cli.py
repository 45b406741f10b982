"""`edgetrain profile run|show`: profile a model on a fleet device, and show a stored lookup table.

`run` follows the workflow's protocol (`EdgeTrainClient.profile`): it claims `table:<tid>`
before dispatching `edgetrain.profile_device` to the device's queue (the task releases the
claim), and when the claim is already held it waits for that profiling instead of starting
another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_args import ExitCode, device_id, power_cap, settings_from
from ..rendering.output import describe_table, format_table, note
from ..rendering.progress import activity

if TYPE_CHECKING:
    from edgetrain.common.schemas import DeviceInfo, ProfileTable, ProfilingOptions
    from edgetrain.common.settings import Settings
    from edgetrain.common.tables import Profile

POLL_S = 0.5
DEFAULT_TIMEOUT_S = 3600.0


def _batch_sizes(text: str) -> list[int]:
    """Parse '4,8,16' into sorted unique positive batch sizes."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 4,8,16, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return values


def _result(table: ProfileTable, as_json: bool) -> int:
    print(table.model_dump_json(indent=2) if as_json else describe_table(table))
    return ExitCode.ok


def _options(args: argparse.Namespace) -> ProfilingOptions:
    """The profile this command asks for: staircase for a given cap unless --grid."""
    from edgetrain.common.schemas import ProfilingOptions

    return ProfilingOptions(mode="staircase" if args.power_cap_w is not None and not args.grid else "grid")


def _profile_and_wait(settings: Settings, info: DeviceInfo, tid: str, args: argparse.Namespace, need: Profile) -> int:
    """Profile on the device (or wait for the holder of the table's claim) and print the table."""
    from edgetrain.common.store.coordination import CLAIM_TTL_S
    from edgetrain.tasks.client import EdgeTrainClient, ResourceFailed

    client = EdgeTrainClient(settings.redis_url, settings.key_prefix)
    options = _options(args)
    pending = client.profile(info, args.model, need.rows, options, args.power_cap_w, merge=need.merge)
    if pending.dispatched:
        cap = f" for cap {args.power_cap_w} W" if options.mode == "staircase" else ""
        note(f"profiling {args.model} on {info.device_id} ({info.device_type}): {options.mode}{cap}; "
             f"waiting up to {args.timeout:g} s")  # fmt: skip
    else:
        note(f"{tid} is being profiled already (claim {pending.resource!r} is held): waiting for it up to {args.timeout:g} s")
    try:
        with activity(f"waiting for {tid} from {info.device_id}"):
            table = pending.wait(args.timeout, POLL_S)
    except ResourceFailed as exc:
        print(f"profiling failed: {exc}", file=sys.stderr)
        return ExitCode.failed
    except TimeoutError as exc:
        print(
            f"{exc}: is the worker of {info.device_id} running? If nothing is profiling, the claim "
            f"{pending.resource!r} is stale; it expires {CLAIM_TTL_S / 3600:g} h after it was taken",
            file=sys.stderr,
        )
        return ExitCode.failed
    return _result(table, args.json)


def cmd_profile_run(args: argparse.Namespace) -> int:
    """`edgetrain profile run`."""
    from edgetrain.common.keys import table_id
    from edgetrain.common.models import get_model
    from edgetrain.common.schemas import PAPER_BATCH_SIZES, utc_now
    from edgetrain.common.store import Store
    from edgetrain.common.tables import Profile, Reuse, table_need

    settings = settings_from(args)
    s = Store.connect(settings.redis_url, settings.key_prefix)
    info = s.fleet.device(args.device_id)
    if info is None:
        known = [d.device_id for d in s.fleet.devices()]
        print(f"unknown device {args.device_id!r}: not registered in the fleet (registered: {known})", file=sys.stderr)
        return ExitCode.usage
    try:
        entry = get_model(args.model)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.usage
    tid = table_id(info.device_type, entry.name, entry.input_shape)
    current = s.resources.table(tid, lambda record: note(record.line()))
    batch_sizes = args.batch_sizes or list(PAPER_BATCH_SIZES)
    need = table_need(current, info, batch_sizes, args.power_cap_w, not_before=utc_now() if args.force else None, grid=args.grid)
    if isinstance(need, Reuse):
        note(f"a current table exists for {tid}: reused (--force profiles again)")
        return _result(need.table, args.json)
    assert isinstance(need, Profile), "no failure is asked about"
    if need.why is not None:
        note(f"table {tid} not reused: {need.why}")
    elif need.merge:
        note(f"table {tid} has no rows for batch sizes {need.rows}: profiling them")
    return _profile_and_wait(settings, info, tid, args, need)


def cmd_profile_show(args: argparse.Namespace) -> int:
    """`edgetrain profile show`."""
    from pydantic import ValidationError

    from edgetrain.common.keys import table_id
    from edgetrain.common.models import get_model
    from edgetrain.common.plotting import describe_selection, plot_profile
    from edgetrain.common.schemas import RelationVector
    from edgetrain.common.store import SetAside, Store

    try:
        entry = get_model(args.model)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.usage
    vector = None
    if args.vector:
        try:
            vector = RelationVector.model_validate_json(Path(args.vector).read_text())
        except (OSError, ValidationError) as exc:
            print(f"cannot read the relation vector {args.vector}: {exc}", file=sys.stderr)
            return ExitCode.usage
    settings = settings_from(args)
    s = Store.connect(settings.redis_url, settings.key_prefix)
    tid = table_id(args.device_type, entry.name, entry.input_shape)
    set_aside: list[SetAside] = []
    table = s.resources.table(tid, set_aside.append)
    if table is None:
        make = f"make one with `edgetrain profile run --device-id ID --model {entry.name}`"
        if set_aside:
            print(f"{set_aside[0].line()}; {make}", file=sys.stderr)
            return ExitCode.not_found
        stored = [table_id(t.device_type or "?", t.model or "?", t.input_shape or []) for t in s.resources.tables()]
        print(f"no table {tid!r} in Redis (stored: {stored}); {make}", file=sys.stderr)
        return ExitCode.not_found
    cap = args.power_cap_w if args.power_cap_w is not None else table.power_cap_w
    if args.plot:
        plot_profile(table, args.plot, cap, vector)
        note(f"plot written to {args.plot}")
    if args.json:
        print(table.model_dump_json(indent=2))
        return ExitCode.ok
    print(format_table(table))
    cap_note = f"power cap {cap} W" if cap is not None else "no power cap"
    print(f"\n{cap_note}: {describe_selection(table, vector, cap)[1]}")
    return ExitCode.ok


def add_profile_commands(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add `profile run` and `profile show` to the `edgetrain` command."""
    parser = subparsers.add_parser("profile", help="profile a model on a device, or show a stored lookup table")
    sub = parser.add_subparsers(dest="profile_command", required=True)

    p = sub.add_parser("run", help="profile a model on a registered device and store T[b][f], P[b][f]", parents=parents)
    p.add_argument("--device-id", type=device_id, required=True, help="a device registered in the fleet (edgetrain fleet)")
    p.add_argument("--model", required=True, help="registered model name or package.module:factory")
    p.add_argument("--power-cap-w", type=power_cap, help="board power cap (W): staircase profiling for this cap")
    p.add_argument("--grid", action="store_true", help="measure the full grid even with a power cap")
    p.add_argument("--force", action="store_true", help="profile again even when a current table exists")
    p.add_argument("--batch-sizes", type=_batch_sizes, help="comma-separated, e.g. 4,8,16 (default 4..128)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the table")
    p.set_defaults(func=cmd_profile_run)

    p = sub.add_parser("show", help="show a stored lookup table (text, JSON or a PNG plot)", parents=parents)
    p.add_argument("device_type", help="device type, e.g. jetson-nano (see edgetrain fleet)")
    p.add_argument("model", help="model name; its input shape completes the table id")
    p.add_argument("--json", action="store_true", help="print the table as JSON (what `edgetrain select --profile` reads)")
    p.add_argument("--plot", type=Path, help="write heatmaps of the table to this PNG")
    p.add_argument("--power-cap-w", type=power_cap, help="cap for the boundary and the selection (default: the table's)")
    p.add_argument("--vector", help="relation vector JSON for the selection (default: r_b = 1 for all b)")
    p.set_defaults(func=cmd_profile_show)
