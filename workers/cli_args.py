"""What every `edgetrain` command shares: connection options, settings and exit codes."""

from __future__ import annotations

import argparse
import math
import re
import sys
from enum import IntEnum
from urllib.parse import parse_qs, urlparse

from edgetrain.common.schemas import ID_PATTERN
from edgetrain.common.settings import Settings


class ExitCode(IntEnum):
    """Exit statuses of the `edgetrain` command."""

    ok = 0
    failed = 1  # the work ran and failed (a job not completed, a profile that failed)
    usage = 2  # bad input: arguments, a spec, an unknown device
    infeasible = 3  # no configuration meets the power cap
    unreachable = 4  # Redis cannot be reached (or refuses the credentials)
    not_found = 5  # no job, table or vector by that id
    interrupted = 130
    broken_pipe = 141  # whoever read the output went away (`| head`)


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


def device_id(text: str) -> str:
    """An argparse type: a device id as the fleet accepts it."""
    if re.fullmatch(ID_PATTERN, text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device id: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return text


def power_cap(text: str) -> float:
    """An argparse type: a board power cap, a finite number of watts above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of watts") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a power cap is a finite number of watts above 0")
    return value


def power_cap_or_none(text: str) -> float | None:
    """An argparse type: a board power cap in watts, or 'none'/'null' for no cap."""
    return None if text.strip().lower() in ("none", "null") else power_cap(text)


def redacted(url: str) -> str:
    """`url` with its password replaced by ***, to be shown to people."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    return parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@")).geturl()


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
