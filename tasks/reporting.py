"""Progress callbacks for running tasks: each report is recorded in the store (for `status`,
`on_update` and `evaluate`) and shown in Flower (the task's state PROGRESS, with the report as
its result). Reports are best effort: one that cannot be written is logged and skipped, and
the work goes on."""

from __future__ import annotations

from collections.abc import Callable

from celery import Task
from celery.utils.log import get_task_logger
from kombu.exceptions import OperationalError
from redis import RedisError

from edgetrain.common.jobs.state import FinetuneProgress
from edgetrain.common.progress import ProfilingProgress, ProxyRunProgress, finetune_line, throttled

from .context import store
from .contract import show_progress

logger = get_task_logger(__name__)


def _best_effort(record: Callable[[], None]) -> None:
    try:
        record()
    except (RedisError, OperationalError, OSError) as exc:
        logger.warning("a progress report was not recorded: %s", exc)


def proxy_run_reporter(task: Task, vector_key: str) -> Callable[[ProxyRunProgress], None]:
    """Reports of a proxy run of vector `vector_key`."""

    def report(progress: ProxyRunProgress) -> None:
        _best_effort(lambda: store().progress.put_proxy_run(vector_key, progress))
        _best_effort(lambda: show_progress(task, progress.line()))

    return report


def profiling_reporter(task: Task, device_id: str) -> Callable[[ProfilingProgress], None]:
    """Reports of a profile measured on `device_id`."""

    def report(progress: ProfilingProgress) -> None:
        progress = progress.model_copy(update={"device_id": device_id})
        _best_effort(lambda: store().progress.put_profiling(progress))
        _best_effort(lambda: show_progress(task, progress.line()))

    return report


def finetune_reporter(task: Task) -> Callable[[FinetuneProgress], None]:
    """A fine-tune's evaluations in Flower (at most about once a second; the store has them already)."""
    say = task_line(task)
    return throttled(lambda progress: say(finetune_line(progress)))


def task_line(task: Task) -> Callable[[str], None]:
    """A line about the running task for Flower."""
    return lambda text: _best_effort(lambda: show_progress(task, text))
