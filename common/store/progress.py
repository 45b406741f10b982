"""Progress reports of running proxy runs and profiles, as their tasks write them (one round
trip each, at most about once a second per task). They expire, so a run whose worker died
leaves nothing behind for long; a finished run is known from its stored outcome instead."""

from __future__ import annotations

import redis

from ..keys import Keys
from ..progress import ProfilingProgress, ProxyRunProgress

PROGRESS_TTL_S = 24 * 3600


class ProgressStore:
    """Progress of proxy runs (per relation vector) and profiles (per device type and model)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def put_proxy_run(self, vector_key: str, run: ProxyRunProgress) -> None:
        """Record how far a proxy run of vector `vector_key` has got."""
        key = self._keys.vector_progress(vector_key)
        with self._redis.pipeline(transaction=False) as p:
            p.hset(key, f"{run.batch_size}:{run.seed}", run.model_dump_json())
            p.expire(key, PROGRESS_TTL_S)
            p.execute()

    def proxy_runs(self, vector_key: str) -> list[ProxyRunProgress]:
        """The latest report of every proxy run of vector `vector_key` that reported."""
        raws = self._redis.hvals(self._keys.vector_progress(vector_key))
        return [ProxyRunProgress.model_validate_json(raw) for raw in raws]

    def put_profiling(self, progress: ProfilingProgress) -> None:
        """Record how far the profile of a device type and model has got."""
        key = self._keys.profiling(progress.device_type, progress.model)
        self._redis.set(key, progress.model_dump_json(), ex=PROGRESS_TTL_S)

    def profiling(self, device_type: str, model: str) -> ProfilingProgress | None:
        """The latest report of the profile of `model` on `device_type`, if one reported."""
        raw = self._redis.get(self._keys.profiling(device_type, model))
        return ProfilingProgress.model_validate_json(raw) if raw else None
