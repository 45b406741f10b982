"""The store's identity: a random id and creation time written once under the key prefix.

It tells apart "this Redis lost edgetrain's data" (restarted without persistence, flushed)
from "this Redis never had that job": workers remember the identity they started with, and
when it vanishes or changes they say so and write a new one that names the one it replaces,
so that `status` of a job from before can say the store was reset, and when."""

from __future__ import annotations

import uuid
from datetime import datetime

import redis
from pydantic import Field

from ..keys import Keys
from ..schemas import Strict, utc_now


class StoreIdentity(Strict):
    """Which store this is: created once, replaced only when the data was lost."""

    store_id: str = Field(description="random, made when the store was created")
    created_at: datetime
    replaces: str | None = Field(None, description="the store id that was found gone when this one was created")

    def reset_note(self) -> str | None:
        """What to tell someone looking for data from before this store, if it replaced one."""
        if self.replaces is None:
            return None
        return (f"this Redis's edgetrain data was created at {self.created_at:%Y-%m-%d %H:%M:%S} UTC, after Redis restarted "
                "without persistence or its data was deleted: jobs submitted before then are lost")  # fmt: skip


class IdentityRegistry:
    """Reads and creates the identity marker."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def current(self) -> StoreIdentity | None:
        """The identity written in Redis, None when there is none (a new or wiped store)."""
        raw = self._redis.get(self._keys.identity())
        return StoreIdentity.model_validate_json(raw) if raw else None

    def ensure(self, replaces: str | None = None) -> StoreIdentity:
        """The identity, created now if there is none (naming `replaces`, the identity that
        the caller knew and found gone); of two processes creating it at once, one wins."""
        fresh = StoreIdentity(store_id=uuid.uuid4().hex, created_at=utc_now(), replaces=replaces)
        self._redis.set(self._keys.identity(), fresh.model_dump_json(), nx=True)
        return self.current() or fresh
