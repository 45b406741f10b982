"""Lookup tables, relation vectors and pre-trained weights, shared by every job."""

from __future__ import annotations

import redis

from ..keys import Keys, pretrained_key, table_id
from ..payloads import PretrainRequest, PretrainResult
from ..schemas import ProfileTable, RelationVector, TrainingOutcome


class ResourceStore:
    """Tables by (device type, model, input shape); vectors by the hash of their request."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def put_table(self, table: ProfileTable) -> str:
        """Store `table` under its id; returns the id."""
        assert table.device_type and table.model and table.input_shape, "a stored table names its device type, model and shape"
        tid = table_id(table.device_type, table.model, table.input_shape)
        self._redis.set(self._keys.table(tid), table.model_dump_json())
        return tid

    def table(self, tid: str) -> ProfileTable | None:
        """The lookup table `tid`, if stored."""
        raw = self._redis.get(self._keys.table(tid))
        return ProfileTable.model_validate_json(raw) if raw else None

    def tables(self, device_type: str | None = None) -> list[ProfileTable]:
        """Every stored table, or those of one device type, by id."""
        names = sorted(self._redis.scan_iter(self._keys.tables(device_type)))
        return [ProfileTable.model_validate_json(raw) for raw in self._redis.mget(names) if raw] if names else []

    def put_vector(self, vector: RelationVector) -> None:
        """Store a relation vector under its key."""
        assert vector.key, "a stored vector has its key"
        self._redis.set(self._keys.vector(vector.key), vector.model_dump_json())

    def vector(self, key: str) -> RelationVector | None:
        """The relation vector `key`, if stored."""
        raw = self._redis.get(self._keys.vector(key))
        return RelationVector.model_validate_json(raw) if raw else None

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

    def put_pretrained(self, request: PretrainRequest, result: PretrainResult) -> None:
        """Record the weights that pre-training `request` published."""
        self._redis.set(self._keys.pretrained(pretrained_key(request)), result.model_dump_json())

    def pretrained(self, request: PretrainRequest) -> PretrainResult | None:
        """The weights published for an identical pre-training request, if any."""
        raw = self._redis.get(self._keys.pretrained(pretrained_key(request)))
        return PretrainResult.model_validate_json(raw) if raw else None
