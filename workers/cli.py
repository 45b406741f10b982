"""The `edgetrain` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from edgetrain.common.settings import get_settings

from .device_cli import add_device_commands
from .profile_cli import add_profile_commands

Handler = Callable[[argparse.Namespace], int]


def _redis_url(args: argparse.Namespace) -> str:
    return args.redis_url or get_settings().redis_url


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.json, Path(args.report))


def cmd_worker(args: argparse.Namespace) -> int:
    from .celery_worker import run_worker

    if args.role == "server":
        from .server_worker import run_server_workers

        return run_server_workers(args.name, args.concurrency, args.gpus, args.loglevel)
    if args.role == "control":
        run_worker(["control"], args.name or "control", args.concurrency, "threads", args.loglevel)
        return 0
    from .device_worker import make_device, run_device_worker

    if not args.device_id or not args.backend:
        print("edgetrain worker device: --device-id and --backend are required", file=sys.stderr)
        return 2
    device = make_device(args.backend, args.device_id, args.sysfs_root, args.allow_clock_control, args.gpu_index,
                         args.allow_power_limit)
    run_device_worker(args.device_id, device, args.loglevel)
    return 0


def cmd_fleet(args: argparse.Namespace) -> int:
    from edgetrain.common.store import Store

    devices = Store.from_url(_redis_url(args)).fleet()
    if args.json:
        _print_json([d.model_dump(mode="json") for d in devices])
        return 0
    if not devices:
        print("no devices registered")
    for d in devices:
        freqs = f"{len(d.frequencies_hz)} frequencies {d.frequencies_hz[0] / 1e6:.0f}-{d.frequencies_hz[-1] / 1e6:.0f} MHz"
        sim = " SIMULATED" if d.simulated else ""
        print(f"{d.device_id:<16} {d.device_type:<20} {d.backend:<7}{sim}  {freqs}, {d.memory_bytes / 2**30:.1f} GiB, heartbeat {d.heartbeat_at:%H:%M:%S}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from edgetrain.tasks.client import EdgeTrainClient, JobSpecError

    try:
        spec = json.loads(Path(args.job).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read job spec {args.job}: {exc}", file=sys.stderr)
        return 2
    client = EdgeTrainClient(_redis_url(args))
    try:
        job_id = client.submit(spec)
    except JobSpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(job_id)
    if not args.wait:
        return 0
    from .demo import ProgressPrinter, format_report

    status = client.wait(job_id, on_update=ProgressPrinter())
    report = client.report(job_id)
    _print_json(report) if args.json else print(format_report(report))
    return 0 if status.state.value == "completed" else 1


def cmd_status(args: argparse.Namespace) -> int:
    from edgetrain.tasks.client import EdgeTrainClient, JobNotFoundError
    from .demo import format_report

    client = EdgeTrainClient(_redis_url(args))
    try:
        status = client.status(args.job_id)
    except JobNotFoundError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.json:
        _print_json(client.report(args.job_id) | {"progress": status.progress})
        return 0
    print(format_report(client.report(args.job_id)))
    for device_id, progress in status.progress.items():
        print(f"progress {device_id}: " + ", ".join(f"{k}={v:g}" for k, v in progress.items()))
    print("events:\n  " + "\n  ".join(status.events))
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    from edgetrain.common.schemas import ProfileTable, RelationVector
    from edgetrain.common.selection import Equation4, InfeasibleCapError, SelectionError

    try:
        table = ProfileTable.model_validate_json(Path(args.profile).read_text())
        vector = RelationVector.model_validate_json(Path(args.vector).read_text())
    except (OSError, ValidationError) as exc:
        print(f"cannot read the profile or vector: {exc}", file=sys.stderr)
        return 2
    try:
        choice = Equation4(vector).choose(table, args.power_cap_w)
    except InfeasibleCapError as exc:
        print(f"infeasible: {exc}", file=sys.stderr)
        return 3
    except SelectionError as exc:
        print(f"no selection: {exc}", file=sys.stderr)
        return 3
    if args.json:
        _print_json(choice.model_dump())
    else:
        print(f"batch size {choice.batch_size}, GPU frequency {choice.frequency_hz} Hz "
              f"({choice.frequency_hz / 1e6:.1f} MHz), estimated time {choice.estimated_time_s:.3f} s, "
              f"peak power {choice.peak_power_w:.2f} W")  # fmt: skip
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from edgetrain.common.data_fetch import fetch, status

    data_dir = get_settings().data_dir
    if args.data_command == "status":
        result = status(data_dir)
        _print_json(result) if args.json else print("\n".join(f"{k:<14} {'ok' if v is True else v}" for k, v in result.items()))
        return 0
    try:
        result = fetch(args.names or None, data_dir)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.json:
        _print_json(result)
    else:
        print("\n".join(f"{name:<14} {r['status']:<8} {r.get('path') or r.get('error')}" for name, r in result.items()))
    return 0 if all(r["status"] != "failed" for r in result.values()) else 1


def cmd_flower(args: argparse.Namespace) -> int:
    from edgetrain.tasks.app import app

    argv = ["flower", f"--port={args.port}", f"--address={args.address}"]
    if args.basic_auth or os.environ.get("EDGETRAIN_FLOWER_BASIC_AUTH"):
        argv.append(f"--basic-auth={args.basic_auth or os.environ['EDGETRAIN_FLOWER_BASIC_AUTH']}")
    app.start(argv=argv)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgetrain", description=__doc__)
    parser.add_argument("--redis-url", help="Redis URL (default: $EDGETRAIN_REDIS_URL)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run a whole job on an embedded Redis and simulated Jetsons")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", default="edgetrain-demo-report.json", help="where to write the JSON report")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("worker", help="run a worker process")
    p.add_argument("role", choices=["server", "device", "control"])
    p.add_argument("--device-id")
    p.add_argument("--backend", help="device backend: sim:<twin>, jetson or nvml")
    p.add_argument("--sysfs-root", type=Path, help="root of the Jetson sysfs tree (default /)")
    p.add_argument("--allow-clock-control", action="store_true", help="nvml: allow locking GPU clocks")
    p.add_argument("--allow-power-limit", action="store_true",
                   help="nvml: control the GPU's power limit (restored on exit); the default is read-only")
    p.add_argument("--gpu-index", type=int, default=0, help="nvml: which GPU")
    p.add_argument("--gpus", help="server: comma-separated GPU indices, one worker process per GPU")
    p.add_argument("--concurrency", type=int, default=1, help="processes (server) or threads (control)")
    p.add_argument("--name", help="worker node name")
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("fleet", help="list registered devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fleet)

    p = sub.add_parser("submit", help="submit a job spec (JSON file)")
    p.add_argument("job", help="JOB.json")
    p.add_argument("--wait", action="store_true", help="follow progress until the job ends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="a job's state, progress and result")
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("select", help="select (batch size, frequency) from a profile and a vector")
    p.add_argument("--profile", required=True, help="PROFILE.json")
    p.add_argument("--vector", required=True, help="VECTOR.json")
    p.add_argument("--power-cap-w", type=float, help="board power cap (W); omit for none")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_select)

    add_profile_commands(sub)

    p = sub.add_parser("data", help="get the datasets that ship offline, or see which are here")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("fetch", help="download into $EDGETRAIN_DATA_DIR (default: all fetchable)")
    p.add_argument("names", nargs="*")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data)
    p = data_sub.add_parser("status", help="which datasets are available")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data)

    add_device_commands(sub)

    p = sub.add_parser("flower", help="run Flower (Celery monitoring) for this cluster")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--basic-auth", help="user:password (or $EDGETRAIN_FLOWER_BASIC_AUTH)")
    p.set_defaults(func=cmd_flower)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.redis_url:
        os.environ["EDGETRAIN_REDIS_URL"] = args.redis_url
        get_settings.cache_clear()
    from edgetrain.common.devices.base import DeviceError

    try:
        return args.func(args)
    except DeviceError as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; workers were shut down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
