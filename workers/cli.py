"""The `edgetrain` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError

from edgetrain.common.jobs.state import PartState
from edgetrain.common.limits import STATUS_PARTS

from .cli_args import (
    ExitCode,
    connection_options,
    device_id,
    job_exit_code,
    job_id,
    page_number,
    positive_seconds,
    power_cap,
    power_cap_or_none,
    settings_from,
    warn_secret_on_command_line,
)
from .commands.device_cli import add_device_commands
from .commands.evaluate import add_evaluate_command
from .commands.profile_cli import add_profile_commands
from .rendering.output import (
    format_data_fetch,
    format_data_status,
    format_fleet,
    format_jobs,
    format_report,
    format_selection,
    format_status,
    format_vector,
    note,
    print_json,
)

if TYPE_CHECKING:
    from edgetrain.common.federated.records import FederatedStatus
    from edgetrain.common.federated.spec import FederatedSpec
    from edgetrain.tasks.client import EdgeTrainClient


def cmd_demo(args: argparse.Namespace) -> int:
    """`edgetrain demo`."""
    from .commands.demo import run_demo

    return run_demo(args.json, Path(args.report) if args.report else None)


def cmd_worker(args: argparse.Namespace) -> NoReturn:
    """`edgetrain worker control|server|device`; the process ends as soon as its worker has
    stopped (`end_process`)."""
    from .processes.celery_worker import end_process

    end_process(_run_worker(args))


def _run_worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.log_format:
        settings = settings.model_copy(update={"log_format": args.log_format})
    if args.role == "server":
        from .processes.server_worker import run_server_workers

        return run_server_workers(settings, args.name, args.concurrency, args.gpus, args.loglevel)
    if args.role == "control":
        from edgetrain.tasks.contract import CONTROL_QUEUE

        from .processes.celery_worker import run_worker

        return run_worker(settings, "control", [CONTROL_QUEUE], args.name or "control", args.concurrency, args.loglevel,
                          ("edgetrain.tasks.workflow", "edgetrain.tasks.federated"))  # fmt: skip
    from .processes.device_worker import make_device, run_device_worker

    if not args.device_id or not args.backend:
        print("edgetrain worker device: --device-id and --backend are required", file=sys.stderr)
        return ExitCode.usage
    device = make_device(args.backend, args.device_id, args.sysfs_root, args.allow_clock_control, args.gpu_index, args.allow_power_limit)
    return run_device_worker(settings, args.device_id, device, args.loglevel)


def cmd_fleet(args: argparse.Namespace) -> int:
    """`edgetrain fleet`: registered devices and live workers."""
    client = _client(args)
    devices, workers = client.fleet(), client.workers()
    caps = client.store.fleet.power_caps([d.device_id for d in devices])
    if args.json:
        print_json({"devices": [d.model_dump(mode="json") for d in devices], "workers": [w.model_dump(mode="json") for w in workers],
                    "caps": {d: cap.model_dump(mode="json") for d, cap in caps.items()}})  # fmt: skip
    else:
        print(format_fleet(devices, workers, caps))
    return ExitCode.ok


def _client(args: argparse.Namespace) -> EdgeTrainClient:
    from edgetrain.tasks.client import EdgeTrainClient

    settings = settings_from(args)
    return EdgeTrainClient(settings.redis_url, settings.key_prefix)


def cmd_submit(args: argparse.Namespace) -> int:
    """`edgetrain submit JOB.json [--wait] [--timeout S]`: prints the job id, then notes on stderr;
    waiting, progress on stderr and the report on stdout, with the job's exit status. The spec is
    checked before any setting is read."""
    from edgetrain.common.documents import DocumentError, read_document
    from edgetrain.common.federated.spec import FederatedSpec
    from edgetrain.tasks.client import JobSpecError, datasets_missing_here, is_federated, validate_federated, validate_job

    from .rendering.progress import JobProgress

    try:
        raw = read_document(args.job, "job spec")
        spec = validate_federated(raw) if is_federated(raw) else validate_job(raw)
    except (DocumentError, JobSpecError) as exc:
        print(exc, file=sys.stderr)
        return ExitCode.usage
    client = _client(args)
    if isinstance(spec, FederatedSpec):
        return _submit_federated(args, client, spec)
    job_id = client.submit(spec)
    print(job_id, flush=True)
    stalled = client.status(job_id).notes
    for line in datasets_missing_here(spec) + client.unregistered_notes(spec) + stalled:
        note(f"note: {line}")
    if not args.wait and args.timeout is None:
        return ExitCode.ok
    if stalled:
        limit = f"gives up after {args.timeout:g} s" if args.timeout else "waits until then (--timeout S gives up; Ctrl-C stops waiting)"
        note(f"note: nothing picks job {job_id} up until such a worker runs; --wait {limit}")
    progress = JobProgress()
    try:
        client.wait(job_id, timeout_s=args.timeout, on_update=progress)
    except TimeoutError:
        progress.close()
        notes = client.status(job_id).notes
        return _stopped_waiting(f"job {job_id}", f"not finished after {args.timeout:g} s", ExitCode.timed_out, notes)
    except KeyboardInterrupt:
        progress.close()
        return _stopped_waiting(f"job {job_id}", "not waited for: interrupted", ExitCode.interrupted)
    finally:
        progress.close()
    report = client.report(job_id)
    print_json(report) if args.json else print(format_report(report))
    return job_exit_code(report)


def _stopped_waiting(job: str, why: str, code: ExitCode, notes: list[str] | None = None) -> ExitCode:
    """`submit --wait` stops waiting for `job` ("job ID" or "federated job ID") because of
    `why`: says that the job goes on and how to follow or cancel it (and the `notes` on what it
    waits for); returns `code`."""
    job_id = job.split()[-1]
    waits = f"; {' '.join(notes)}" if notes else ""
    note(f"edgetrain: {job} {why}; it goes on: `edgetrain status {job_id}` follows it, `edgetrain cancel {job_id}` stops it{waits}")
    return code


def _submit_federated(args: argparse.Namespace, client: EdgeTrainClient, spec: FederatedSpec) -> int:
    """`edgetrain submit FEDERATED.json`: prints the job id; waiting, each round on stderr and
    the job at the end on stdout; exit 0 when it reached its target, 1 when not."""
    from edgetrain.common.federated.records import Phase

    from .rendering.federated_output import format_federated

    job_id = client.submit(spec)
    print(job_id, flush=True)
    if not args.wait and args.timeout is None:
        return ExitCode.ok
    rounds_seen = [0]

    def show(status: FederatedStatus) -> None:
        for r in status.rounds[rounds_seen[0] :]:
            note(f"round {r.round}: global accuracy {r.accuracy:.4f}, {len(r.devices)} updates, {r.elapsed_s:.2f} device s so far")
        rounds_seen[0] = len(status.rounds)

    try:
        status = client.wait_federated(job_id, args.timeout, on_update=show)
    except TimeoutError:
        return _stopped_waiting(f"federated job {job_id}", f"not finished after {args.timeout:g} s", ExitCode.timed_out)
    except KeyboardInterrupt:
        return _stopped_waiting(f"federated job {job_id}", "not waited for: interrupted", ExitCode.interrupted)
    print_json(status) if args.json else print(format_federated(status))
    return ExitCode.ok if status.state.phase == Phase.completed else ExitCode.failed


def cmd_jobs(args: argparse.Namespace) -> int:
    """`edgetrain jobs [--state S]`: the newest jobs."""
    from edgetrain.common.jobs.state import JobState

    client = _client(args)
    jobs = client.jobs(JobState(args.state) if args.state else None, args.limit)
    federated = [] if args.state or args.json else client.federated_jobs(args.limit)
    print_json(jobs) if args.json else print(format_jobs(jobs, federated, args.limit))
    return ExitCode.ok


def cmd_jobs_prune(args: argparse.Namespace) -> int:
    """`edgetrain jobs prune [--older-than-days D]`: delete old finished jobs (running ones stay)."""
    if args.older_than_days < 0:
        print("edgetrain jobs prune: --older-than-days must be 0 or more", file=sys.stderr)
        return ExitCode.usage
    pruned = _client(args).store.jobs.prune(args.older_than_days * 24 * 3600)
    print_json(pruned) if args.json else note(f"deleted {len(pruned)} finished job(s) older than {args.older_than_days:g} days")
    return ExitCode.ok


def cmd_cancel(args: argparse.Namespace) -> int:
    """`edgetrain cancel JOB_ID`."""
    from edgetrain.common.store import JobFinished

    client = _client(args)
    try:
        if client.federated_status(args.job_id) is not None:
            cancelled = client.cancel_federated(args.job_id)
            if cancelled.finished:
                done = f"federated job {args.job_id}: {cancelled.state.phase.value}; no round opens or aggregates after this"
            else:
                done = f"federated job {args.job_id}: cancel requested; no control worker applied it yet (is one running?)"
            print_json(cancelled) if args.json else note(done)
            return ExitCode.ok
        status = client.cancel(args.job_id)
    except JobFinished as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return ExitCode.finished
    note(f"job {args.job_id}: cancelling; parts not running are cancelled now, running fine-tunes checkpoint, stop at "
         "their next step and restore their device")  # fmt: skip
    print_json(status) if args.json else print(status)
    return ExitCode.ok


def cmd_requeue(args: argparse.Namespace) -> int:
    """`edgetrain requeue JOB_ID DEVICE_ID`."""
    try:
        _client(args).requeue(args.job_id, args.device_id)
    except ValueError as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return ExitCode.usage
    note(f"job {args.job_id}: {args.device_id} re-queued")
    return ExitCode.ok


def cmd_cap(args: argparse.Namespace) -> int:
    """`edgetrain cap DEVICE_ID WATTS|none`."""
    cap = _client(args).set_power_cap(args.device_id, args.watts)
    watts = "no cap" if cap.power_cap_w is None else f"{cap.power_cap_w:g} W"
    print_json(cap) if args.json else note(f"{args.device_id}: power cap {watts}; a running fine-tune follows it at its next step")
    return ExitCode.ok


def cmd_vector_show(args: argparse.Namespace) -> int:
    """`edgetrain vector show (--job JOB_ID | KEY) [--json]`."""
    from edgetrain.common.store import SetAside

    client = _client(args)
    set_aside: list[SetAside] = []
    vector = client.job_vector(args.job, set_aside.append) if args.job else client.store.resources.vector(args.key, set_aside.append)
    if vector is None:
        what = f"job {args.job}'s relation vector is not estimated yet" if args.job else f"no relation vector {args.key!r}"
        print(f"edgetrain: {set_aside[0].line() if set_aside else what}", file=sys.stderr)
        return ExitCode.not_found
    if args.json:
        print(vector.model_dump_json(indent=2))
        return ExitCode.ok
    print(format_vector(vector))
    for label, belief in (client.beliefs(args.job, vector) if args.job else {}).items():
        print(f"what the fleet believes about {label} now: {belief.line()}")
    return ExitCode.ok


def cmd_status(args: argparse.Namespace) -> int:
    """`edgetrain status JOB_ID [--device D]... [--state S] [--page N]`: every state prints,
    notes included; a big job's summary unless other parts are asked for."""
    from edgetrain.common.jobs.reports import JobReport

    from .rendering.federated_output import format_federated

    client = _client(args)
    if (federated := client.federated_status(args.job_id)) is not None:
        print_json(federated) if args.json else print(format_federated(federated))
        return ExitCode.ok
    state = PartState(args.state) if args.state else None
    status = client.status(args.job_id, args.device or None, state, args.page)
    if args.json:
        extra = {"notes": status.notes, "preparation": status.preparation.model_dump(mode="json"),
                 "counts": {s.value: n for s, n in status.counts.items()}, "shown": status.shown}  # fmt: skip
        print_json(JobReport.from_status(status).model_dump(mode="json") | extra)
    else:
        print(format_status(status))
    return ExitCode.ok


def cmd_select(args: argparse.Namespace) -> int:
    """`edgetrain select --profile P --vector V [--power-cap-w W]`."""
    from edgetrain.common.schemas import ProfileTable, RelationVector
    from edgetrain.common.selection import Equation4, InfeasibleCapError, SelectionError

    try:
        table = ProfileTable.model_validate_json(Path(args.profile).read_text())
        vector = RelationVector.model_validate_json(Path(args.vector).read_text())
    except (OSError, ValidationError) as exc:
        print(f"cannot read the profile or vector: {exc}", file=sys.stderr)
        return ExitCode.usage
    try:
        choice = Equation4(vector).choose(table, args.power_cap_w)
    except InfeasibleCapError as exc:
        print(f"infeasible: {exc}", file=sys.stderr)
        return ExitCode.infeasible
    except SelectionError as exc:
        print(f"no selection: {exc}", file=sys.stderr)
        return ExitCode.infeasible
    print_json(choice) if args.json else print(format_selection(choice))
    return ExitCode.ok


def cmd_data(args: argparse.Namespace) -> int:
    """`edgetrain data fetch|status`."""
    from edgetrain.common.settings import get_data_settings

    from .commands.data_fetch import FETCHERS, fetch, status
    from .rendering.progress import activity

    data_dir = get_data_settings().data_dir  # no Redis setting is read: fetching needs none
    if args.data_command == "status":
        result = status(data_dir)
        print_json(result) if args.json else print(format_data_status(result))
        return ExitCode.ok
    unknown = sorted(set(args.names) - set(FETCHERS))
    if unknown:
        print(f"edgetrain data fetch: cannot fetch {unknown}; fetchable datasets: {list(FETCHERS)}", file=sys.stderr)
        return ExitCode.usage
    fetched: dict[str, dict[str, str | float]] = {}
    for name in args.names or FETCHERS:
        with activity(f"fetching {name} into {data_dir}"):
            fetched |= fetch([name], data_dir)
    print_json(fetched) if args.json else print(format_data_fetch(fetched))
    return ExitCode.ok if all(r["status"] != "failed" for r in fetched.values()) else ExitCode.failed


def cmd_flower(args: argparse.Namespace) -> int:
    """`edgetrain flower`: Flower for this cluster, behind a login unless on loopback."""
    from .processes.flower import (
        FlowerConfigError,
        checked_basic_auth,
        read_basic_auth,
        run_flower,
    )

    if args.basic_auth:
        warn_secret_on_command_line("--basic-auth", "--basic-auth-file or EDGETRAIN_FLOWER_BASIC_AUTH_FILE")
    try:
        basic_auth = checked_basic_auth(args.basic_auth) if args.basic_auth else read_basic_auth(args.basic_auth_file)
        run_flower(settings_from(args), args.address, args.port, basic_auth)
    except FlowerConfigError as exc:
        print(f"edgetrain flower: {exc}", file=sys.stderr)
        return ExitCode.usage
    return ExitCode.ok


def cmd_doctor(args: argparse.Namespace) -> int:
    """`edgetrain doctor [--json]`: what to fix in the deployment; exit status 1 when anything."""
    from edgetrain.common.store import Store

    from .commands.doctor import diagnose, summary

    settings = settings_from(args)
    findings = diagnose(settings)
    if args.json:
        print_json({"ok": not findings, "findings": [f.model_dump(mode="json") for f in findings]})
    elif findings:
        print(f"edgetrain doctor: {len(findings)} thing{'s' if len(findings) > 1 else ''} to fix\n")
        print("\n".join(f"- [{f.check}] {f.line()}" for f in findings))
    else:
        print(f"edgetrain doctor: {summary(Store.connect(settings.redis_url, settings.key_prefix), settings)}")
    return ExitCode.failed if findings else ExitCode.ok


def cmd_exporter(args: argparse.Namespace) -> int:
    """`edgetrain exporter`: the fleet's metrics for Prometheus."""
    import logging

    from .processes.exporter import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(settings_from(args), args.address, args.port)
    return ExitCode.ok


def cmd_redis_acl(args: argparse.Namespace) -> int:
    """`edgetrain redis-acl`: the Redis ACL file of edgetrain's users, on stdout or written to
    --out only once complete; --make-secrets first makes the password files that are missing."""
    from edgetrain.common.files import write_atomically

    from .commands.redis_acl import acl_file, make_secrets, read_passwords

    try:
        if args.make_secrets and (made := make_secrets(args.passwords)):
            note(f"made {', '.join(f'{role}.password' for role in made)} in {args.passwords} (readable by this user only)")
        passwords = read_passwords(args.passwords)
        text = acl_file(passwords, args.key_prefix)
        if args.out is None:
            print(text, end="")
        else:
            write_atomically(args.out, text.encode())
            note(f"wrote {args.out}: users {', '.join(passwords)} on, the default user off")
    except (OSError, ValueError) as exc:
        print(f"edgetrain redis-acl: {exc}", file=sys.stderr)
        return ExitCode.usage
    return ExitCode.ok


def build_parser() -> argparse.ArgumentParser:
    """The `edgetrain` argument parser with every subcommand."""
    from edgetrain.common.jobs.state import JobState
    from edgetrain.common.keys import DEFAULT_PREFIX

    parser = argparse.ArgumentParser(prog="edgetrain", description=__doc__, parents=[connection_options()])
    conn = [connection_options(suppress_defaults=True)]
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run a whole job on an embedded Redis and simulated Jetsons")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", help="where to write the JSON report (default: edgetrain-demo-JOB_ID.json here)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("worker", help="run a worker process", parents=conn)
    p.add_argument("role", choices=["server", "device", "control"])
    p.add_argument("--device-id", type=device_id)
    p.add_argument("--backend", help="device backend: sim:<twin>, jetson or nvml")
    p.add_argument("--sysfs-root", type=Path, help="root of the Jetson sysfs tree (default /)")
    p.add_argument("--allow-clock-control", action="store_true", help="nvml: allow locking GPU clocks")
    p.add_argument(
        "--allow-power-limit", action="store_true", help="nvml: control the GPU's power limit (restored on exit); the default is read-only"
    )
    p.add_argument("--gpu-index", type=int, default=0, help="nvml: which GPU")
    p.add_argument("--gpus", help="server: comma-separated GPU indices, one worker process per GPU")
    p.add_argument("--concurrency", type=int, default=1, help="pool processes (server and control workers)")
    p.add_argument("--name", help="worker node name")
    p.add_argument("--loglevel", default="INFO")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text, or one JSON object per line with job, device, task and task id (default: $EDGETRAIN_LOG_FORMAT)",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("fleet", help="list registered devices (with a cap set on them by `edgetrain cap`) and live workers",
                       parents=conn)  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fleet)

    p = sub.add_parser("submit", help="submit a job spec (JSON file)", parents=conn)
    p.add_argument("job", help="JOB.json")
    p.add_argument("--wait", action="store_true", help="follow progress until the job ends")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="S",
        help="wait at most S seconds (implies --wait), then exit with status 6; the job goes on",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="a job's state, progress and result (a summary of a big job)", parents=conn)
    p.add_argument("job_id", type=job_id)
    p.add_argument("--device", type=device_id, action="append", metavar="D", help="show the part of device D (repeatable)")
    p.add_argument("--state", choices=[s.value for s in PartState], help="show the parts in this state")
    p.add_argument("--page", type=page_number, metavar="N", help=f"show page N (from 0) of the parts, {STATUS_PARTS} per page")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("select", help="select (batch size, frequency) from a profile and a vector")
    p.add_argument("--profile", required=True, help="PROFILE.json")
    p.add_argument("--vector", required=True, help="VECTOR.json")
    p.add_argument("--power-cap-w", type=power_cap, help="board power cap (W); omit for none")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser(
        "jobs",
        help="list the newest jobs, federated ones among them (not with --state or --json), with one "
        "failed part of each and why; `jobs prune` deletes old finished jobs",
        parents=conn,
    )
    p.add_argument("--state", choices=[s.value for s in JobState], help="only jobs in this state")
    p.add_argument("--limit", type=int, default=100, help="how many of the newest jobs (default 100)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)
    jobs_sub = p.add_subparsers(dest="jobs_command")
    prune = jobs_sub.add_parser("prune", help="delete the finished jobs submitted more than --older-than-days ago", parents=conn)
    prune.add_argument("--older-than-days", type=float, default=7.0, help="age in days (default 7; 0: every finished job)")
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(func=cmd_jobs_prune)

    p = sub.add_parser("cancel", help="cancel a job: running fine-tunes stop at their next step", parents=conn)
    p.add_argument("job_id", type=job_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("requeue", help="plan a failed or cancelled part of a job again", parents=conn)
    p.add_argument("job_id", type=job_id)
    p.add_argument("device_id", type=device_id)
    p.set_defaults(func=cmd_requeue)

    p = sub.add_parser("cap", help="set a device's power cap: a running fine-tune re-selects for it", parents=conn)
    p.add_argument("device_id", type=device_id)
    p.add_argument("watts", type=power_cap_or_none, help="board power cap in W, or 'none' (also 'null') for no cap")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cap)

    p = sub.add_parser("vector", help="show a relation vector (the JSON `edgetrain select --vector` reads)")
    vector_sub = p.add_subparsers(dest="vector_command", required=True)
    p = vector_sub.add_parser("show", help="a stored relation vector, by key or by the job that uses it", parents=conn)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("key", nargs="?", help="the vector's key (events name it)")
    which.add_argument("--job", type=job_id, help="the job whose vector to show")
    p.add_argument("--json", action="store_true", help="the interchange JSON")
    p.set_defaults(func=cmd_vector_show)

    add_profile_commands(sub, conn)
    add_evaluate_command(sub, conn)

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

    p = sub.add_parser("flower", help="run Flower (Celery monitoring) for this cluster", parents=conn)
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--basic-auth-file", type=Path, help="a file holding user:password (or $EDGETRAIN_FLOWER_BASIC_AUTH_FILE)")
    p.add_argument("--basic-auth", help="user:password; visible in ps: prefer --basic-auth-file")
    p.set_defaults(func=cmd_flower)

    p = sub.add_parser("doctor", help="check the deployment (Redis, workers, clocks, permissions) and say what to fix", parents=conn)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("exporter", help="serve the fleet's metrics for Prometheus (reads Redis at each scrape)", parents=conn)
    p.add_argument("--port", type=int, default=9847, help="default 9847")
    p.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1; 0.0.0.0 for a scraper elsewhere)")
    p.set_defaults(func=cmd_exporter)

    p = sub.add_parser(
        "redis-acl", help="a Redis ACL file with a user per role (worker, submitter, monitor; replica and sentinel for Redis Sentinel)"
    )
    p.add_argument("--passwords", type=Path, required=True, help="folder of <role>.password files")
    p.add_argument(
        "--make-secrets",
        action="store_true",
        help="first make a random password file for each role that has none (the folder 0700, the files 0600)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the ACL file to FILE, only once it is complete (default: stdout)")
    p.add_argument("--key-prefix", default=DEFAULT_PREFIX, help="edgetrain's key prefix (EDGETRAIN_KEY_PREFIX)")
    p.set_defaults(func=cmd_redis_acl)
    return parser


MONITOR_COMMANDS = {"doctor", "exporter", "flower"}  # they read every key and write none: the monitor user
WORKER_COMMANDS = {"worker", "profile", "evaluate"}  # they send to device queues or consume tasks: the worker user


def needs_user(command: str) -> str:
    """Which Redis user (workers/commands/redis_acl.py) `edgetrain COMMAND` needs."""
    if command in WORKER_COMMANDS:
        return "the worker user"
    return f"the {'monitor' if command in MONITOR_COMMANDS else 'submitter'} user (or worker)"


def _redis_url(args: argparse.Namespace) -> str:
    """The Redis URL this command used, to name it in a message."""
    from edgetrain.common.settings import SettingsError

    try:
        return settings_from(args).redis_url
    except SettingsError:
        return getattr(args, "redis_url", None) or os.environ.get("EDGETRAIN_REDIS_URL", "?")


def _redis_full(url: str) -> str:
    """What to say when Redis refused a write for lack of memory."""
    import redis

    from edgetrain.common.redis_health import full_message, read_facts
    from edgetrain.common.store import connect

    try:
        return full_message(read_facts(connect(url)))
    except redis.RedisError:
        return "Redis is full (it reached its maxmemory): raise maxmemory or free memory in it"


def main(argv: list[str] | None = None) -> int:
    """Run the `edgetrain` command; returns its exit status (ExitCode). Errors a user can cause
    print one line on stderr saying what to do."""
    import redis

    from edgetrain.common.devices.base import DeviceError
    from edgetrain.common.ids import InvalidIdError
    from edgetrain.common.redis_errors import describe
    from edgetrain.common.redis_health import RedisUnsafe
    from edgetrain.common.settings import SettingsError
    from edgetrain.common.store import DeviceIdTaken, JobNotFoundError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print("\n".join(f"edgetrain: {line}" for line in str(exc).splitlines()), file=sys.stderr)
        return ExitCode.usage
    except RedisUnsafe as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return ExitCode.redis_unsafe
    except redis.exceptions.OutOfMemoryError:
        print(f"edgetrain: {_redis_full(_redis_url(args))}", file=sys.stderr)
        return ExitCode.redis_unsafe
    except (DeviceError, InvalidIdError) as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return ExitCode.usage
    except DeviceIdTaken as exc:
        print(f"edgetrain: {exc}", file=sys.stderr)
        return ExitCode.device_taken
    except JobNotFoundError as exc:
        print(f"edgetrain: {exc.args[0]}; `edgetrain jobs` lists the jobs", file=sys.stderr)
        return ExitCode.not_found
    except redis.RedisError as exc:
        print(f"edgetrain: {describe(exc, _redis_url(args), needs_user(args.command))}", file=sys.stderr)
        return ExitCode.unreachable
    except BrokenPipeError:  # the reader of our output went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.broken_pipe
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.interrupted


if __name__ == "__main__":
    sys.exit(main())
