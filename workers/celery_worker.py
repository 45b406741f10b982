"""Start a Celery worker of the edgetrain app in this process."""

from __future__ import annotations

import os
import socket

import torch
from celery.signals import worker_process_init

from edgetrain.common.settings import get_settings


def _set_torch_threads(**_: object) -> None:
    threads = get_settings().torch_threads
    if threads:
        torch.set_num_threads(threads)


worker_process_init.connect(_set_torch_threads, weak=False)


def run_worker(queues: list[str], name: str, concurrency: int, pool: str, loglevel: str = "INFO") -> None:
    """Consume `queues` until a shutdown signal (SIGTERM/SIGINT: warm shutdown)."""
    from edgetrain.tasks.app import app

    _set_torch_threads()
    node = f"{name}@{socket.gethostname()}"
    os.environ.setdefault("EDGETRAIN_WORKER_NAME", node)
    app.worker_main(
        argv=["worker", "-Q", ",".join(queues), "-n", node, "-c", str(concurrency), "-P", pool, "--loglevel", loglevel, "-E"]
    )
