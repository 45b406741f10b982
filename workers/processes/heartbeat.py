"""A worker's heartbeat: keeps its entry in the worker registry alive (role, queues, host,
pid), and a device worker's device in the fleet, while the process runs; and watches the
store's identity, to say loudly when Redis lost edgetrain's data (restarted without
persistence, flushed)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import redis
from typing_extensions import override

from edgetrain.common.schemas import DeviceInfo
from edgetrain.common.settings import Settings
from edgetrain.common.store import DeviceIdTaken, Store, StoreIdentity, WorkerInfo

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Announces the worker (and its device) every `settings.heartbeat_s` seconds."""

    def __init__(self, store: Store, settings: Settings, worker: WorkerInfo, device: DeviceInfo | None = None):
        super().__init__(name="edgetrain-heartbeat", daemon=True)
        self.store, self.settings, self.worker, self.device = store, settings, worker, device
        self.instance = f"{worker.node}:{worker.pid}"
        self.stopped = threading.Event()
        self.replaced = False  # another worker serves the device id now: this one stops
        self.identity: StoreIdentity | None = None  # of the store this worker works in
        self.registered = False  # a beat may have written: stopping leaves the registry

    def beat(self, replaces: str = "") -> None:
        """One heartbeat; DeviceIdTaken when another live worker serves the device id (then
        nothing is written: the worker registry's entry of the same node is that worker's)."""
        was_registered, self.registered = self.registered, True  # before the write: a signal may land once it is done
        if self.device is not None:
            try:
                self.store.fleet.register(self.device, self.settings.heartbeat_ttl_s, self.instance, replaces)
            except DeviceIdTaken:
                self.registered = was_registered  # refused: nothing was written
                raise
        self.store.liveness.heartbeat(self.worker)
        self.watch_identity()

    def watch_identity(self) -> None:
        """Learn the store's identity (creating it in a new store); when the one known before
        is gone or replaced, say so loudly and go on with the new one (re-created if gone)."""
        known = self.identity
        current = self.store.identity.current() or self.store.identity.ensure(replaces=known.store_id if known else None)
        if known is None:
            logger.info("store %s, created at %s", current.store_id, current.created_at.isoformat())
        elif current.store_id != known.store_id:
            logger.error(
                "edgetrain's data in Redis was lost: the store %s (created at %s) is gone, Redis restarted without "
                "persistence or its data was deleted; now store %s (created at %s). Jobs submitted before are lost; "
                "set appendonly yes on Redis to keep them across restarts",
                known.store_id, known.created_at.isoformat(), current.store_id, current.created_at.isoformat(),
            )  # fmt: skip
        self.identity = current

    def _owner_on_this_host(self) -> tuple[str, bool] | None:
        """(owner, whether its process is alive) when the device id's owner is a worker on
        this host, else None (another host: only its registration expiring tells)."""
        assert self.device is not None
        owner = self.store.fleet.owner(self.device.device_id) or ""
        node, _, pid = owner.rpartition(":")
        if not node.endswith(f"@{self.worker.hostname}") or not pid.isdigit():
            return None
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return owner, False
        except PermissionError:  # alive, another user's
            pass
        return owner, True

    def first_beat(self, wait_s: float, say: Callable[[str], None]) -> None:
        """The first heartbeat. When another worker holds the device id: on this host, replace
        it if its process is gone (a restart after a crash) or refuse at once if it lives;
        on another host, wait up to `wait_s` seconds for its registration to expire."""
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                self.beat()
                return
            except DeviceIdTaken as exc:
                local = self._owner_on_this_host()
                if local is not None and not local[1]:
                    self.beat(replaces=local[0])
                    return
                if local is not None or time.monotonic() > deadline:
                    raise
                if not said:
                    say(f"{exc}; waiting up to {wait_s:g} s for its registration to expire")
                    said = True
                time.sleep(1.0)

    @override
    def run(self) -> None:
        while not self.stopped.wait(self.settings.heartbeat_s):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis restarting: try again next period
                logger.warning("heartbeat of %s failed: %s; retrying in %g s", self.worker.node, exc, self.settings.heartbeat_s)
            except DeviceIdTaken as exc:  # our claim lapsed (a freeze, an outage) and another worker took the id
                logger.error("%s: this worker stops and abandons its task, which the other worker carries on", exc)
                self.replaced = True
                self.stopped.set()
                os.kill(os.getpid(), signal.SIGTERM)  # a warm shutdown: its fine-tune's writes are refused, it stops at once

    def stop(self) -> None:
        """Stop beating and leave the registry (and the fleet, unless another worker serves the
        device now); a worker refused at its first beat leaves the other's entries alone."""
        self.stopped.set()
        if self.is_alive():
            self.join(timeout=1)
        if self.replaced or not self.registered:
            return
        try:
            self.store.liveness.remove_worker(self.worker.node)
            if self.device is not None:
                self.store.fleet.unregister(self.device.device_id, self.instance)
        except redis.RedisError as exc:
            logger.warning("leaving the registry failed: %s (the entries expire by themselves)", exc)
