"""Fine-tune records kept for later jobs (common/finetune/learned.py): per data key, the newest first; the
partial records of the fine-tunes running on a data now; and per proxy, how far its r_b were from
what runs measured on each data (common/finetune/trust.py)."""

from __future__ import annotations

import redis

from ..finetune.learned import FinetuneRecord
from ..finetune.trust import ProxyCheck
from ..keys import Keys
from .connection import text

MAX_RECORDS = 50  # per data key: older records are dropped
LIVE_TTL_S = 3600  # a running fine-tune's partial record outlives it by at most this (s) when it dies without removing it


class LearnedStore:
    """What completed fine-tunes measured, by data key (`learned_key`), and an index of the
    data keys of one kind of data (`similar_key`) for priors from similar data."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def put_record(self, data_key: str, similar_key: str, record: FinetuneRecord) -> None:
        """Keep `record` under its data key (at most MAX_RECORDS, newest first) and index the key."""
        name = self._keys.learned(data_key)
        with self._redis.pipeline() as p:
            p.lpush(name, record.model_dump_json())
            p.ltrim(name, 0, MAX_RECORDS - 1)
            p.incr(self._keys.learned_count(data_key))
            p.sadd(self._keys.learned_index(similar_key), data_key)
            p.execute()

    def records(self, data_key: str) -> list[FinetuneRecord]:
        """The records of one data key, newest first."""
        return self._read(data_key)[1]

    def records_if_new(self, data_key: str, kept: int) -> tuple[int, list[FinetuneRecord] | None]:
        """How many records were ever kept under a data key, and its records when that differs
        from `kept` (None when it does not): a reader that polls transfers the list only when a
        record was added since its last read."""
        if int(self._redis.get(self._keys.learned_count(data_key)) or 0) == kept:
            return kept, None
        return self._read(data_key)

    def _read(self, data_key: str) -> tuple[int, list[FinetuneRecord]]:
        """The count of records ever kept under a data key and its records, of one moment."""
        with self._redis.pipeline() as p:
            p.get(self._keys.learned_count(data_key))
            p.lrange(self._keys.learned(data_key), 0, -1)
            count, raw = p.execute()
        return int(count or 0), [FinetuneRecord.model_validate_json(r) for r in raw]

    def publish(self, data_key: str, record: FinetuneRecord) -> None:
        """Show a running fine-tune's partial record to the others on the same data (it expires
        LIVE_TTL_S after its last update)."""
        name = self._keys.learned_live(data_key)
        with self._redis.pipeline() as p:
            p.hset(name, record.record_id, record.model_dump_json())
            p.expire(name, LIVE_TTL_S)
            p.execute()

    def unpublish(self, data_key: str, record_id: str) -> None:
        """Take a fine-tune's partial record down (it ended)."""
        self._redis.hdel(self._keys.learned_live(data_key), record_id)

    def live(self, data_key: str, exclude: str | None = None) -> list[FinetuneRecord]:
        """The partial records of the fine-tunes running on a data now, but `exclude`'s."""
        raw = self._redis.hgetall(self._keys.learned_live(data_key))
        return [FinetuneRecord.model_validate_json(v) for k, v in sorted(raw.items()) if text(k) != exclude]

    def put_check(self, family: str, check: ProxyCheck) -> None:
        """Keep how far a proxy's r_b were on one data (the newest check of that data replaces the last)."""
        self._redis.hset(self._keys.learned_trust(family), check.data, check.model_dump_json())

    def checks(self, family: str, exclude: str | None = None) -> list[ProxyCheck]:
        """How far a proxy's r_b were on every data it was checked on, but `exclude`."""
        raw = self._redis.hgetall(self._keys.learned_trust(family))
        return [ProxyCheck.model_validate_json(v) for k, v in sorted(raw.items()) if text(k) != exclude]

    def similar(self, similar_key: str, exclude: str | None = None) -> dict[str, list[FinetuneRecord]]:
        """The records of every data key indexed under `similar_key` but `exclude`, by data key."""
        keys = sorted(str(k) for k in self._redis.smembers(self._keys.learned_index(similar_key)))
        return {k: found for k in keys if k != exclude and (found := self.records(k))}
