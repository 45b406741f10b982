"""What a task needs from its process: the settings, the store, and on a device worker the
device it is bound to. The entry point calls `init` once; tasks call the accessors."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery, current_task

from edgetrain.common.devices.base import Device
from edgetrain.common.settings import Settings, get_settings
from edgetrain.common.store import Store

from .app import TASK_MODULES, configure
from .app import app as celery_app
from .contract import RETRIES, queue_role


@dataclass
class _Process:
    settings: Settings
    store: Store
    device: tuple[str, Device] | None = None


_process: _Process | None = None


class WrongDeviceError(RuntimeError):
    """A device task reached the worker of another device."""


def init(settings: Settings, task_modules: tuple[str, ...] | None = None) -> Store:
    """Configure this process (the Celery app and the store) from `settings`."""
    global _process
    configure(settings, task_modules or TASK_MODULES)
    store = Store.connect(settings.redis_url, settings.key_prefix, patient=True, job_retention_s=settings.job_retention_s or None)
    _process = _Process(settings, store)
    return _process.store


def _current() -> _Process:
    if _process is None:  # a worker started by `celery worker` directly: settings from the environment
        init(get_settings())
    assert _process is not None
    return _process


def app() -> Celery:
    """The worker app, configured."""
    _current()
    return celery_app


def settings() -> Settings:
    """The settings of this process."""
    return _current().settings


def store() -> Store:
    """This process's store (a patient Redis connection)."""
    return _current().store


def bind_device(device_id: str, device: Device) -> None:
    """Called once by a device worker at start: its tasks run on this device."""
    _current().device = (device_id, device)


def bound_device_id() -> str | None:
    """The id of the device this worker serves, if it is a device worker."""
    bound = _current().device
    return bound[0] if bound else None


def bound_device(device_id: str) -> Device:
    """The device of this worker; WrongDeviceError when the task names another one."""
    bound = _current().device
    if bound is None or bound[0] != device_id:
        raise WrongDeviceError(f"task for device {device_id!r} reached the worker of {bound[0] if bound else None!r}")
    return bound[1]


def attempts_exceeded(task_id: str) -> bool:
    """Count a delivery of a task; True once a redelivered task (its worker died) has been
    tried more often than the retry cap allows. A redelivery counts as a retry of the role
    whose queue delivered it."""
    deliveries = store().coordination.count_attempt(task_id)
    if deliveries > 1:
        queue = (current_task.request.delivery_info or {}).get("routing_key") if current_task else None
        store().monitoring.count(RETRIES, queue_role(queue))
    return deliveries > settings().task_max_retries + 1
