"""Task leases: the process that runs a task holds a lease on it and renews it while the task
runs, so the control worker's reaper (tasks/reaper.py) knows within `lease_ttl_s` seconds when
that process is gone, instead of waiting out the broker's visibility timeout.

The leases are taken and released by Celery's task_prerun/task_postrun signals in the process
that runs the task (a pool child under prefork); one thread per process renews them."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import Task
from celery.signals import task_postrun, task_prerun
from typing_extensions import override

from edgetrain.common.store import Lease, Store

from .contract import TaskName

logger = logging.getLogger(__name__)
_PAYLOAD_KEPT = {TaskName.profile_device.value, TaskName.train_proxy.value}  # whose loss needs more than a retry


class LeaseKeeper(threading.Thread):
    """Renews the leases of the tasks this process runs, every `period_s` seconds."""

    def __init__(self, store: Store, period_s: float):
        super().__init__(name="edgetrain-leases", daemon=True)
        self.store, self.period_s = store, period_s
        self.task_ids: set[str] = set()
        self.lock = threading.Lock()

    @override
    def run(self) -> None:
        while True:
            with self.lock:
                held = sorted(self.task_ids)
            try:
                self.store.liveness.renew(held)
            except Exception as exc:  # Redis restarting: renew next period
                logger.warning("renewing task leases failed: %s", exc)
            time.sleep(self.period_s)


_keeper: tuple[int, LeaseKeeper] | None = None


def _process_keeper() -> LeaseKeeper:
    """This process's keeper (a forked pool child starts its own)."""
    global _keeper
    from .context import settings, store

    if _keeper is None or _keeper[0] != os.getpid():
        keeper = LeaseKeeper(store(), settings().heartbeat_s)
        keeper.start()
        _keeper = (os.getpid(), keeper)
    return _keeper[1]


def _subject(task: Task, args: tuple[Any, ...]) -> dict[str, Any]:
    """The job and device a task serves, read from its payload."""
    payload = args[0] if args else None
    if task.name == TaskName.advance_job.value:
        return {"job_id": payload}
    if isinstance(payload, dict):
        return {
            "job_id": payload.get("job_id"),
            "device_id": payload.get("device_id"),
            "payload": payload if task.name in _PAYLOAD_KEPT else None,
        }
    return {}


def take_lease(task_id: str, task: Task, args: tuple[Any, ...], **_: Any) -> None:
    """task_prerun: record that this process runs `task_id`, and keep renewing it."""
    from .context import store

    keeper = _process_keeper()
    delivery = task.request.delivery_info or {}
    lease = Lease(task_id=task_id, task=task.name, node=task.request.hostname or "?", queue=delivery.get("routing_key"),
                  **_subject(task, args))  # fmt: skip
    store().liveness.take(lease)
    with keeper.lock:
        keeper.task_ids.add(task_id)


def release_lease(task_id: str, **_: Any) -> None:
    """task_postrun: the task finished (whatever its outcome)."""
    from .context import store

    keeper = _process_keeper()
    with keeper.lock:
        keeper.task_ids.discard(task_id)
    store().liveness.release(task_id)


def hold_leases() -> None:
    """Take and release leases around every task this worker process runs."""
    task_prerun.connect(take_lease, weak=False, dispatch_uid="edgetrain-take-lease")
    task_postrun.connect(release_lease, weak=False, dispatch_uid="edgetrain-release-lease")
