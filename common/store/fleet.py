"""The fleet registry: devices announce themselves with a heartbeat that expires.

One worker instance serves a device id at a time: registering claims the id for the
instance (the claim expires with the heartbeat), so a second worker with the same id is
refused while the first is alive. The last heartbeat of every device is kept, so a device
that stopped is known to have disappeared at that time."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone

import redis

from ..keys import Keys
from ..schemas import DeviceCap, DeviceInfo, utc_now
from .connection import text, texts

# A heartbeat in one round trip: set the owner of a device id if it is free, already ours, or
# the stale owner we replace, then store the device's record, its labels for metrics and when it
# was seen (Redis time); 1 when the id is ours.
_REGISTER = """
local owner = redis.call('GET', KEYS[1])
if owner ~= false and owner ~= ARGV[1] and owner ~= ARGV[3] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[2])
redis.call('ZADD', KEYS[4], redis.call('TIME')[1], ARGV[4])
redis.call('HSET', KEYS[5], ARGV[4], ARGV[6])
return 1
"""


class DeviceIdTaken(RuntimeError):
    """Another live worker serves this device id."""

    def __init__(self, device_id: str, owner: str):
        self.device_id, self.owner = device_id, owner
        super().__init__(
            f"device id {device_id!r} is served by another live worker ({owner}); stop that worker or choose another --device-id"
        )


class FleetRegistry:
    """Device id -> DeviceInfo, kept alive by the device worker's heartbeat (TTL)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys
        self._register = client.register_script(_REGISTER)

    def owner(self, device_id: str) -> str | None:
        """The worker instance serving `device_id`, while its heartbeat is alive."""
        return text(self._redis.get(self._keys.device_owner(device_id)))

    def register(self, info: DeviceInfo, ttl_s: float, instance: str, replaces: str = "") -> None:
        """Announce `info` for `ttl_s` seconds as served by worker `instance` (taking over
        from `replaces`, an owner known to be dead); call again before it expires.
        DeviceIdTaken when another live instance serves the id."""
        k, device_id = self._keys, info.device_id
        record = info.model_copy(update={"heartbeat_at": utc_now()}).model_dump_json()
        keys = [k.device_owner(device_id), k.fleet_ids(), k.device(device_id), k.fleet_seen(), k.fleet_labels()]
        labels = json.dumps([info.device_type, info.backend, info.simulated, ttl_s])
        if not self._register(keys=keys, args=[instance, int(ttl_s * 1000), replaces, device_id, record, labels]):
            raise DeviceIdTaken(device_id, self.owner(device_id) or "?")

    def unregister(self, device_id: str, instance: str) -> None:
        """Leave the fleet (a worker stopping cleanly); only the instance serving the id may."""
        if self.owner(device_id) not in (instance, None):
            return
        with self._redis.pipeline() as p:
            p.srem(self._keys.fleet_ids(), device_id)
            p.hdel(self._keys.fleet_labels(), device_id)
            p.delete(self._keys.device(device_id), self._keys.device_owner(device_id))
            p.execute()

    def device(self, device_id: str) -> DeviceInfo | None:
        """The device while its heartbeat is alive, else None."""
        raw = self._redis.get(self._keys.device(device_id))
        return DeviceInfo.model_validate_json(raw) if raw else None

    def devices_by_id(self, device_ids: list[str]) -> dict[str, DeviceInfo]:
        """The live devices among `device_ids` (one round trip)."""
        raws = self._redis.mget([self._keys.device(d) for d in device_ids]) if device_ids else []
        return {d: DeviceInfo.model_validate_json(raw) for d, raw in zip(device_ids, raws) if raw}

    def devices(self) -> list[DeviceInfo]:
        """Devices with a live heartbeat, by id (two round trips); expired ids are dropped."""
        ids = sorted(texts(self._redis.smembers(self._keys.fleet_ids())))
        live = self.devices_by_id(ids)
        gone = [i for i in ids if i not in live]
        if gone:
            with contextlib.suppress(redis.exceptions.NoPermissionError), self._redis.pipeline(transaction=False) as p:
                p.srem(self._keys.fleet_ids(), *gone)  # a reader (submitter, monitor) leaves it to the workers
                p.hdel(self._keys.fleet_labels(), *gone)
                p.execute()
        return [live[i] for i in ids if i in live]

    def last_seen(self, device_id: str) -> datetime | None:
        """When the device's last heartbeat arrived (None: never seen)."""
        score = self._redis.zscore(self._keys.fleet_seen(), device_id)
        return None if score is None else datetime.fromtimestamp(score, timezone.utc)

    def silent_since(self, seconds_ago: float) -> list[str]:
        """Devices whose last heartbeat is older than `seconds_ago` (Redis time)."""
        now, _ = self._redis.time()
        return sorted(texts(self._redis.zrangebyscore(self._keys.fleet_seen(), "-inf", now - seconds_ago)))

    def await_device(self, device_id: str, until: datetime) -> None:
        """A job waits until `until` for `device_id`, which has not registered yet (the
        earliest such time of all jobs is kept)."""
        self._redis.zadd(self._keys.fleet_awaited(), {device_id: until.timestamp()}, lt=True)

    def take_awaited(self) -> list[str]:
        """The awaited devices (`await_device`) that have registered since, or whose earliest
        wait is over (Redis time), taken off the list: their jobs are to be advanced."""
        key = self._keys.fleet_awaited()
        awaited: list[tuple[str, float]] = self._redis.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
        if not awaited:
            return []
        now, _ = self._redis.time()
        registered = self._redis.smismember(self._keys.fleet_ids(), [d for d, _ in awaited])
        taken = [d for (d, until), known in zip(awaited, registered) if known or until <= now]
        if taken:
            self._redis.zrem(key, *taken)
        return taken

    def set_power_cap(self, device_id: str, power_cap_w: float | None) -> DeviceCap:
        """Set the board power cap (W; None = no cap) that fine-tunes running on `device_id`
        follow from their next step; returns it with its version."""
        key = self._keys.device_cap(device_id)
        at = utc_now()
        with self._redis.pipeline() as p:
            p.hincrby(key, "version", 1)
            p.hset(key, mapping={"power_cap_w": "" if power_cap_w is None else repr(power_cap_w), "set_at": at.isoformat()})
            if power_cap_w is None:  # the caps of the fleet in one hash, for metrics
                p.hdel(self._keys.fleet_caps(), device_id)
            else:
                p.hset(self._keys.fleet_caps(), device_id, repr(power_cap_w))
            version, *_ = p.execute()
        return DeviceCap(power_cap_w=power_cap_w, version=version, set_at=at)

    def index_caps(self) -> int:
        """Fill the fleet's hash of caps from the caps set on each device, for caps set before
        the hash was kept (a store of an earlier version: its idle devices' caps show in metrics
        again); a device already in the hash is left as it is. Returns how many were added."""
        keys = sorted(self._redis.scan_iter(match=self._keys.device_caps(), count=1000))
        with self._redis.pipeline(transaction=False) as p:
            for key in keys:
                p.hget(key, "power_cap_w")
            caps = p.execute()
        added = 0
        with self._redis.pipeline(transaction=False) as p:
            for key, cap in zip(keys, caps):
                if cap:
                    p.hsetnx(self._keys.fleet_caps(), str(key).rsplit(":", 1)[1], cap)
            added = sum(p.execute())
        return added

    def power_cap(self, device_id: str) -> DeviceCap | None:
        """The cap last set on `device_id`, None when none was ever set."""
        return self.power_caps([device_id]).get(device_id)

    def power_caps(self, device_ids: list[str]) -> dict[str, DeviceCap]:
        """The caps last set on those of `device_ids` that ever had one (one round trip)."""
        with self._redis.pipeline(transaction=False) as p:
            for device_id in device_ids:
                p.hgetall(self._keys.device_cap(device_id))
            raws = p.execute()
        return {d: DeviceCap(power_cap_w=float(raw["power_cap_w"]) if raw["power_cap_w"] else None, version=int(raw["version"]),
                             set_at=raw["set_at"]) for d, raw in zip(device_ids, raws) if raw}  # fmt: skip
