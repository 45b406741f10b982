"""Fine-tune records kept for later jobs (common/learned.py): per data key, the newest first."""

from __future__ import annotations

import redis

from ..keys import Keys
from ..learned import FinetuneRecord

MAX_RECORDS = 50  # per data key: older records are dropped


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

    def similar(self, similar_key: str, exclude: str | None = None) -> dict[str, list[FinetuneRecord]]:
        """The records of every data key indexed under `similar_key` but `exclude`, by data key."""
        keys = sorted(str(k) for k in self._redis.smembers(self._keys.learned_index(similar_key)))
        return {k: found for k in keys if k != exclude and (found := self.records(k))}
