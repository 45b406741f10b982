"""Task leases: the process that runs a device or server task holds a lease on it and renews it
while the task runs, so the control worker's reaper (tasks/reaper.py) knows within
`lease_ttl_s` seconds when that process is gone, instead of waiting out the broker's
visibility timeout. The control worker's own tasks hold none (tasks/held_messages.py).

The leases are taken and released by Celery's task_prerun/task_postrun signals in the process
that runs the task (a pool child under prefork); one thread per process renews them."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
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
        self.attempts: dict[str, str] = {}  # task id -> the token of its run in this process
        self.lock = threading.Lock()

    @override
    def run(self) -> None:
        while True:
            with self.lock:
                held = dict(self.attempts)
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


def task_subject(name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """The job and device task `name` serves, read from its payload."""
    payload = args[0] if args else None
    if name == TaskName.advance_job.value:
        return {"job_id": payload}
    if isinstance(payload, dict):
        return {
            "job_id": payload.get("job_id"),
            "device_id": payload.get("device_id"),
            "payload": payload if name in _PAYLOAD_KEPT else None,
        }
    return {}


def worker_instance(task: Task) -> str:
    """The worker instance whose pool process runs `task`: node:pid of its main process."""
    return f"{task.request.hostname or '?'}:{os.getppid()}"


def take_lease(task_id: str, task: Task, args: tuple[Any, ...], **_: Any) -> None:
    """task_prerun: record that this process runs `task_id`, and keep renewing it."""
    from .context import store

    keeper = _process_keeper()
    delivery = task.request.delivery_info or {}
    attempt = uuid.uuid4().hex
    lease = Lease(task_id=task_id, task=task.name, attempt=attempt, node=task.request.hostname or "?", instance=worker_instance(task),
                  queue=delivery.get("routing_key"), **task_subject(task.name, args))  # fmt: skip
    store().liveness.take(lease)
    with keeper.lock:
        keeper.attempts[task_id] = attempt


def attempt_token(task_id: str) -> str:
    """The token of the run of `task_id` in this process (its lease's): it fences the run's writes."""
    keeper = _process_keeper()
    with keeper.lock:
        return keeper.attempts[task_id]


def release_lease(task_id: str, **_: Any) -> None:
    """task_postrun: the task finished (whatever its outcome): it holds no lease and, if the
    ledger of sent tasks lists it, it has run."""
    from .context import store

    keeper = _process_keeper()
    with keeper.lock:
        attempt = keeper.attempts.pop(task_id, None)
    store().liveness.finish(task_id, attempt)


def hold_leases() -> None:
    """Take and release leases around every task this worker process runs."""
    task_prerun.connect(take_lease, weak=False, dispatch_uid="edgetrain-take-lease")
    task_postrun.connect(release_lease, weak=False, dispatch_uid="edgetrain-release-lease")
