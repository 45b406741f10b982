"""edgetrain's state in Redis, one class per concern; `common/keys.py` names every key.

store = Store.connect("redis://localhost:6379/0")
store.fleet        devices and their heartbeats            (FleetRegistry)
store.resources    lookup tables and relation vectors,     (ResourceStore)
                   records that no longer load set aside
store.coordination claims, once-only actions, waiters,     (Coordination)
                   failures, delivery attempts
store.jobs         job records, parts, progress, events,   (JobStore)
                   checkpoints and attempts
store.liveness     worker heartbeats, task leases          (Liveness)
store.identity     which store this is (id, creation time) (IdentityRegistry)
store.progress     running proxy runs and profiles         (ProgressStore)
store.ledger       sent tasks that must run, until they    (TaskLedger)
                   have
store.monitoring   counters, bulk reads for metrics        (Monitoring)
store.learned      what completed fine-tunes measured,     (LearnedStore)
                   by data, for later jobs' priors
store.federated    federated jobs: state, rounds' updates  (FederatedStore)
"""

from __future__ import annotations

import redis

from ..keys import DEFAULT_PREFIX, Keys
from ..redis_health import RedisFacts, read_facts
from .connection import connect
from .coordination import Coordination, claim_token, token_job
from .federated import FederatedStore
from .fleet import DeviceIdTaken, FleetRegistry
from .identity import IdentityRegistry, StoreIdentity
from .jobs import Applied, JobFinished, JobNotFoundError, JobStore, Tally, Written
from .learned import LearnedStore
from .ledger import SentTask, TaskLedger
from .liveness import Lease, Liveness, LiveWorker, WorkerInfo
from .monitoring import JobView, Monitoring, Running
from .progress import ProgressStore
from .resources import ResourceStore, SetAside

__all__ = [
    "Applied", "JobFinished", "Running", "Tally", "Written",
    "Coordination", "DeviceIdTaken", "FederatedStore",
    "FleetRegistry", "IdentityRegistry", "JobNotFoundError", "JobStore", "JobView", "LearnedStore",
    "Lease",
    "LiveWorker", "Liveness", "Monitoring", "ProgressStore", "ResourceStore", "SentTask", "SetAside", "Store", "StoreIdentity",
    "TaskLedger", "WorkerInfo", "claim_token", "connect", "token_job",
]  # fmt: skip


class Store:
    """The stores over one Redis connection and one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX, job_retention_s: float | None = None):
        keys = Keys(prefix)
        self._redis, self.keys = client, keys
        self.fleet = FleetRegistry(client, keys)
        self.resources = ResourceStore(client, keys)
        self.ledger = TaskLedger(client, keys)
        self.coordination = Coordination(client, keys, self.ledger)
        self.jobs = JobStore(client, keys, job_retention_s)
        self.liveness = Liveness(client, keys)
        self.identity = IdentityRegistry(client, keys)
        self.progress = ProgressStore(client, keys)
        self.monitoring = Monitoring(client, keys)
        self.learned = LearnedStore(client, keys)
        self.federated = FederatedStore(client, keys, self.ledger, job_retention_s)

    @classmethod
    def connect(cls, url: str, prefix: str = DEFAULT_PREFIX, patient: bool = False, job_retention_s: float | None = None) -> Store:
        """A store on the Redis at `url` (redis://, rediss:// or unix://); a `patient` one
        (worker processes) retries through outages of about 30 s; finished jobs expire after
        `job_retention_s` (s; None: kept)."""
        return cls(connect(url, patient), prefix, job_retention_s)

    def ping(self) -> None:
        """Raise redis.ConnectionError when Redis cannot be reached."""
        self._redis.ping()

    def redis_facts(self) -> RedisFacts:
        """The Redis server's memory, eviction and persistence settings (common/redis_health.py)."""
        return read_facts(self._redis)

    def lock(self, name: str, timeout_s: float) -> redis.lock.Lock:
        """A Redis lock on key `name` that expires after `timeout_s` (s)."""
        return self._redis.lock(name, timeout=timeout_s, blocking_timeout=timeout_s)

    def clear(self) -> int:
        """Delete every key under this store's prefix; returns how many were deleted."""
        keys = list(self._redis.scan_iter(self.keys.pattern(), count=1000))
        return self._redis.delete(*keys) if keys else 0
