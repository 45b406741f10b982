"""Coordination between jobs and workers: claims on the production of a table or vector,
actions done once, jobs waiting on a resource, failures, and delivery attempts of a task."""

from __future__ import annotations

import uuid
from datetime import datetime

import redis
from pydantic import Field

from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import text

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


class Coordination:
    """The named operations jobs and tasks coordinate with; each is one Redis round trip."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def claim(self, resource: str, owner: str) -> bool:
        """Claim the production of `resource`: True for the first caller only, which must
        produce it (or fail it). A new claim is a new attempt: it clears an earlier failure.
        The claim expires after CLAIM_TTL_S, a last resort: a lost producer releases it."""
        if not self._redis.set(self._keys.claim(resource), owner, nx=True, ex=CLAIM_TTL_S):
            return False
        self._redis.delete(self._keys.failure(resource))
        return True

    def release_if_held_by(self, resource: str, owner: str) -> bool:
        """Release the claim on `resource` if `owner` (a claim token, or a job id: any of its
        tokens) holds it; True when released."""
        with self._redis.pipeline() as p:
            try:
                p.watch(self._keys.claim(resource))
                holder = text(p.get(self._keys.claim(resource)))
                if holder is None or owner not in (holder, token_job(holder)):
                    return False
                p.multi()
                p.delete(self._keys.claim(resource))
                p.execute()
                return True
            except redis.WatchError:
                return False

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

    def fail(self, resource: str, reason: str, jobs: list[str]) -> None:
        """Record why `resource` could not be produced for `jobs` (those waiting on this
        attempt), and free its claim. Jobs that come later try again."""
        failure = ResourceFailure(reason=reason, jobs=sorted(set(jobs)))
        with self._redis.pipeline() as p:
            p.set(self._keys.failure(resource), failure.model_dump_json(), ex=FAILURE_TTL_S)
            p.delete(self._keys.claim(resource))
            p.execute()

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
        """Advance `job_id` when `resource` is ready or failed."""
        self._redis.sadd(self._keys.waiters(resource), job_id)

    def take_waiters(self, resource: str) -> list[str]:
        """The jobs waiting on `resource`, removed atomically."""
        with self._redis.pipeline() as p:
            p.smembers(self._keys.waiters(resource))
            p.delete(self._keys.waiters(resource))
            return sorted(p.execute()[0])

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
