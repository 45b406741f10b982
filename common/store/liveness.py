"""Liveness: which workers run, and which process runs which task right now.

Workers heartbeat into a registry (role, the queues they consume, host, pid); a process that
runs a task holds a lease on it and renews it while it runs. Times are the Redis server's
(`TIME`), so hosts with unsynchronised clocks (boards without NTP) agree. A lease not renewed
for longer than its TTL means the process running the task is gone: the control worker's
reaper then hands the task on (see tasks/reaper.py)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import cast

import redis
from pydantic import Field

from ..host_checks import Finding
from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import texts

WORKER_KEPT_S = 24 * 3600  # a worker not heard from for this long leaves the registry (s)


class WorkerInfo(Strict):
    """A worker process, as it announces itself."""

    node: str = Field(description="Celery node name, e.g. server-0@host")
    role: str = Field(description="control, server or device")
    queues: list[str]
    hostname: str
    pid: int
    started_at: datetime = Field(default_factory=utc_now)
    clock_s: float | None = Field(None, description="the worker's own clock as it read Redis's TIME for its last heartbeat (s)")
    clock_error_s: float = Field(0.0, description="how far off clock_s may be: half the round trip of that TIME (s)")
    findings: list[Finding] = Field(default_factory=list, description="what the worker found wrong on its host at start")


class LiveWorker(WorkerInfo):
    """A worker in the registry, with when it was last heard from."""

    heartbeat_at: datetime = Field(description="its last heartbeat (Redis server time)")


class Lease(Strict):
    """A task being run: by whom, since when, for which job and device."""

    task_id: str
    task: str
    attempt: str = Field("", description="the token of this run of the task: it fences the run's writes")
    node: str = Field(description="the worker node running it")
    instance: str = Field("", description="the worker instance running it: node:pid of the worker's main process")
    queue: str | None = None
    job_id: str | None = None
    device_id: str | None = None
    payload: dict | None = Field(None, description="the task's payload, for tasks whose loss needs more than a retry")
    started_at: datetime = Field(default_factory=utc_now)


# KEYS: the leases zset, then one lease key per task; ARGV: the prefix of lease keys, then one
# attempt token per task. Renews a lease (Redis time) only while that attempt holds it (a newer
# run of the task may hold it now); answers how many it renewed.
_RENEW = """
local renewed = 0
local now = redis.call('TIME')
for i = 2, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  if raw and cjson.decode(raw)['attempt'] == ARGV[i] then
    redis.call('ZADD', KEYS[1], 'XX', now[1] + now[2] / 1e6, string.sub(KEYS[i], #ARGV[1] + 1))
    renewed = renewed + 1
  end
end
return renewed
"""

# KEYS: the leases zset, the lease; ARGV: the task id, the lease (JSON). Takes it, renewed now (Redis time).
_TAKE = """
local now = redis.call('TIME')
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], now[1] + now[2] / 1e6, ARGV[1])
"""

# KEYS: the leases zset, the lease, the ledger of sent tasks, its entry for the task; ARGV: the
# task id, the attempt token ("" for none), "1" to strike the task off the ledger. Releases the
# lease while that attempt holds it; answers 1 when it released it.
_RELEASE = """
local released = 0
local raw = ARGV[2] ~= '' and redis.call('GET', KEYS[2])
if raw and cjson.decode(raw)['attempt'] == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  released = 1
end
if ARGV[3] == '1' and redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then redis.call('DEL', KEYS[4]) end
return released
"""


class Liveness:
    """Worker heartbeats and task leases, timed by the Redis server's clock (s)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys
        self._renew, self._take, self._release = (client.register_script(s) for s in (_RENEW, _TAKE, _RELEASE))

    def now(self) -> float:
        """The Redis server's time (s since the epoch)."""
        seconds, micros = self._redis.time()
        return seconds + micros / 1e6

    # ------------------------------------------------------------------ workers

    def heartbeat(self, info: WorkerInfo) -> None:
        """Announce (or keep announcing) a worker, with its own clock read as Redis's was, so
        that the two can be compared (`edgetrain doctor`: clock skew)."""
        before = time.time()
        now = self.now()
        after = time.time()
        info = info.model_copy(update={"clock_s": (before + after) / 2, "clock_error_s": (after - before) / 2})
        with self._redis.pipeline() as p:
            p.set(self._keys.worker(info.node), info.model_dump_json(), ex=WORKER_KEPT_S)
            p.zadd(self._keys.workers(), {info.node: now})
            p.zremrangebyscore(self._keys.workers(), "-inf", now - WORKER_KEPT_S)  # workers gone uncleanly (a pod's name dies with it)
            p.execute()

    def heard_at(self, nodes: list[str]) -> dict[str, float]:
        """The Redis time (s) of each node's last heartbeat."""
        scores = self._redis.zmscore(self._keys.workers(), nodes) if nodes else []
        return {n: float(s) for n, s in zip(nodes, scores) if s is not None}

    def remove_worker(self, node: str) -> None:
        """Take a worker out of the registry (it is stopping cleanly)."""
        with self._redis.pipeline() as p:
            p.delete(self._keys.worker(node))
            p.zrem(self._keys.workers(), node)
            p.execute()

    def workers(self, ttl_s: float) -> list[LiveWorker]:
        """Workers heard from within `ttl_s` seconds, by node name, with their last heartbeat."""
        scored = self._redis.zrangebyscore(self._keys.workers(), self.now() - ttl_s, "+inf", withscores=True)
        seen = {str(node): float(at) for node, at in cast("list[tuple[str, float]]", scored)}
        nodes = sorted(seen)
        raws = self._redis.mget([self._keys.worker(n) for n in nodes]) if nodes else []
        return [
            LiveWorker(**WorkerInfo.model_validate_json(raw).model_dump(), heartbeat_at=datetime.fromtimestamp(seen[n], timezone.utc))
            for n, raw in zip(nodes, raws) if raw
        ]  # fmt: skip

    def note_consumer(self, instance: str) -> None:
        """The worker `instance` (node:pid of its main process) keeps the messages it has
        taken under keys of its own (tasks/held_messages.py)."""
        self._redis.sadd(self._keys.consumers(), instance)

    def consumers(self) -> list[str]:
        """The worker instances noted by `note_consumer` and not forgotten."""
        return sorted(texts(self._redis.smembers(self._keys.consumers())))

    def forget_consumer(self, instance: str) -> None:
        """Its messages were put back: the instance holds nothing any more."""
        self._redis.srem(self._keys.consumers(), instance)

    def gone(self, instances: list[str], ttl_s: float) -> list[str]:
        """Those of `instances` (node:pid) not heard from within `ttl_s` seconds: their node
        did not heartbeat, or it did from another process (the worker was started again)."""
        named = [instance.rpartition(":") for instance in instances]  # (node, ":", pid)
        nodes = [node for node, _, _ in named]
        heard, now = self.heard_at(nodes), self.now()
        raws = self._redis.mget([self._keys.worker(n) for n in nodes]) if nodes else []
        return [
            instance for instance, (node, _, pid), raw in zip(instances, named, raws)
            if raw is None or heard.get(node, 0.0) < now - ttl_s or str(WorkerInfo.model_validate_json(raw).pid) != pid
        ]  # fmt: skip

    def request_stop(self, instance: str, ttl_s: float = 3600) -> None:
        """The worker `instance` (node:pid of its main process) is shutting down: the
        fine-tunes it runs checkpoint and stop."""
        self._redis.set(self._keys.stopping(instance), "1", ex=int(ttl_s))

    def stop_requested(self, instance: str) -> bool:
        """Whether the worker `instance` (node:pid of its main process) is shutting down."""
        return bool(self._redis.exists(self._keys.stopping(instance)))

    # ------------------------------------------------------------------ task leases

    def take(self, lease: Lease) -> None:
        """Record that `lease.task_id` runs now, renewed now (one round trip)."""
        self._take(keys=[self._keys.leases(), self._keys.lease(lease.task_id)], args=[lease.task_id, lease.model_dump_json()])

    def renew(self, attempts: dict[str, str]) -> None:
        """Renew the leases of the tasks this process runs (task id -> its run's attempt token),
        those its runs still hold (one released, or taken by a newer run, stays so)."""
        if attempts:
            keys = [self._keys.leases(), *(self._keys.lease(t) for t in attempts)]
            self._renew(keys=keys, args=[self._keys.lease(""), *attempts.values()])

    def release(self, task_id: str, attempt: str) -> bool:
        """The run `attempt` of the task ended: forget its lease, unless a newer run holds it;
        True when released."""
        return self._ended(task_id, attempt, struck_off=False)

    def finish(self, task_id: str, attempt: str | None) -> bool:
        """The run `attempt` of the task finished (whatever its outcome; None: it held no lease):
        release its lease and strike the task off the ledger of sent tasks (it ran), in one
        round trip; True when the lease was released."""
        return self._ended(task_id, attempt, struck_off=True)

    def _ended(self, task_id: str, attempt: str | None, struck_off: bool) -> bool:
        k = self._keys
        keys = [k.leases(), k.lease(task_id), k.sent_tasks(), k.sent(task_id)]
        return bool(self._release(keys=keys, args=[task_id, attempt or "", "1" if struck_off else ""]))

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

    def still_expired(self, task_id: str, ttl_s: float) -> bool:
        """Whether the lease of `task_id` is still not renewed within `ttl_s` seconds (its
        process may have come back since the leases were listed)."""
        score = self._redis.zscore(self._keys.leases(), task_id)
        return score is not None and score <= self.now() - ttl_s

    def reap(self, lease: Lease) -> bool:
        """Take an expired lease away, unless a new run of its task holds it now; True for
        exactly one caller."""
        key = self._keys.lease(lease.task_id)
        with self._redis.pipeline() as p:
            try:
                p.watch(key)
                raw = p.get(key)
                if raw is None or Lease.model_validate_json(raw).attempt != lease.attempt:
                    p.unwatch()
                    return False
                p.multi()
                p.zrem(self._keys.leases(), lease.task_id)
                p.delete(key)
                removed, _ = p.execute()
            except redis.WatchError:
                return False
        return bool(removed)

    def held(self, task_ids: list[str]) -> set[str]:
        """Those of `task_ids` whose lease is held now (renewed or not)."""
        if not task_ids:
            return set()
        scores = self._redis.zmscore(self._keys.leases(), task_ids)
        return {t for t, score in zip(task_ids, scores) if score is not None}
