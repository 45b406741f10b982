"""Start a Celery worker of the edgetrain app in this process: it announces itself (and its
device) with a heartbeat, holds a lease on every task it runs, and a control worker also runs
the reaper that hands on the tasks of workers that are gone."""

from __future__ import annotations

import logging
import os
import socket

from celery.signals import task_failure, worker_process_init

from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import Settings
from edgetrain.common.store import WorkerInfo
from edgetrain.tasks import context
from edgetrain.tasks.leases import hold_leases
from edgetrain.tasks.reaper import Reaper

from .heartbeat import Heartbeat
from .output import note

logger = logging.getLogger(__name__)


def _set_torch_threads(settings: Settings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)


def consume(
    queues: list[str], name: str, role: str, concurrency: int, loglevel: str = "INFO", device: DeviceInfo | None = None
) -> None:
    """Consume `queues` with the app `context.init` configured (prefork pool: tasks run in
    child processes the worker survives), until a shutdown signal (SIGTERM/SIGINT: warm
    shutdown). DeviceIdTaken when `device`'s id is served by another live worker."""
    settings, store = context.settings(), context.store()
    _set_torch_threads(settings)
    worker_process_init.connect(lambda **_: _set_torch_threads(settings), weak=False)
    node = f"{name}@{socket.gethostname()}"
    info = WorkerInfo(node=node, role=role, queues=queues, hostname=socket.gethostname(), pid=os.getpid())
    heartbeat = Heartbeat(store, settings, info, device)
    heartbeat.first_beat(settings.heartbeat_ttl_s + settings.heartbeat_s, note)
    heartbeat.start()
    reaper = Reaper(store, context.app(), settings) if role == "control" else None
    if reaper:
        reaper.start()
    hold_leases()
    logger.info("worker %s consuming %s", node, ",".join(queues))
    try:
        context.app().worker_main(
            argv=["worker", "-Q", ",".join(queues), "-n", node, "-c", str(concurrency), "-P", "prefork", "--loglevel", loglevel, "-E"]
        )
    finally:
        if reaper:
            reaper.stop()
        heartbeat.stop()


def run_worker(
    settings: Settings, role: str, queues: list[str], name: str, concurrency: int, loglevel: str = "INFO",
    task_modules: tuple[str, ...] | None = None,
) -> None:  # fmt: skip
    """Configure this process from `settings` and consume `queues`, running the tasks of
    `task_modules` (default: all)."""
    context.init(settings, task_modules)
    consume(queues, name, role, concurrency, loglevel)


def watch_lost_children() -> None:
    """In a device worker's main process: fail the part or table of a task whose pool child
    died or hit its hard time limit (the worker itself lives on)."""
    from edgetrain.tasks.device import on_lost_child

    task_failure.connect(on_lost_child, weak=False, dispatch_uid="edgetrain-lost-child")
