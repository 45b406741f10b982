"""A device worker: binds a device backend, registers in the fleet with a heartbeat, and
consumes only `device.<id>`, one task at a time; original settings are restored on exit."""

from __future__ import annotations

import signal
import socket
import threading
import zlib
from pathlib import Path

from edgetrain.common.devices.base import Device, DeviceError
from edgetrain.common.profiling import software_versions
from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import get_settings
from edgetrain.common.store import Store

from .celery_worker import run_worker

BACKENDS = "sim:<twin name or spec file>, jetson, nvml"


def make_device(backend: str, device_id: str, sysfs_root: Path | None = None, allow_clock_control: bool = False,
                gpu_index: int = 0, allow_power_limit: bool = False) -> Device:
    """The device backend named by `backend`; allow_clock_control and allow_power_limit
    choose the nvml backend's control axis (read-only without either)."""
    if allow_power_limit and backend != "nvml":
        raise DeviceError(f"--allow-power-limit applies to the nvml backend only, not to {backend!r}")
    if backend.startswith("sim:"):
        from edgetrain.common.devices.simulated import SimulatedDevice, load_twin

        return SimulatedDevice(load_twin(backend.removeprefix("sim:")), seed=zlib.crc32(device_id.encode()))
    if backend == "jetson":
        from edgetrain.common.devices.jetson import JetsonDevice

        return JetsonDevice(sysfs_root=sysfs_root or Path("/"))
    if backend == "nvml":
        from edgetrain.common.devices.nvml import NvmlDevice

        return NvmlDevice(index=gpu_index, allow_clock_control=allow_clock_control, allow_power_limit=allow_power_limit)
    raise DeviceError(f"backend: unknown backend {backend!r}; use one of: {BACKENDS}")


def device_info(device_id: str, device: Device) -> DeviceInfo:
    return DeviceInfo(
        device_id=device_id,
        device_type=device.device_type,
        backend=device.backend,
        frequencies_hz=device.frequencies_hz,
        memory_bytes=device.memory_bytes,
        simulated=device.simulated,
        power_envelope_w=device.power_envelope_w,
        software=software_versions() | device.software,
        control=device.control,
        hostname=socket.gethostname(),
    )


class Heartbeat(threading.Thread):
    """Keeps the device's fleet record alive (TTL) while the worker runs."""

    def __init__(self, store: Store, info: DeviceInfo):
        super().__init__(name="edgetrain-heartbeat", daemon=True)
        self.store, self.info = store, info
        self.stopped = threading.Event()

    def run(self) -> None:
        settings = get_settings()
        while not self.stopped.is_set():
            try:
                self.store.register_device(self.info, settings.heartbeat_ttl_s)
            except Exception:  # Redis restarting: try again next period
                pass
            self.stopped.wait(settings.heartbeat_s)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
        self.store.unregister_device(self.info.device_id)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_device_worker(device_id: str, device: Device, loglevel: str = "INFO") -> None:
    from edgetrain.common.devices.lifecycle import restore_on_signals
    from edgetrain.tasks.app import device_queue
    from edgetrain.tasks.context import bind_device

    settings = get_settings()
    store = Store.from_url(settings.redis_url)
    info = device_info(device_id, device)
    bind_device(device_id, device)
    store.register_device(info, settings.heartbeat_ttl_s)
    heartbeat = Heartbeat(store, info)
    heartbeat.start()
    # Until Celery installs its own handlers, SIGTERM/SIGINT restore and exit through the
    # `finally` below; afterwards a SIGTERM is a warm shutdown (the running task finishes at
    # its pinned frequency) before that `finally` restores; an exit hook covers the rest.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_on_signal)
    restore_on_signals(device)
    try:
        run_worker([device_queue(device_id)], f"device-{device_id}", concurrency=1, pool="solo", loglevel=loglevel)
    finally:
        device.restore()
        heartbeat.stop()
