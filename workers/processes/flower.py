"""Flower (Celery monitoring) for an edgetrain cluster, never open to the network without a login.

Flower can read every task's arguments and can shut workers down, so it listens on loopback
unless authentication is configured: HTTP basic auth from a file (`--basic-auth-file`,
`EDGETRAIN_FLOWER_BASIC_AUTH_FILE`) or the environment (`EDGETRAIN_FLOWER_BASIC_AUTH`), or
Flower's own `FLOWER_BASIC_AUTH` / `FLOWER_AUTH` (OAuth). Flower's HTTP API answers only with
authentication, or on any address with `FLOWER_UNAUTHENTICATED_API=true`.

On the `monitor` Redis user (workers/commands/redis_acl.py), which has no remote control, Flower shows
the workers and tasks from their events and the queue lengths of `ClusterQueues`, and cannot
shut workers down or revoke tasks; on the `worker` user it can. Flower still tries to inspect
the workers at start and logs a warning for each refusal ("Inspect method stats failed: this
user has no permissions ..."): each one says that it is expected (`ExpectedRefusals`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from celery.events import EventReceiver
from kombu import Queue

from edgetrain.common.redis_address import redis_user
from edgetrain.common.secret_files import read_secret
from edgetrain.common.settings import Settings
from edgetrain.common.store import Store
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, device_queue

AUTH_ENV = "EDGETRAIN_FLOWER_BASIC_AUTH"
FLOWER_AUTH_ENV = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")  # Flower's own options, read by Flower


class FlowerConfigError(ValueError):
    """Flower would serve the network without a login, or its credentials are unreadable."""


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP address or host name) is only reachable from this machine."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def read_basic_auth(file: Path | None) -> str | None:
    """user:password from `file`, else $EDGETRAIN_FLOWER_BASIC_AUTH_FILE, else
    $EDGETRAIN_FLOWER_BASIC_AUTH; None when none is set."""
    file = file or (Path(os.environ[f"{AUTH_ENV}_FILE"]) if os.environ.get(f"{AUTH_ENV}_FILE") else None)
    if file is not None:
        try:
            value = read_secret("Flower credentials", file)
        except ValueError as exc:
            raise FlowerConfigError(str(exc)) from None
    else:
        value = os.environ.get(AUTH_ENV, "").strip()
    return checked_basic_auth(value) if value else None


def checked_basic_auth(value: str) -> str:
    """`value` if it is user:password (several separated by commas); FlowerConfigError otherwise."""
    if any(":" not in pair for pair in value.split(",")):
        raise FlowerConfigError("Flower credentials must be user:password (several separated by commas)")
    return value


def exposure_problem(address: str, basic_auth: str | None) -> str | None:
    """Why Flower may not listen on `address` with these credentials, or None."""
    if is_loopback(address) or basic_auth or any(os.environ.get(name) for name in FLOWER_AUTH_ENV):
        return None
    return (
        f"refusing to serve Flower on {address} without authentication: anyone who reaches it could read "
        f"every task and shut workers down. Give --basic-auth-file FILE (user:password) or set "
        f"{AUTH_ENV}_FILE, or listen on 127.0.0.1 (the default)"
    )


def _no_wakeup(_receiver: EventReceiver, channel: object = None) -> None:
    """Flower's event capture would first broadcast a remote-control `heartbeat` to wake the
    workers; the `monitor` user may not broadcast, and the workers send a heartbeat every 2 s."""


class ClusterQueues:
    """The queues whose lengths Flower shows, for a Flower that cannot ask the workers which
    they consume (the `monitor` user may not use Celery's remote control): control, server and
    the queue of each live device, read from the store each time Flower asks."""

    def __init__(self, store: Store):
        self.store = store

    def __iter__(self) -> Iterator[Queue]:
        names = [CONTROL_QUEUE, SERVER_QUEUE, *(device_queue(d.device_id) for d in self.store.fleet.devices())]
        return iter([Queue(name) for name in names])


class ExpectedRefusals(logging.Filter):
    """Adds to Flower's warnings of refused worker inspections that they are expected of a
    user without remote control (the `monitor` user)."""

    def __init__(self, user: str):
        super().__init__()
        self.user = user

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record; explain a refusal."""
        message = record.getMessage()
        if "no permissions" in message:
            record.msg, record.args = (f"{message} (expected with the Redis user {self.user!r}, which has no remote control: "
                                       "Flower shows the workers and tasks from their events, and cannot inspect, revoke or "
                                       "shut down)"), None  # fmt: skip
        return True


def run_flower(settings: Settings, address: str, port: int, basic_auth: str | None) -> None:
    """Run Flower for the cluster of `settings` until it is stopped; FlowerConfigError first
    when it would serve the network without a login."""
    problem = exposure_problem(address, basic_auth)
    if problem:
        raise FlowerConfigError(problem)
    from edgetrain.tasks import context

    context.init(settings, task_modules=())
    context.app().conf.task_queues = ClusterQueues(context.store())
    logging.getLogger("flower.inspector").addFilter(ExpectedRefusals(redis_user(settings.redis_url) or "default"))
    EventReceiver.wakeup_workers = _no_wakeup
    argv = ["flower", f"--port={port}", f"--address={address}", "--enable_events=False"]  # the workers send events anyway
    if basic_auth:
        argv.append(f"--basic-auth={basic_auth}")  # Flower's own argv, not this process's: not in `ps`
    context.app().start(argv=argv)
