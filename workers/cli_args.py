"""What every `edgetrain` command shares: connection options, settings and exit codes."""

from __future__ import annotations

import argparse
from enum import IntEnum

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


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of this command: the environment, overridden by --redis-url."""
    return Settings(**({"redis_url": args.redis_url} if getattr(args, "redis_url", None) else {}))
