"""Fine-tune records kept for later jobs (common/finetune/learned.py): per data key, the newest first; the
partial records of the fine-tunes running on a data now; and per proxy, how far its r_b were from
what runs measured on each data (common/finetune/trust.py)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from datetime import timedelta
from typing import TypeVar

import redis
from pydantic import ValidationError

from ..finetune.learned import FinetuneRecord, measuring
from ..finetune.trust import ProxyCheck
from ..keys import Keys
from ..schemas import Strict, utc_now
from .connection import text, transaction

MAX_RECORDS = 50  # per data key: older records are dropped
LIVE_TTL_S = 3600  # a running fine-tune's partial record outlives its last update by at most this (s)
logger = logging.getLogger(__name__)
RecordT = TypeVar("RecordT", bound=Strict)
_DELETE_UNCHANGED = """
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
"""  # a stale partial record is deleted unless it was published again since it was read


def _show(p: redis.client.Pipeline, name: str, record: FinetuneRecord) -> None:
    """Queue the writes that show a running fine-tune's partial record in the hash `name`."""
    p.hset(name, record.record_id, record.model_dump_json())
    p.expire(name, LIVE_TTL_S)


def _valid(model: type[RecordT], raws: Iterable[str | bytes], where: str) -> list[RecordT]:
    """The entries of `raws` that load as `model`; one that does not (a newer worker's, with
    fields this one does not know) is left out with a warning."""
    found = []
    for raw in raws:
        try:
            found.append(model.model_validate_json(raw))
        except ValidationError as exc:
            logger.warning("an entry of %s that does not load here is left out: %s", where, exc)
    return found


class LearnedStore:
    """What completed fine-tunes measured, by data key (`learned_key`), and an index of the
    data keys of one kind of data (`similar_key`) for priors from similar data."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys
        self._delete_unchanged = client.register_script(_DELETE_UNCHANGED)

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
        return int(count or 0), _valid(FinetuneRecord, raw, self._keys.learned(data_key))

    def publish(self, data_key: str, record: FinetuneRecord) -> None:
        """Show a running fine-tune's partial record to the others on the same data: read for
        LIVE_TTL_S after its last update (its `created_at`), so a worker that died without taking it
        down does not leave it to runs that update theirs; the hash expires LIVE_TTL_S after the last."""
        with self._redis.pipeline() as p:
            _show(p, self._keys.learned_live(data_key), record)
            p.execute()

    def claim(self, data_key: str, start: FinetuneRecord) -> str | None:
        """Show a run's start (a partial record of one segment, no evaluation yet), as `publish`
        does, unless another run on the same data trains its batch size solo now (a fresh running
        record of one segment): then nothing is written and that run's record id is returned. Read
        and written in one transaction, so of runs that start at once one claims each batch size."""
        name = self._keys.learned_live(data_key)
        batch_size, fresh_since = start.segments[0].batch_size, utc_now() - timedelta(seconds=LIVE_TTL_S)

        def apply(p: redis.client.Pipeline) -> str | None:
            raws = [v for k, v in p.hgetall(name).items() if text(k) != start.record_id]
            others = [r for r in _valid(FinetuneRecord, raws, name) if r.created_at >= fresh_since]
            if holder := measuring(others).get(batch_size):
                return holder
            p.multi()
            _show(p, name, start)
            return None

        return transaction(self._redis, apply, name)

    def unpublish(self, data_key: str, record_id: str) -> None:
        """Take a fine-tune's partial record down (it ended)."""
        self._redis.hdel(self._keys.learned_live(data_key), record_id)

    def live(self, data_key: str, exclude: Collection[str] = ()) -> list[FinetuneRecord]:
        """The partial records of the fine-tunes running on a data now but those of `exclude`
        (record ids): updated in the last LIVE_TTL_S; older ones are deleted."""
        name = self._keys.learned_live(data_key)
        raws = {text(k): v for k, v in sorted(self._redis.hgetall(name).items()) if text(k) not in exclude}
        found = _valid(FinetuneRecord, raws.values(), name)
        fresh_since = utc_now() - timedelta(seconds=LIVE_TTL_S)
        if stale := [r.record_id for r in found if r.created_at < fresh_since]:
            self._delete_unchanged(keys=[name], args=[x for record_id in stale for x in (record_id, raws.get(record_id, ""))])
        return [r for r in found if r.created_at >= fresh_since]

    def put_check(self, family: str, check: ProxyCheck) -> None:
        """Keep how far a proxy's r_b were on one data (the newest check of that data replaces the last)."""
        self._redis.hset(self._keys.learned_trust(family), check.data, check.model_dump_json())

    def checks(self, family: str, exclude: str | None = None) -> list[ProxyCheck]:
        """How far a proxy's r_b were on every data it was checked on, but `exclude`."""
        name = self._keys.learned_trust(family)
        return _valid(ProxyCheck, [v for k, v in sorted(self._redis.hgetall(name).items()) if text(k) != exclude], name)

    def similar(self, similar_key: str, exclude: str | None = None) -> dict[str, list[FinetuneRecord]]:
        """The records of every data key indexed under `similar_key` but `exclude`, by data key."""
        keys = sorted(str(k) for k in self._redis.smembers(self._keys.learned_index(similar_key)))
        return {k: found for k in keys if k != exclude and (found := self.records(k))}
