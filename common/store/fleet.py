"""The fleet registry: devices announce themselves with a heartbeat that expires."""

from __future__ import annotations

import redis

from ..keys import Keys
from ..schemas import DeviceInfo, utc_now


class FleetRegistry:
    """Device id -> DeviceInfo, kept alive by the device worker's heartbeat (TTL)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def register(self, info: DeviceInfo, ttl_s: float) -> None:
        """Announce `info` for `ttl_s` seconds; call again before it expires."""
        info = info.model_copy(update={"heartbeat_at": utc_now()})
        with self._redis.pipeline() as p:
            p.sadd(self._keys.fleet_ids(), info.device_id)
            p.set(self._keys.device(info.device_id), info.model_dump_json(), px=int(ttl_s * 1000))
            p.execute()

    def unregister(self, device_id: str) -> None:
        with self._redis.pipeline() as p:
            p.srem(self._keys.fleet_ids(), device_id)
            p.delete(self._keys.device(device_id))
            p.execute()

    def device(self, device_id: str) -> DeviceInfo | None:
        """The device while its heartbeat is alive, else None."""
        raw = self._redis.get(self._keys.device(device_id))
        return DeviceInfo.model_validate_json(raw) if raw else None

    def devices(self) -> list[DeviceInfo]:
        """Devices with a live heartbeat, by id (two round trips); expired ids are dropped."""
        ids = sorted(self._redis.smembers(self._keys.fleet_ids()))
        if not ids:
            return []
        raws = self._redis.mget([self._keys.device(i) for i in ids])
        gone = [i for i, raw in zip(ids, raws) if raw is None]
        if gone:
            self._redis.srem(self._keys.fleet_ids(), *gone)
        return [DeviceInfo.model_validate_json(raw) for raw in raws if raw is not None]
