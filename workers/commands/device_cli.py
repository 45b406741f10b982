"""`edgetrain device inspect|twins`: which device backend this machine has and what it
offers, and the built-in simulated twins; with their formatting for people."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgetrain.common.devices.twin_spec import TwinSpec


def _mhz(hz: float) -> str:
    return f"{hz / 1e6:g}"


def _clock(hz: float | None) -> str:
    return "not reported" if hz is None else f"{_mhz(hz)} MHz"


def _mhz_list(frequencies_hz: list[int]) -> str:
    return f"{' '.join(_mhz(f) for f in frequencies_hz)} MHz ({len(frequencies_hz)})"


def format_jetson(info: dict[str, Any]) -> str:
    """A Jetson's inspection as lines for people (frequencies in MHz, power in W)."""
    model = f" ({info['model']})" if info["model"] else ""
    lines = [
        f"board        {info['board']}{model}",
        f"devfreq      {info['devfreq_path']}",
        f"governor     {info['governor']}",
        (
            f"frequency    {_mhz(info['current_frequency_hz'])} MHz now; "
            f"range {_mhz(info['min_frequency_hz'])}..{_mhz(info['max_frequency_hz'])} MHz"
        ),
        f"available    {_mhz_list(info['frequencies_hz'])}",
        f"pinning      {'allowed' if info['writable'] else 'needs root (sudo) or a udev rule'}",
    ]
    if not info["rails"]:
        return "\n".join(lines + ["power        no INA3221 power monitor found"])
    source = f"rail {info['total_rail']}" if info["total_rail"] else "sum of rails"
    lines.append(f"power        {info['total_power_w']:.3f} W ({source})")
    lines += [f"  {r['name']:<16} {r['power_w']:.3f} W" for r in info["rails"]]
    return "\n".join(lines)


def format_nvml(info: dict[str, Any]) -> str:
    """An NVIDIA GPU's inspection as lines for people (clocks in MHz, power in W)."""

    def value(x: Any, fmt: str, unit: str) -> str:
        return "not reported" if x is None else f"{format(x, fmt)} {unit}"

    limits = info["power_limit_range_w"]
    limit_range = f"range {limits[0]:g}..{limits[1]:g} W" if limits else "range not reported"
    clocks = info["supported_graphics_clocks_hz"]
    lines = [
        f"gpu          {info['index']} of {info['gpu_count']}: {info['name']}",
        f"driver       {info['driver_version']}",
        f"memory       {info['memory_bytes'] / 2**30:.1f} GiB",
        f"clock        SM {_clock(info['sm_clock_hz'])} now, graphics {_clock(info['graphics_clock_hz'])}",
        f"supported    {_mhz_list(clocks) if clocks else 'not reported'}",
        f"power        {value(info['power_w'], '.1f', 'W')} now",
        (
            f"power limit  {value(info['power_limit_w'], 'g', 'W')} (default "
            f"{value(info['power_limit_default_w'], 'g', 'W')}, {limit_range})"
        ),
        f"energy       {value(info['energy_counter_j'], '.1f', 'J since the driver loaded')}",
    ]
    if info["not_supported"]:
        lines.append(f"not supported: {', '.join(info['not_supported'])}")
    return "\n".join(lines)


def format_machine(report: dict[str, Any]) -> str:
    """inspect_machine()'s report: the backend, what it offers, why the others are absent."""
    lines = [f"backend      {report['backend']}"]
    if "jetson" in report:
        lines += ["", "jetson sysfs", format_jetson(report["jetson"])]
    if "nvml" in report:
        lines += ["", "nvml", format_nvml(report["nvml"])]
    lines += [""] + [f"no {name}: {why}" for name, why in report["unavailable"].items()]
    lines.append(f"next: {report['next_step']}")
    return "\n".join(lines)


def twin_summary(spec: TwinSpec) -> dict[str, Any]:
    """What `device twins --json` lists per twin (Hz, W)."""
    return {
        "name": spec.name,
        "device_type": spec.device_type,
        "simulated": True,
        "l4t_release": spec.l4t_release,
        "frequencies_hz": spec.frequencies_hz,
        "idle_power_w": spec.idle_power_w,
        "full_load_power_w": spec.full_load_power_w,
        "power_rails": spec.power_rails,
        "total_rail": spec.total_rail,
        "power_modes": [m.model_dump() for m in spec.power_modes],
        "sources": spec.sources,
    }


def format_twins(specs: list[TwinSpec]) -> str:
    """The built-in twins for people: one block each, every figure marked SIMULATED."""
    blocks = []
    for s in specs:
        total = s.total_rail or "sum of the rails"
        lines = [
            f"{s.name} [{s.device_type}] SIMULATED, models L4T {s.l4t_release or 'release not stated'}",
            f"  frequencies  {_mhz_list(s.frequencies_hz)}",
            (
                f"  power        idle {s.idle_power_w:g} W, full load {s.full_load_power_w[0]:g} W at the lowest to "
                f"{s.full_load_power_w[-1]:g} W at the highest clock (SIMULATED)"
            ),
            f"  rails        {', '.join(s.power_rails) or 'not stated'} (board power: {total})",
        ]
        if s.power_modes:
            lines.append("  modes        " + ", ".join(f"{m.name} {_mhz(m.gpu_max_frequency_hz)} MHz" for m in s.power_modes))
        lines += ["  sources"] + [f"    - {src}" for src in s.sources]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_device_inspect(args: argparse.Namespace) -> int:
    """`edgetrain device inspect`."""
    from edgetrain.common.devices.detect import inspect_machine

    report = inspect_machine(args.sysfs_root, args.gpu_index)
    found = report["backend"] != "none"
    if args.json:
        _print_json(report)
    else:
        print(format_machine(report), file=sys.stdout if found else sys.stderr)
    return 0 if found else 2


def cmd_device_twins(args: argparse.Namespace) -> int:
    """`edgetrain device twins`."""
    from edgetrain.common.devices.twin_spec import builtin_twins

    specs = list(builtin_twins().values())
    _print_json([twin_summary(s) for s in specs]) if args.json else print(format_twins(specs))
    return 0


def add_device_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `device inspect` and `device twins` to the `edgetrain` command."""
    parser = subparsers.add_parser("device", help="look at this machine's device, or at the simulated twins")
    sub = parser.add_subparsers(dest="device_command", required=True)

    p = sub.add_parser("inspect", help="which backend this machine has (jetson sysfs, nvml, none) and what it offers")
    p.add_argument("--sysfs-root", type=Path, default=Path("/"), help="root of the Jetson sysfs tree (default /)")
    p.add_argument("--gpu-index", type=int, default=0, help="nvml: which GPU")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_device_inspect)

    p = sub.add_parser("twins", help="the built-in simulated twins: frequencies, power, L4T release, sources")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_device_twins)
