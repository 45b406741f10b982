"""The reaper: hands on the tasks whose process is gone, and wakes the jobs of devices that
stopped heartbeating, and once more when they are heard from again. It runs as a thread of every control worker; each lost task is handed
on by exactly one of them.

A lost task (its lease not renewed for `lease_ttl_s`) is handed on at once, instead of after
the broker's visibility timeout:
- `profile_device`: its claim on the table is released and the jobs waiting on the table
  re-plan (onto another device of that type, or the same one once it is back);
- every other task: its unacknowledged message goes back to its queue, so the restarted
  device, or any server worker, runs it again (a fine-tune resumes from its checkpoint).
The job it served gets an `attempt_lost` event."""

from __future__ import annotations

import json
import logging
import threading

from celery import Celery
from typing_extensions import override

from edgetrain.common.jobs import EventKind
from edgetrain.common.keys import table_id, table_resource, vector_key, vector_resource
from edgetrain.common.models import get_model
from edgetrain.common.payloads import ProfileRequest, ProxyRunRequest, device_page
from edgetrain.common.settings import Settings
from edgetrain.common.store import Lease, Store, token_job

from .contract import TaskName, send

logger = logging.getLogger(__name__)


def restore_message(app: Celery, task_id: str) -> bool:
    """Put the unacknowledged broker message of `task_id` back at the head of its queue
    (kombu's own restore, as the visibility timeout would); False if it is not unacknowledged."""
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for tag, raw in channel.client.hgetall(channel.unacked_key).items():
            message = json.loads(raw)[0]
            if message.get("headers", {}).get("id") == task_id:
                channel.qos.restore_by_tag(tag)
                return True
    return False


def _release_profile(store: Store, app: Celery, lease: Lease) -> str:
    request = ProfileRequest.model_validate(lease.payload)
    resource = table_resource(table_id(request.device_type, request.model, get_model(request.model).input_shape))
    if not store.coordination.release_if_held_by(resource, request.owner):
        return "its claim had already moved on"
    for job_id in store.coordination.take_waiters(resource):
        send(app, TaskName.advance_job, job_id)
    return "its claim on the table was released; the jobs waiting on it plan again"


def _job_of(store: Store, lease: Lease) -> str | None:
    """The job a lost task served: named in its payload, or, for a proxy run, the job that
    claimed the relation vector."""
    if lease.job_id or lease.task != TaskName.train_proxy.value or not lease.payload:
        return lease.job_id
    holder = store.coordination.holder(vector_resource(vector_key(ProxyRunRequest.model_validate(lease.payload).request)))
    return token_job(holder) if holder else None


def hand_on(store: Store, app: Celery, settings: Settings, lease: Lease) -> None:
    """Hand a lost task on (see the module docstring) and say so in its job's events."""
    if lease.task == TaskName.profile_device.value and lease.payload:
        outcome = _release_profile(store, app, lease)
    elif restore_message(app, lease.task_id):
        outcome = "re-queued"
    else:
        outcome = "its message was already handled"
    message = f"the worker running {lease.task.removeprefix('edgetrain.')} ({lease.node}) stopped; {outcome}"
    logger.warning("task %s: %s", lease.task_id, message)
    job_id = _job_of(store, lease)
    if job_id:
        store.jobs.event(job_id, EventKind.attempt_lost, message, lease.device_id)
        if lease.task not in (TaskName.advance_job.value, TaskName.advance_page.value):
            _advance(store, app, settings, job_id, lease.device_id)


def _advance(store: Store, app: Celery, settings: Settings, job_id: str, device_id: str | None) -> None:
    """Advance the page of the job that holds `device_id` (the whole job without a device)."""
    record = store.jobs.record(job_id)
    if record is not None and device_id is not None:
        send(app, TaskName.advance_page, device_page(job_id, record.spec, device_id, settings.page_size))
    elif record is not None:
        send(app, TaskName.advance_job, job_id)


def reap_once(store: Store, app: Celery, settings: Settings, silent_before: frozenset[str] = frozenset()) -> frozenset[str]:
    """One pass: hand on lost tasks; advance the jobs of devices that stopped heartbeating,
    and of those in `silent_before` (the previous pass's answer) that are heard from again, so
    their parts drop the notice that the device is missing. Returns the devices silent now."""
    for lease in store.liveness.expired(settings.lease_ttl_s):
        if store.liveness.reap(lease.task_id):
            hand_on(store, app, settings, lease)
    silent = frozenset(store.fleet.silent_since(settings.heartbeat_ttl_s))
    for device_id in sorted(silent | silent_before):
        for job_id in store.jobs.device_jobs(device_id):
            _advance(store, app, settings, job_id, device_id)
    return silent


class Reaper(threading.Thread):
    """Runs `reap_once` every `settings.reaper_interval_s` seconds until stopped."""

    def __init__(self, store: Store, app: Celery, settings: Settings):
        super().__init__(name="edgetrain-reaper", daemon=True)
        self.store, self.app, self.settings = store, app, settings
        self.stopped = threading.Event()

    @override
    def run(self) -> None:
        silent: frozenset[str] = frozenset()
        while not self.stopped.wait(self.settings.reaper_interval_s):
            try:
                silent = reap_once(self.store, self.app, self.settings, silent)
            except Exception:  # Redis restarting, or a bug: log it and try again next period
                logger.exception("reaper pass failed")

    def stop(self) -> None:
        """Stop after the current pass."""
        self.stopped.set()
