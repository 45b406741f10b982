"""Lookup tables, relation vectors and pre-trained weights, shared by every job.

Every record is checked on the way in (what is stored loads again) and on the way out: a
record that no longer loads (an older format, a hand-edited key, a bug) is set aside, moved as
it was to a key of its own and listed with why and when (`set_asides`), and reads as not
stored, so the next job profiles or estimates it again instead of failing on it."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import redis
from pydantic import Field, ValidationError
from redis.client import NEVER_DECODE

from ..keys import Keys, pretrained_key, table_id, vector_key
from ..limits import RECORDS_KEPT
from ..payloads import PretrainRequest, PretrainResult
from ..schemas import EstimationRequest, ProfileTable, RelationVector, Strict, TrainingOutcome, utc_now

logger = logging.getLogger(__name__)
RecordT = TypeVar("RecordT", bound=Strict)
REASON_CHARS = 400  # a set-aside's reason is one line of at most this many characters


class SetAside(Strict):
    """A stored record that no longer loaded, moved out of the way as it was."""

    key: str = Field(description="where it was stored")
    reason: str = Field(description="why it does not load")
    moved_to: str | None = Field(description="where it is kept now; None when this Redis user may not move it")
    at: datetime = Field(default_factory=utc_now)

    def line(self) -> str:
        """What happened, in one line for people."""
        where = f"set aside under {self.moved_to}" if self.moved_to else "left in place (this Redis user may only read it)"
        return f"{self.key} no longer loads ({self.reason}): {where}; it is made again when next needed"


OnSetAside = Callable[[SetAside], None]


def load_problem(exc: Exception) -> str:
    """Why a stored record does not load, in one line of at most REASON_CHARS characters."""
    if isinstance(exc, ValidationError):
        text = "; ".join(_error_line(e["loc"], e["msg"]) for e in exc.errors())
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _error_line(loc: tuple[int | str, ...], msg: str) -> str:
    where = ".".join(map(str, loc))
    return f"{where + ': ' if where else ''}{msg.removeprefix('Value error, ')}"


def _unloadable(exc: Exception) -> bool:
    """True for what a record that no longer loads raises: not the model's JSON, or not a string key."""
    return isinstance(exc, ValidationError) or (isinstance(exc, redis.ResponseError) and str(exc).startswith("WRONGTYPE"))


def _get_bytes(client: redis.Redis | redis.client.Pipeline, key: str) -> bytes | None:
    """GET `key` as bytes, undecoded: bytes that are not UTF-8 fail validation, not the connection."""
    return client.execute_command("GET", key, **{NEVER_DECODE: []})


class ResourceStore:
    """Tables by (device type, model, input shape); vectors by the hash of their request.

    A reader that meets a record that no longer loads sets it aside and returns None, as for a
    record not stored; it reports the set-aside to its `on_set_aside`, or logs a warning."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys
        self._parsed: OrderedDict[str, tuple[bytes, Strict]] = OrderedDict()  # key -> (raw, record): parsed once while it stays
        self._parsed_lock = threading.Lock()

    def _put(self, key: str, record: Strict) -> None:
        """Store `record` under `key`; ValidationError (nothing stored) unless it loads again."""
        raw = record.model_dump_json()
        type(record).model_validate_json(raw)
        self._redis.set(key, raw)

    def _get(self, key: str, model: type[RecordT], on_set_aside: OnSetAside | None) -> RecordT | None:
        """The record under `key`, or None when not stored or set aside now (see `_set_aside`)."""
        try:
            raw = _get_bytes(self._redis, key)
            return self._parse(key, raw, model) if raw is not None else None
        except Exception as exc:
            if not _unloadable(exc):
                raise
        return self._set_aside(key, model, on_set_aside)

    def tables_and_vectors(
        self, tids: list[str], vkeys: list[str], on_set_aside: OnSetAside | None = None
    ) -> tuple[dict[str, ProfileTable | None], dict[str, RelationVector | None]]:
        """The tables `tids` and vectors `vkeys` (see `table`, `vector`) in one command while
        they are stored; one not stored is read again alone (a key of another type is set aside)."""
        keys = [self._keys.table(t) for t in tids] + [self._keys.vector(v) for v in vkeys]
        raws = self._redis.execute_command("MGET", *keys, **{NEVER_DECODE: []}) if keys else []
        models: list[type[Strict]] = [ProfileTable] * len(tids) + [RelationVector] * len(vkeys)
        found = [
            self._get(k, m, on_set_aside) if raw is None else self._load(k, raw, m, on_set_aside) for k, raw, m in zip(keys, raws, models)
        ]
        return dict(zip(tids, found[: len(tids)])), dict(zip(vkeys, found[len(tids) :]))  # type: ignore[arg-type]

    def _load(self, key: str, raw: bytes, model: type[RecordT], on_set_aside: OnSetAside | None) -> RecordT | None:
        """The record of `raw` read under `key`, or None when it does not load (set aside)."""
        try:
            return self._parse(key, raw, model)
        except ValidationError:
            return self._set_aside(key, model, on_set_aside)

    def _parse(self, key: str, raw: bytes, model: type[RecordT]) -> RecordT:
        """The record of `raw`, parsed again only when the raw under `key` changed (a control
        worker reads a table and a vector for every job it plans)."""
        with self._parsed_lock:
            kept = self._parsed.get(key)
        if kept is not None and kept[0] == raw and isinstance(kept[1], model):
            return kept[1]
        record = model.model_validate_json(raw)
        with self._parsed_lock:
            self._parsed[key] = (raw, record)
            self._parsed.move_to_end(key)
            while len(self._parsed) > RECORDS_KEPT:
                self._parsed.popitem(last=False)
        return record

    def _set_aside(self, key: str, model: type[RecordT], on_set_aside: OnSetAside | None) -> RecordT | None:
        """Read `key` again under WATCH and, if it still does not load, move it (whatever its
        type or bytes) to a key of its own and list it with why and when, in one transaction.
        Returns the record when it loads by now (it was replaced meanwhile)."""
        with self._redis.pipeline() as p:
            while True:
                p.watch(key)
                try:
                    raw = _get_bytes(p, key)
                    return model.model_validate_json(raw) if raw is not None else None
                except Exception as exc:
                    if not _unloadable(exc):
                        raise
                    reason, at = load_problem(exc), utc_now()
                moved_to = self._keys.set_aside(key, at)
                record = SetAside(key=key, reason=reason, moved_to=moved_to, at=at)
                try:
                    p.multi()
                    p.rename(key, moved_to)
                    p.hset(self._keys.set_asides(), moved_to, record.model_dump_json())
                    p.execute()
                except redis.WatchError:
                    continue  # written meanwhile: read it again
                except redis.exceptions.NoPermissionError:  # a read-only user: a worker sets it aside when it meets it
                    record = SetAside(key=key, reason=reason, moved_to=None, at=at)
                break
        if on_set_aside is None:
            logger.warning("%s", record.line())
        else:
            on_set_aside(record)
        return None

    def set_asides(self) -> list[SetAside]:
        """Every record set aside, oldest first."""
        found = [SetAside.model_validate_json(v) for v in self._redis.hvals(self._keys.set_asides())]
        return sorted(found, key=lambda r: r.at)

    def put_table(self, table: ProfileTable) -> str:
        """Store `table` under its id (ValidationError, nothing stored, unless it loads again); returns the id."""
        assert table.device_type and table.model and table.input_shape, "a stored table names its device type, model and shape"
        tid = table_id(table.device_type, table.model, table.input_shape)
        self._put(self._keys.table(tid), table)
        return tid

    def table(self, tid: str, on_set_aside: OnSetAside | None = None) -> ProfileTable | None:
        """The lookup table `tid`, if stored (and it loads)."""
        return self._get(self._keys.table(tid), ProfileTable, on_set_aside)

    def tables(self, device_type: str | None = None, on_set_aside: OnSetAside | None = None) -> list[ProfileTable]:
        """Every stored table (that loads), or those of one device type, by id."""
        found = [self._get(name, ProfileTable, on_set_aside) for name in sorted(self._redis.scan_iter(self._keys.tables(device_type)))]
        return [t for t in found if t is not None]

    def put_vector(self, vector: RelationVector) -> None:
        """Store a relation vector under its key (ValidationError, nothing stored, unless it loads again)."""
        assert vector.key, "a stored vector has its key"
        self._put(self._keys.vector(vector.key), vector)

    def vector(self, key: str, on_set_aside: OnSetAside | None = None) -> RelationVector | None:
        """The relation vector `key`, if stored (and it loads)."""
        return self._get(self._keys.vector(key), RelationVector, on_set_aside)

    def put_vector_part(self, key: str, outcome: TrainingOutcome) -> int:
        """Record one (batch size, seed) outcome; returns how many parts are in."""
        name = self._keys.vector_parts(key)
        with self._redis.pipeline() as p:
            p.hset(name, f"{outcome.batch_size}:{outcome.seed}", outcome.model_dump_json())
            p.hlen(name)
            return int(p.execute()[1])

    def vector_parts(self, key: str) -> list[TrainingOutcome]:
        """The proxy runs of an estimation recorded so far, one per (batch size, seed)."""
        return [TrainingOutcome.model_validate_json(v) for v in self._redis.hvals(self._keys.vector_parts(key))]

    def drop_vector_parts(self, key: str) -> None:
        """Forget the proxy runs recorded for vector `key` (they are run again)."""
        self._redis.delete(self._keys.vector_parts(key))

    # An estimation sent to the server pool: proxy runs are accepted for its (batch size, seed) only.

    def put_vector_request(self, request: EstimationRequest) -> None:
        """Record that `request` was sent for estimation."""
        self._redis.set(self._keys.vector_request(vector_key(request)), request.model_dump_json())

    def vector_request(self, key: str) -> EstimationRequest | None:
        """The request sent for estimating vector `key`, while it is being estimated."""
        raw = self._redis.get(self._keys.vector_request(key))
        return EstimationRequest.model_validate_json(raw) if raw else None

    def forget_vector_request(self, key: str) -> None:
        """The vector `key` is stored: no more proxy runs are accepted for it."""
        self._redis.delete(self._keys.vector_request(key))

    def put_pretrained(self, request: PretrainRequest, result: PretrainResult) -> None:
        """Record the weights that pre-training `request` published."""
        self._put(self._keys.pretrained(pretrained_key(request)), result)

    def pretrained(self, request: PretrainRequest, on_set_aside: OnSetAside | None = None) -> PretrainResult | None:
        """The weights published for an identical pre-training request, if any (and the record loads)."""
        return self._get(self._keys.pretrained(pretrained_key(request)), PretrainResult, on_set_aside)
