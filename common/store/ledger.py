"""The ledger of sent tasks: what a worker sent that must run, until it has.

Redis's list transport can lose a message: a worker pops it and Redis dies before the worker
records it as unacknowledged, so it is on no queue, in no worker and on no lease. Tasks that
produce what jobs wait on (a profile, an estimation, a proxy run) are written here before
they are sent and struck off when they have run (whatever their outcome); the control
worker's reaper sends again, under the same task id, one that nothing runs, that waits on no
queue and that no worker holds, for longer than a lease (tasks/reaper.py). Every such task is
idempotent: running it twice produces the same record."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import redis
from pydantic import Field
from redis.client import Pipeline

from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import texts


class SentTask(Strict):
    """A task sent to a queue, as it can be sent again."""

    task_id: str
    task: str = Field(description="its name (tasks/contract.py TaskName)")
    queue: str
    payload: dict | str
    job_id: str | None = Field(None, description="the job it serves, for its label")
    sent_at: datetime = Field(default_factory=utc_now)


class TaskLedger:
    """Sent tasks not yet run, with when each was last seen held somewhere (s, Redis time)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def record(self, sent: Sequence[SentTask]) -> None:
        """Write every task of `sent` down (one transaction) before any is sent."""
        with self._redis.pipeline() as p:
            self.write(p, sent)
            p.execute()

    def write(self, p: Pipeline, sent: Sequence[SentTask]) -> None:
        """Queue the writes that record every task of `sent` on `p` (to record them in another
        transaction); reads Redis's clock once, when there is any."""
        if not sent:
            return
        seconds, _ = self._redis.time()
        for task in sent:
            p.set(self._keys.sent(task.task_id), task.model_dump_json())
        p.zadd(self._keys.sent_tasks(), dict.fromkeys((task.task_id for task in sent), seconds))

    def done(self, task_id: str) -> None:
        """Strike a task off: it ran (or was revoked)."""
        with self._redis.pipeline() as p:
            p.zrem(self._keys.sent_tasks(), task_id)
            p.delete(self._keys.sent(task_id))
            p.execute()

    def unseen_since(self, before_s: float, limit: int) -> list[SentTask]:
        """Up to `limit` tasks last seen held somewhere before `before_s` (s), oldest first."""
        ids = texts(self._redis.zrangebyscore(self._keys.sent_tasks(), "-inf", before_s, start=0, num=limit))
        raws = self._redis.mget([self._keys.sent(t) for t in ids]) if ids else []
        return [SentTask.model_validate_json(raw) for raw in raws if raw]

    def seen(self, task_ids: list[str], at_s: float) -> None:
        """These tasks were seen held (queued, running or sent again) at `at_s` (s)."""
        if task_ids:
            self._redis.zadd(self._keys.sent_tasks(), dict.fromkeys(task_ids, at_s), xx=True)
