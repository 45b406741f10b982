"""Liveness: which workers run, and which process runs which task right now.

Workers heartbeat into a registry (role, the queues they consume, host, pid); a process that
runs a task holds a lease on it and renews it while it runs. Times are the Redis server's
(`TIME`), so hosts with unsynchronised clocks (boards without NTP) agree. A lease not renewed
for longer than its TTL means the process running the task is gone: the control worker's
reaper then hands the task on (see tasks/reaper.py)."""

from __future__ import annotations

from datetime import datetime

import redis
from pydantic import Field

from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import texts


class WorkerInfo(Strict):
    """A worker process, as it announces itself."""

    node: str = Field(description="Celery node name, e.g. server-0@host")
    role: str = Field(description="control, server or device")
    queues: list[str]
    hostname: str
    pid: int
    started_at: datetime = Field(default_factory=utc_now)


class Lease(Strict):
    """A task being run: by whom, since when, for which job and device."""

    task_id: str
    task: str
    node: str = Field(description="the worker node running it")
    queue: str | None = None
    job_id: str | None = None
    device_id: str | None = None
    payload: dict | None = Field(None, description="the task's payload, for tasks whose loss needs more than a retry")
    started_at: datetime = Field(default_factory=utc_now)


class Liveness:
    """Worker heartbeats and task leases, timed by the Redis server's clock (s)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def now(self) -> float:
        """The Redis server's time (s since the epoch)."""
        seconds, micros = self._redis.time()
        return seconds + micros / 1e6

    # ------------------------------------------------------------------ workers

    def heartbeat(self, info: WorkerInfo) -> None:
        """Announce (or keep announcing) a worker."""
        now = self.now()
        with self._redis.pipeline() as p:
            p.set(self._keys.worker(info.node), info.model_dump_json())
            p.zadd(self._keys.workers(), {info.node: now})
            p.execute()

    def remove_worker(self, node: str) -> None:
        """Take a worker out of the registry (it is stopping cleanly)."""
        with self._redis.pipeline() as p:
            p.delete(self._keys.worker(node))
            p.zrem(self._keys.workers(), node)
            p.execute()

    def workers(self, ttl_s: float) -> list[WorkerInfo]:
        """Workers heard from within `ttl_s` seconds, by node name."""
        nodes = sorted(texts(self._redis.zrangebyscore(self._keys.workers(), self.now() - ttl_s, "+inf")))
        raws = self._redis.mget([self._keys.worker(n) for n in nodes]) if nodes else []
        return [WorkerInfo.model_validate_json(raw) for raw in raws if raw]

    def consumers(self, queue: str, ttl_s: float) -> list[WorkerInfo]:
        """Live workers that consume `queue`."""
        return [w for w in self.workers(ttl_s) if queue in w.queues]

    # ------------------------------------------------------------------ task leases

    def take(self, lease: Lease) -> None:
        """Record that `lease.task_id` runs now, renewed now."""
        now = self.now()
        with self._redis.pipeline() as p:
            p.set(self._keys.lease(lease.task_id), lease.model_dump_json())
            p.zadd(self._keys.leases(), {lease.task_id: now})
            p.execute()

    def renew(self, task_ids: list[str]) -> None:
        """Renew the leases of tasks this process still runs (ones already released stay so)."""
        if task_ids:
            self._redis.zadd(self._keys.leases(), {t: self.now() for t in task_ids}, xx=True)

    def release(self, task_id: str) -> None:
        """The task finished (whatever its outcome): forget its lease."""
        with self._redis.pipeline() as p:
            p.zrem(self._keys.leases(), task_id)
            p.delete(self._keys.lease(task_id))
            p.execute()

    def lease(self, task_id: str) -> Lease | None:
        """The lease of a running task, if it holds one."""
        raw = self._redis.get(self._keys.lease(task_id))
        return Lease.model_validate_json(raw) if raw else None

    def running(self) -> list[Lease]:
        """Every lease held now (tasks running, or lost and not yet handed on)."""
        ids = texts(self._redis.zrange(self._keys.leases(), 0, -1))
        raws = self._redis.mget([self._keys.lease(t) for t in ids]) if ids else []
        return [Lease.model_validate_json(raw) for raw in raws if raw]

    def expired(self, ttl_s: float) -> list[Lease]:
        """Leases not renewed within `ttl_s` seconds: their process is gone."""
        ids = texts(self._redis.zrangebyscore(self._keys.leases(), "-inf", self.now() - ttl_s))
        raws = self._redis.mget([self._keys.lease(t) for t in ids]) if ids else []
        return [Lease.model_validate_json(raw) for raw in raws if raw]

    def reap(self, task_id: str) -> bool:
        """Take an expired lease away; True for exactly one caller, which must hand the task on."""
        with self._redis.pipeline() as p:
            p.zrem(self._keys.leases(), task_id)
            p.delete(self._keys.lease(task_id))
            removed, _ = p.execute()
        return bool(removed)
