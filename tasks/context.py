"""What a task needs from its process: the store, and on device workers the bound device."""

from __future__ import annotations

from functools import lru_cache

from edgetrain.common.devices.base import Device
from edgetrain.common.settings import get_settings
from edgetrain.common.store import PREFIX, Store

_device: tuple[str, Device] | None = None


@lru_cache(maxsize=1)
def store() -> Store:
    return Store.from_url(get_settings().redis_url)


def bind_device(device_id: str, device: Device) -> None:
    """Called once by a device worker at start: its tasks run on this device."""
    global _device
    _device = (device_id, device)


def bound_device(device_id: str) -> Device:
    if _device is None or _device[0] != device_id:
        bound = _device[0] if _device else None
        raise RuntimeError(f"task for device {device_id!r} reached a worker bound to {bound!r}")
    return _device[1]


def attempts_exceeded(task_id: str) -> bool:
    """Count deliveries of a task; True once a redelivered task (its worker died) has
    been tried more often than the retry cap allows."""
    key = f"{PREFIX}:attempts:{task_id}"
    count = store().r.incr(key)
    store().r.expire(key, 7 * 24 * 3600)
    return count > get_settings().task_max_retries + 1
