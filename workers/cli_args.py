"""What every `edgetrain` command shares: connection options, settings and exit codes."""

from __future__ import annotations

import argparse
import sys
from enum import IntEnum
from urllib.parse import parse_qs, urlparse

from edgetrain.common.settings import Settings


class ExitCode(IntEnum):
    """Exit statuses of the `edgetrain` command."""

    ok = 0
    failed = 1  # the work ran and failed (a job not completed, a profile that failed)
    usage = 2  # bad input: arguments, a spec, an unknown device or table
    infeasible = 3  # no configuration meets the power cap
    interrupted = 130


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
