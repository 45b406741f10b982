"""Server workers for proxy training: CPU processes, or one process per GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from edgetrain.common.settings import Settings
from edgetrain.tasks.contract import SERVER_QUEUE

from .celery_worker import run_worker

SERVER_TASKS = ("edgetrain.tasks.workflow", "edgetrain.tasks.server", "edgetrain.tasks.federated_work")


def run_server_workers(settings: Settings, name: str | None, concurrency: int, gpus: str | None, loglevel: str) -> int:
    """Without `gpus`, one Celery worker with `concurrency` processes. With `gpus` ("0,1"),
    one worker process per GPU, each seeing only its GPU (CUDA_VISIBLE_DEVICES), since CUDA
    cannot be initialised again in a forked child. Returns the exit status (the worst of
    the processes)."""
    base = name or "server"
    if not gpus:
        return run_worker(settings, "server", [SERVER_QUEUE], base, concurrency, loglevel, SERVER_TASKS)
    children = []
    for index in gpus.split(","):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": index.strip(), "EDGETRAIN_REDIS_URL": settings.redis_url,
               "EDGETRAIN_KEY_PREFIX": settings.key_prefix}  # fmt: skip
        name = f"{base}-gpu{index.strip()}"
        argv = [
            sys.executable,
            "-m",
            "edgetrain.workers.cli",
            "worker",
            "server",
            "--name",
            name,
            "--loglevel",
            loglevel,
            "--log-format",
            settings.log_format,
        ]
        children.append(subprocess.Popen(argv, env=env))

    def forward(sig: int, _frame: object) -> None:
        for child in children:
            child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)
