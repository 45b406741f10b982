"""Coordination between jobs and workers: claims on the production of a table or vector,
actions done once, jobs waiting on a resource, failures, and delivery attempts of a task."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

import redis
from pydantic import Field

from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import text, texts
from .ledger import SentTask, TaskLedger

CLAIM_TTL_S = 6 * 3600
ONCE_TTL_S = 7 * 24 * 3600
FAILURE_TTL_S = 3600
ATTEMPTS_TTL_S = 7 * 24 * 3600


def claim_token(job_id: str) -> str:
    """A claim owner unique to one attempt of `job_id`: a request sent under an earlier claim
    of the same job is recognisably stale."""
    return f"{job_id}/{uuid.uuid4().hex[:8]}"


def token_job(owner: str) -> str:
    """The job id of a claim owner made by `claim_token` (other owners are returned as is)."""
    return owner.split("/", 1)[0]


class ResourceFailure(Strict):
    """Why producing a table or vector failed, for the jobs that were waiting on it, and when."""

    reason: str
    jobs: list[str]
    at: datetime = Field(default_factory=utc_now)

    def for_job(self, job_id: str) -> str | None:
        """The reason, if `job_id` waited on the attempt that failed."""
        return self.reason if job_id in self.jobs else None


# KEYS: the waiters of a resource, the zset of resources with waiters; ARGV: the job, the resource.
# Adds the waiter; a resource that had none is listed as of now (Redis time).
_ADD_WAITER = """
redis.call('SADD', KEYS[1], ARGV[1])
local now = redis.call('TIME')
redis.call('ZADD', KEYS[2], 'NX', now[1] + now[2] / 1e6, ARGV[2])
"""

Wake = Callable[[list[str]], Sequence[SentTask]]  # the wake-ups of jobs taken off a resource, as the ledger keeps them


class Coordination:
    """The named operations jobs and tasks coordinate with; each is one Redis transaction. The
    claim on a resource is written with its producing task's entry in the ledger of sent tasks,
    and released with the wake-ups of its waiters: a process that stops between two of them
    leaves nothing stuck."""

    def __init__(self, client: redis.Redis, keys: Keys, ledger: TaskLedger):
        self._redis, self._keys, self._ledger = client, keys, ledger
        self._add_waiter = client.register_script(_ADD_WAITER)

    def claim(self, resource: str, owner: str, tracked: Sequence[SentTask] = ()) -> bool:
        """Claim the production of `resource`: True for the first caller only, which must
        produce it (or fail it); `tracked`, the tasks that produce it, are written in the ledger
        of sent tasks with the claim (send them after). A new claim is a new attempt: it clears
        an earlier failure. The claim expires after CLAIM_TTL_S, a last resort: a lost producer
        releases it, and the reaper wakes the jobs still waiting on a resource nobody claims."""
        key = self._keys.claim(resource)
        with self._redis.pipeline() as p:
            try:
                p.watch(key)
                if p.exists(key):
                    p.unwatch()
                    return False
                p.multi()
                p.set(key, owner, ex=CLAIM_TTL_S)
                p.delete(self._keys.failure(resource))
                self._ledger.write(p, tracked)
                p.execute()
                return True
            except redis.WatchError:
                return False

    def settle(self, resource: str, wake: Wake, owner: str | None = None, reason: str | None = None) -> list[SentTask] | None:
        """End the production of `resource` (made, or failed for `reason`): release its claim,
        take its waiters and write their wake-ups (`wake(waiters)`) in the ledger of sent tasks,
        in one transaction; a `reason` is recorded as its failure for the waiters and the
        claim's holder. With an `owner` (a claim token, or a job id: any of its tokens), only
        while it holds the claim, else None and nothing changes. Returns the wake-ups, to send."""
        k = self._keys
        with self._redis.pipeline() as p:
            while True:
                try:
                    p.watch(k.claim(resource), k.waiters(resource))
                    holder = text(p.get(k.claim(resource))) if owner is not None or reason is not None else None
                    if owner is not None and (holder is None or owner not in (holder, token_job(holder))):
                        p.unwatch()
                        return None
                    waiting = sorted(texts(p.smembers(k.waiters(resource))))
                    woken = list(wake(waiting))
                    p.multi()
                    if reason is not None:
                        jobs = sorted(set(waiting + ([token_job(holder)] if holder else [])))
                        p.set(k.failure(resource), ResourceFailure(reason=reason, jobs=jobs).model_dump_json(), ex=FAILURE_TTL_S)
                    p.delete(k.claim(resource), k.waiters(resource))
                    p.zrem(k.waiting(), resource)
                    self._ledger.write(p, woken)
                    p.execute()
                    return woken
                except redis.WatchError:
                    continue

    def wake_unclaimed(self, before_s: float, now_s: float, limit: int, wake: Wake) -> list[SentTask]:
        """The safety net of `settle`: take the waiters of up to `limit` resources listed before
        `before_s` (s, Redis time) that nobody claims (the claim expired, or a producer stopped
        before it settled), writing their wake-ups (`wake(waiters)`) in the ledger of sent tasks
        in the same transaction; a resource still claimed is looked at again after `now_s`.
        Returns the wake-ups, to send."""
        k = self._keys
        woken: list[SentTask] = []
        for resource in texts(self._redis.zrangebyscore(k.waiting(), "-inf", before_s, start=0, num=limit)):
            with self._redis.pipeline() as p:
                try:
                    p.watch(k.claim(resource), k.waiters(resource))
                    claimed = bool(p.exists(k.claim(resource)))
                    waiting = [] if claimed else sorted(texts(p.smembers(k.waiters(resource))))
                    wakes = list(wake(waiting))
                    p.multi()
                    if claimed:
                        p.zadd(k.waiting(), {resource: now_s}, xx=True)
                    else:
                        p.delete(k.waiters(resource))
                        p.zrem(k.waiting(), resource)
                        self._ledger.write(p, wakes)
                    p.execute()
                    woken += wakes
                except redis.WatchError:  # claimed or waited on meanwhile: looked at next pass
                    continue
        return woken

    def holder(self, resource: str) -> str | None:
        """Who holds the claim on `resource`, if anyone."""
        return text(self._redis.get(self._keys.claim(resource)))

    def release(self, resource: str) -> None:
        """Free the claim on `resource` (its producer finished)."""
        self._redis.delete(self._keys.claim(resource))

    def once(self, name: str, ttl_s: float = ONCE_TTL_S) -> bool:
        """True the first time `name` is asked for (within `ttl_s` s), False after."""
        return bool(self._redis.set(self._keys.once(name), "1", nx=True, ex=int(ttl_s)))

    def forget(self, name: str) -> None:
        """Let the action `name` (see `once`) happen again."""
        self._redis.delete(self._keys.once(name))

    def failure(self, resource: str) -> ResourceFailure | None:
        """The last failure to produce `resource`, if it has not been tried again since."""
        raw = self._redis.get(self._keys.failure(resource))
        return ResourceFailure.model_validate_json(raw) if raw else None

    def failures(self, resources: list[str]) -> dict[str, ResourceFailure | None]:
        """`failure` of each of `resources` (one command)."""
        raws = self._redis.mget([self._keys.failure(r) for r in resources]) if resources else []
        return {r: ResourceFailure.model_validate_json(raw) if raw else None for r, raw in zip(resources, raws)}

    def clear_failure(self, resource: str) -> None:
        """Forget the last failure to produce `resource`."""
        self._redis.delete(self._keys.failure(resource))

    def add_waiter(self, resource: str, job_id: str) -> None:
        """Advance `job_id` when `resource` is ready or failed (one round trip)."""
        self._add_waiter(keys=[self._keys.waiters(resource), self._keys.waiting()], args=[job_id, resource])

    def uncount_attempt(self, task_id: str) -> None:
        """Take back the count of the delivery of `task_id` that a worker stopped cleanly (it
        checkpointed and re-queued the task): only deliveries after a lost worker are retries."""
        with self._redis.pipeline(transaction=True) as p:
            p.decr(self._keys.attempts(task_id))
            p.expire(self._keys.attempts(task_id), ATTEMPTS_TTL_S)
            p.execute()

    def count_attempt(self, task_id: str) -> int:
        """Count one more delivery of task `task_id`; returns the count (incremented and
        given its expiry in one transaction)."""
        with self._redis.pipeline(transaction=True) as p:
            p.incr(self._keys.attempts(task_id))
            p.expire(self._keys.attempts(task_id), ATTEMPTS_TTL_S)
            return int(p.execute()[0])
