"""Start a Celery worker of the edgetrain app in this process: it checks that Redis keeps its
data, announces itself (and its device) with a heartbeat, holds a lease on every task it runs
(a control worker instead notes the messages it takes under keys of its own:
tasks/held_messages.py), ends what a revoked task or a dead pool process served, and a control
worker also runs the reaper that hands on the tasks of workers that are gone."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
from typing import NoReturn

import redis
from celery.signals import worker_process_init, worker_shutting_down

from edgetrain.common.host_checks import host_findings
from edgetrain.common.redis_health import RedisUnsafe, problems
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import Settings
from edgetrain.common.store import DeviceIdTaken, Store, WorkerInfo
from edgetrain.common.store.connection import stop_retrying
from edgetrain.tasks import context
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.held_messages import keep_apart, strike_off_when_run
from edgetrain.tasks.leases import hold_leases
from edgetrain.tasks.reaper import Reaper
from edgetrain.tasks.stopped import watch_stopped_tasks

from ..rendering.output import note
from .heartbeat import Heartbeat
from .logs import use_log_format
from .task_events import TaskEventsGate

logger = logging.getLogger(__name__)


TRAINING_ROLES = ("server", "device")  # the roles whose processes run PyTorch; the control worker never imports it
# A worker's main process forks the pool children that train. Asking there whether CUDA is present
# (the software versions a device announces) must not initialise CUDA, or every child's first CUDA
# call fails ("Cannot re-initialize CUDA in forked subprocess"): PyTorch asks NVML instead.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def _set_torch_threads(settings: Settings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)


def check_redis(store: Store) -> None:
    """Refuse (RedisUnsafe) a Redis that evicts keys: it would lose jobs without a word; warn
    of the other problems (common/redis_health.py). A Redis whose settings cannot be read is
    used as it is, with a warning."""
    try:
        found = problems(store.redis_facts())
    except redis.ResponseError as exc:
        logger.warning("cannot check Redis's eviction policy and persistence (%s); make sure it has "
                       "maxmemory-policy noeviction and appendonly yes", exc)  # fmt: skip
        return
    for problem in found:
        if problem.severe:
            raise RedisUnsafe(f"refusing to start: {problem.line()}")
        logger.warning("%s", problem.line())


def _shutting_down(store: Store, instance: str) -> None:
    """worker_shutting_down: wait for Redis no more (with Redis gone too, a host shutdown, the
    worker exits in seconds), and tell this worker's running fine-tunes to checkpoint and stop."""
    stop_retrying()
    try:
        store.liveness.request_stop(instance)
    except redis.RedisError as exc:
        logger.warning("cannot tell the running fine-tunes to stop (%s): they stop when their process does", exc)


def consume(queues: list[str], name: str, role: str, concurrency: int, loglevel: str = "INFO", device: DeviceInfo | None = None) -> int:
    """Consume `queues` with the app `context.init` configured (prefork pool: tasks run in
    child processes the worker survives), until a shutdown signal (SIGTERM/SIGINT: warm
    shutdown). Returns the worker's exit status: 0 after a shutdown signal, non-zero when it
    stopped on an error. DeviceIdTaken when `device`'s id is served by another live worker, at
    start or later (then the worker stops at once, leaving the device to the other);
    RedisUnsafe when Redis evicts keys."""
    settings, store = context.settings(), context.store()
    check_redis(store)
    if role in TRAINING_ROLES:
        _set_torch_threads(settings)
        worker_process_init.connect(lambda **_: _set_torch_threads(settings), weak=False)
    node = f"{name}@{socket.gethostname()}"
    found = host_findings(settings, role, node, context.bound_device(device.device_id) if device else None)
    for finding in found:
        note(f"warning: {finding.problem}; fix: {finding.fix}")
    info = WorkerInfo(node=node, role=role, queues=queues, hostname=socket.gethostname(), pid=os.getpid(), findings=found)
    if role == "control":  # its tasks are many and short
        TaskEventsGate(store)
        store.fleet.index_caps()
    heartbeat = Heartbeat(store, settings, info, device)
    reaper = Reaper(store, producer_app(settings), settings) if role == "control" else None  # restores on the shared keys
    try:  # from the first beat on, a shutdown signal (SystemExit) leaves the registry in `finally`
        heartbeat.first_beat(settings.heartbeat_ttl_s + settings.heartbeat_s, note)
        heartbeat.start()
        if reaper:  # a control worker's tasks hold no lease: its heartbeat stands for them
            keep_apart(context.app(), heartbeat.instance)
            store.liveness.note_consumer(heartbeat.instance)
            strike_off_when_run()
            reaper.start()
        else:
            hold_leases()
        watch_stopped_tasks(heartbeat.instance)
        worker_shutting_down.connect(lambda **_: _shutting_down(store, heartbeat.instance), weak=False,
                                     dispatch_uid="edgetrain-shutting-down")  # fmt: skip
        use_log_format(settings.log_format, device.device_id if device else None)
        logger.info("worker %s consuming %s", node, ",".join(queues))
        worker = context.app().Worker(
            hostname=node, queues=queues, concurrency=concurrency, pool_cls="prefork", loglevel=loglevel, task_events=True
        )
        worker.start()
        status = int(worker.exitcode or 0)
    finally:
        stop_retrying()
        if reaper:
            reaper.stop()
        heartbeat.stop()
    if heartbeat.replaced and device is not None:
        raise DeviceIdTaken(device.device_id, store.fleet.owner(device.device_id) or "?")
    return status


def end_process(status: int) -> NoReturn:
    """End a worker's process with `status` once its worker has stopped (its tasks finished or
    handed back, its registry entries removed, a device's settings restored): the exit hooks run
    (logging's own flushes its handlers) and the output is flushed, but the interpreter's
    teardown, which frees PyTorch's modules one by one (about a second of CPU, several seconds
    of wall time on a busy machine), is skipped, as Celery's pool processes skip it."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_worker(
    settings: Settings, role: str, queues: list[str], name: str, concurrency: int, loglevel: str = "INFO",
    task_modules: tuple[str, ...] | None = None,
) -> int:  # fmt: skip
    """Configure this process from `settings` and consume `queues`, running the tasks of
    `task_modules` (default: all); returns the worker's exit status."""
    context.init(settings, task_modules)
    return consume(queues, name, role, concurrency, loglevel)
