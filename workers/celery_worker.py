"""Start a Celery worker of the edgetrain app in this process."""

from __future__ import annotations

import logging
import socket

from celery.signals import worker_process_init

from edgetrain.common.settings import Settings
from edgetrain.tasks import context

logger = logging.getLogger(__name__)


def _set_torch_threads(settings: Settings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)


def consume(queues: list[str], name: str, concurrency: int, pool: str, loglevel: str = "INFO") -> None:
    """Consume `queues` with the app `context.init` configured, until a shutdown signal
    (SIGTERM/SIGINT: warm shutdown)."""
    settings = context.settings()
    _set_torch_threads(settings)
    worker_process_init.connect(lambda **_: _set_torch_threads(settings), weak=False)
    node = f"{name}@{socket.gethostname()}"
    logger.info("worker %s consuming %s", node, ",".join(queues))
    context.app().worker_main(
        argv=["worker", "-Q", ",".join(queues), "-n", node, "-c", str(concurrency), "-P", pool, "--loglevel", loglevel, "-E"]
    )


def run_worker(
    settings: Settings,
    queues: list[str],
    name: str,
    concurrency: int,
    pool: str,
    loglevel: str = "INFO",
    task_modules: tuple[str, ...] | None = None,
) -> None:
    """Configure this process from `settings` and consume `queues`, running the tasks of
    `task_modules` (default: all)."""
    context.init(settings, task_modules)
    consume(queues, name, concurrency, pool, loglevel)
