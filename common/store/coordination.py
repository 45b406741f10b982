"""Coordination between jobs and workers: claims on the production of a table or vector,
actions done once, jobs waiting on a resource, failures, and delivery attempts of a task."""

from __future__ import annotations

import redis

from ..keys import Keys

CLAIM_TTL_S = 6 * 3600
ONCE_TTL_S = 7 * 24 * 3600
FAILURE_TTL_S = 3600
ATTEMPTS_TTL_S = 7 * 24 * 3600


class Coordination:
    """The named operations jobs and tasks coordinate with; each is one Redis round trip."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def claim(self, resource: str, owner: str) -> bool:
        """Claim the production of `resource`: True for the first caller only, which must
        produce it (or fail it); the claim expires after CLAIM_TTL_S."""
        return bool(self._redis.set(self._keys.claim(resource), owner, nx=True, ex=CLAIM_TTL_S))

    def holder(self, resource: str) -> str | None:
        """Who holds the claim on `resource`, if anyone."""
        return self._redis.get(self._keys.claim(resource))

    def release(self, resource: str) -> None:
        self._redis.delete(self._keys.claim(resource))

    def once(self, name: str, ttl_s: float = ONCE_TTL_S) -> bool:
        """True the first time `name` is asked for (within `ttl_s` s), False after."""
        return bool(self._redis.set(self._keys.once(name), "1", nx=True, ex=int(ttl_s)))

    def fail(self, resource: str, reason: str) -> None:
        """Record why `resource` could not be produced, and free its claim."""
        with self._redis.pipeline() as p:
            p.set(self._keys.failure(resource), reason, ex=FAILURE_TTL_S)
            p.delete(self._keys.claim(resource))
            p.execute()

    def failure(self, resource: str) -> str | None:
        return self._redis.get(self._keys.failure(resource))

    def clear_failure(self, resource: str) -> None:
        self._redis.delete(self._keys.failure(resource))

    def add_waiter(self, resource: str, job_id: str) -> None:
        """Advance `job_id` when `resource` is ready or failed."""
        self._redis.sadd(self._keys.waiters(resource), job_id)

    def take_waiters(self, resource: str) -> list[str]:
        """The jobs waiting on `resource`, removed atomically."""
        with self._redis.pipeline() as p:
            p.smembers(self._keys.waiters(resource))
            p.delete(self._keys.waiters(resource))
            return sorted(p.execute()[0])

    def count_attempt(self, task_id: str) -> int:
        """Count one more delivery of task `task_id`; returns the count (incremented and
        given its expiry in one transaction)."""
        with self._redis.pipeline(transaction=True) as p:
            p.incr(self._keys.attempts(task_id))
            p.expire(self._keys.attempts(task_id), ATTEMPTS_TTL_S)
            return int(p.execute()[0])
