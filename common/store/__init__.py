"""edgetrain's state in Redis, one class per concern; `common/keys.py` names every key.

    store = Store.connect("redis://localhost:6379/0")
    store.fleet        devices and their heartbeats            (FleetRegistry)
    store.resources    lookup tables and relation vectors      (ResourceStore)
    store.coordination claims, once-only actions, waiters,     (Coordination)
                       failures, delivery attempts
    store.jobs         job records, parts, progress, events,   (JobStore)
                       checkpoints and attempts
    store.liveness     worker heartbeats, task leases          (Liveness)
"""

from __future__ import annotations

import redis

from ..keys import DEFAULT_PREFIX, Keys
from .connection import connect
from .coordination import Coordination, claim_token, token_job
from .fleet import DeviceIdTaken, FleetRegistry
from .jobs import JobNotFoundError, JobStore
from .liveness import Lease, Liveness, WorkerInfo
from .resources import ResourceStore

__all__ = [
    "Coordination", "DeviceIdTaken", "FleetRegistry", "JobNotFoundError", "JobStore", "Lease", "Liveness",
    "ResourceStore", "Store", "WorkerInfo", "claim_token", "connect", "token_job",
]  # fmt: skip


class Store:
    """The four stores over one Redis connection and one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX):
        keys = Keys(prefix)
        self._redis, self.keys = client, keys
        self.fleet = FleetRegistry(client, keys)
        self.resources = ResourceStore(client, keys)
        self.coordination = Coordination(client, keys)
        self.jobs = JobStore(client, keys)
        self.liveness = Liveness(client, keys)

    @classmethod
    def connect(cls, url: str, prefix: str = DEFAULT_PREFIX, patient: bool = False) -> Store:
        """A store on the Redis at `url` (redis://, rediss:// or unix://); a `patient` one
        (worker processes) retries through outages of about 30 s."""
        return cls(connect(url, patient), prefix)

    def ping(self) -> None:
        """Raise redis.ConnectionError when Redis cannot be reached."""
        self._redis.ping()

    def lock(self, name: str, timeout_s: float) -> redis.lock.Lock:
        """A Redis lock on key `name` that expires after `timeout_s` (s)."""
        return self._redis.lock(name, timeout=timeout_s, blocking_timeout=timeout_s)

    def clear(self) -> int:
        """Delete every key under this store's prefix; returns how many were deleted."""
        keys = list(self._redis.scan_iter(self.keys.pattern(), count=1000))
        return self._redis.delete(*keys) if keys else 0
