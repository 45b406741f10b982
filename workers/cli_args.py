"""What every `edgetrain` command shares: connection options, settings and exit codes."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from enum import IntEnum
from urllib.parse import parse_qs, urlparse

from edgetrain.common.ids import InvalidIdError, checked_id
from edgetrain.common.jobs.planner import never_registered
from edgetrain.common.jobs.reports import JobReport
from edgetrain.common.jobs.state import JobState, PartState
from edgetrain.common.selection import InfeasibleCapError
from edgetrain.common.settings import Settings


class ExitCode(IntEnum):
    """Exit statuses of the `edgetrain` command (the README's table lists every one)."""

    ok = 0
    failed = 1  # the work ran and failed (a job not completed or its target not reached, a profile that failed)
    usage = 2  # bad input: arguments, a spec, an unknown device
    infeasible = 3  # no configuration meets the power cap
    unreachable = 4  # Redis cannot be reached (or refuses the credentials)
    not_found = 5  # no job, table or vector by that id
    finished = 6  # nothing to do: the job has finished already (cancel)
    device_taken = 7  # another live worker serves this device id (a device worker refused or replaced)
    redis_unsafe = 8  # Redis is full, or evicts keys (it would lose jobs): the message names the setting
    timed_out = 124  # `--timeout` passed before the job finished (the job goes on), as timeout(1) says it
    interrupted = 130
    broken_pipe = 141  # whoever read the output went away (`| head`)


def job_exit_code(report: JobReport) -> ExitCode:
    """A finished job's exit status: ok when every device completed and reached the target;
    infeasible when every device that failed did because no configuration meets its power cap;
    usage (bad input) when every one that failed is an unknown device (it never registered);
    failed otherwise."""
    failed = [d for d in report.devices if d.state == PartState.failed]
    if failed and all(InfeasibleCapError.describes(d.reason) for d in failed):
        return ExitCode.infeasible
    if failed and all(never_registered(d.reason) for d in failed):
        return ExitCode.usage
    reached = all(d.achieved is not None and d.achieved.reached for d in report.devices)
    return ExitCode.ok if report.state == JobState.completed and reached else ExitCode.failed


def connection_options(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """A parent parser with --redis-url, accepted before or after the subcommand."""
    parser = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS if suppress_defaults else None
    parser.add_argument("--redis-url", default=default, help="Redis URL (default: $EDGETRAIN_REDIS_URL)")
    return parser


def warn_secret_on_command_line(option: str, instead: str) -> None:
    """Say on stderr that a secret given as `option` is visible to every local user (`ps`)."""
    print(f"edgetrain: warning: the secret in {option} is visible to every user of this machine (ps, /proc); "
          f"use {instead} instead", file=sys.stderr)  # fmt: skip


def _id_type(field: str) -> Callable[[str], str]:
    def checked(text: str) -> str:
        try:
            return checked_id(text, field)
        except InvalidIdError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = field  # argparse names the type in its messages
    return checked


device_id = _id_type("device id")  # an argparse type: a device id as the fleet accepts it
job_id = _id_type("job id")  # an argparse type: a job id


def _positive(text: str, unit: str, what: str) -> float:
    """`text` as a finite number above 0, or an argparse error naming `what` and its `unit`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: {what} is a finite number of {unit} above 0")
    return value


def page_number(text: str) -> int:
    """An argparse type: a page number, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid page {text!r}: a whole number, 0 or more")
    return int(text)


def power_cap(text: str) -> float:
    """An argparse type: a board power cap, a finite number of watts above 0."""
    return _positive(text, "watts", "a power cap")


def positive_seconds(text: str) -> float:
    """An argparse type: a time limit, a finite number of seconds above 0."""
    return _positive(text, "seconds", "a time limit")


def power_cap_or_none(text: str) -> float | None:
    """An argparse type: a board power cap in watts, or 'none'/'null' for no cap."""
    return None if text.strip().lower() in ("none", "null") else power_cap(text)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of this command: the environment, overridden by --redis-url (with a warning
    when it holds a password)."""
    url = getattr(args, "redis_url", None)
    if not url:
        return Settings()
    parsed = urlparse(url)
    if parsed.password or "password" in parse_qs(parsed.query):
        warn_secret_on_command_line("--redis-url", "EDGETRAIN_REDIS_URL or EDGETRAIN_REDIS_URL_FILE")
    return Settings(redis_url=url, redis_url_file=None)
