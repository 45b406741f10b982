"""What monitoring reads and counts: counters of events (tasks handed on, retries), jobs with
their parts and progress in a few round trips, the fine-tunes running on devices, queue
lengths, and the master the store ran on last (behind Redis Sentinel)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

import redis

from ..jobs.state import DevicePart, FinetuneProgress, JobRecord, PartState
from ..keys import Keys
from .connection import master_address, text, texts


class DeviceLabels(NamedTuple):
    """What metrics say of a live device."""

    device_id: str
    device_type: str
    backend: str
    simulated: bool


@dataclass(frozen=True)
class Running:
    """A fine-tune an attempt runs on a device now: its job, its part and its latest progress."""

    job_id: str
    part: DevicePart
    progress: FinetuneProgress | None


@dataclass(frozen=True)
class JobView:
    """A job as monitoring sees it: its record, each device's part and the progress of its
    running fine-tunes."""

    record: JobRecord
    parts: dict[str, DevicePart]
    progress: dict[str, FinetuneProgress]


# A read command's reply as one JSON text: redis-py parses a reply of 10 000 elements one by one
# (about 10 µs each on the 2-core development machine), json.loads the text at once. The keys
# are arguments, not KEYS: Redis 7 takes a script's declared keys as written, which the
# read-only `monitor` user may not; its ACL still applies to each command the script runs.
_AS_JSON = "return cjson.encode(redis.call(unpack(ARGV)))"
# ARGV[1] a read command, ARGV[2] its argument after the key ('' for none), ARGV[3] the keys, one
# a line (one argument: redis-py packs each argument in about 7 µs): the command's reply for each
# key, as one JSON array (false for a nil reply).
_EACH_AS_JSON = """
local out = {}
for key in string.gmatch(ARGV[3], '[^\\n]+') do
  if ARGV[2] == '' then
    out[#out + 1] = redis.call(ARGV[1], key)
  else
    out[#out + 1] = redis.call(ARGV[1], key, ARGV[2])
  end
end
return cjson.encode(out)
"""

# The union of the sets named in ARGV[1] (one a line), as one JSON array: SUNION over a thousand
# keys at a time (Lua's unpack takes no more than about 8000).
_UNION_AS_JSON = """
local seen, out, keys = {}, {}, {}
local function union()
  for _, member in ipairs(redis.call('SUNION', unpack(keys))) do
    if not seen[member] then
      seen[member] = true
      out[#out + 1] = member
    end
  end
  keys = {}
end
for key in string.gmatch(ARGV[1], '[^\\n]+') do
  keys[#keys + 1] = key
  if #keys == 1000 then union() end
end
if #keys > 0 then union() end
return cjson.encode(out)
"""

EVENT_BINDINGS = "_kombu.binding.celeryev"  # kombu's bindings of the `celeryev` exchange (not under edgetrain's prefix)
KOMBU_SEPARATOR = "\x06\x16"  # between a binding's routing key, pattern and queue


def _json_list(raw: str) -> list:
    """A script's JSON reply as a list (cjson writes an empty table as `{}`)."""
    value = json.loads(raw)
    return value if isinstance(value, list) else []


class Monitoring:
    """Counters and the bulk reads of the metrics exporter and `edgetrain doctor`: each
    fleet-wide read (last heartbeats, labels, caps, queue lengths, the jobs with a part on a
    device) is one command whose reply is one JSON text, whatever the fleet's size."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys
        self._as_json, self._each_as_json = client.register_script(_AS_JSON), client.register_script(_EACH_AS_JSON)
        self._union_as_json = client.register_script(_UNION_AS_JSON)

    def _read(self, *command: str) -> list:
        """A read command's array reply (one round trip, parsed at once)."""
        return _json_list(self._as_json(args=list(command)))

    def _each(self, command: str, keys: list[str], argument: str = "") -> list:
        """A read command's reply for each of `keys` (one round trip, parsed at once)."""
        return _json_list(self._each_as_json(args=[command, argument, "\n".join(keys)])) if keys else []

    def count(self, name: str, label: str, by: int = 1) -> None:
        """Add `by` to counter `name` under `label` (e.g. tasks handed on, by worker role)."""
        self._redis.hincrby(self._keys.counter(name), label, by)

    def counts(self, name: str) -> dict[str, int]:
        """Counter `name` by label (an empty dict before the first count)."""
        counts: dict[str, str] = self._redis.hgetall(self._keys.counter(name))  # type: ignore[assignment]  # decoded replies
        return {label: int(value) for label, value in counts.items()}

    def last_seen(self) -> dict[str, float]:
        """Every device ever registered -> its last heartbeat (Redis time, s since the epoch)."""
        flat = self._read("ZRANGE", self._keys.fleet_seen(), "0", "-1", "WITHSCORES")
        return {device_id: float(at) for device_id, at in zip(flat[::2], flat[1::2])}

    def live_devices(self, last_seen: dict[str, float], ttl_s: float) -> list[DeviceLabels]:
        """The devices in the fleet whose last heartbeat (`last_seen`) is within their worker's
        heartbeat TTL of Redis's time (`ttl_s` for an entry that does not say it), as metrics
        label them (two round trips: their labels are kept in one hash by each heartbeat,
        `FleetRegistry.register`, and dropped when the device leaves or expires)."""
        flat = self._read("HGETALL", self._keys.fleet_labels())
        labels = dict(zip(flat[::2], json.loads("[" + ",".join(flat[1::2]) + "]")))
        now, _ = self._redis.time()
        live = []
        for device_id, (device_type, backend, simulated, *ttl) in labels.items():  # an earlier version's entry has no TTL
            if last_seen.get(device_id, 0.0) >= now - (ttl[0] if ttl else ttl_s):
                live.append(DeviceLabels(device_id, device_type, backend, simulated))
        return live

    def power_caps(self) -> dict[str, float]:
        """Device -> the power cap set on it (W), for the devices that have one (one hash, kept
        by `FleetRegistry.set_power_cap`)."""
        flat = self._read("HGETALL", self._keys.fleet_caps())
        return {device_id: float(cap) for device_id, cap in zip(flat[::2], flat[1::2])}

    def unfinished_jobs(self, devices: list[str] | None = None) -> set[str]:
        """Every job with an unfinished part on one of `devices` (default: every device ever registered)."""
        devices = list(self.last_seen()) if devices is None else devices
        keys = "\n".join(self._keys.device_jobs(d) for d in devices)
        return set(_json_list(self._union_as_json(args=[keys]))) if devices else set()

    def job_ids(self, newest: int, devices: list[str]) -> list[str]:
        """The newest `newest` (> 0) jobs, then every older job with an unfinished part on one of
        `devices` (every device ever registered: `last_seen`), newest first."""
        recent = texts(self._redis.zrevrange(self._keys.jobs(), 0, newest - 1))
        older = sorted(self.unfinished_jobs(devices) - set(recent))
        scores = self._redis.zmscore(self._keys.jobs(), older) if older else []
        return recent + [j for _, j in sorted(((s or 0.0, j) for s, j in zip(scores, older)), reverse=True)]

    def jobs(self, job_ids: list[str]) -> list[JobView]:
        """The jobs of `job_ids` that exist, in that order (two round trips)."""
        raws = self._redis.mget([self._keys.job(j) for j in job_ids]) if job_ids else []
        records = [JobRecord.model_validate_json(raw) for raw in raws if raw]
        with self._redis.pipeline(transaction=False) as p:
            for r in records:
                ids = [d.device_id for d in r.spec.devices]
                p.mget([self._keys.part(r.job_id, d) for d in ids])
                p.mget([self._keys.progress(r.job_id, d) for d in ids])
            replies = p.execute()
        views = []
        for i, r in enumerate(records):
            ids = [d.device_id for d in r.spec.devices]
            parts, progress = replies[2 * i : 2 * i + 2]
            views.append(JobView(
                record=r,
                parts={d: DevicePart.model_validate_json(raw) for d, raw in zip(ids, parts) if raw},
                progress={d: FinetuneProgress.model_validate_json(raw) for d, raw in zip(ids, progress) if raw},
            ))  # fmt: skip
        return views

    def running(self) -> dict[str, Running]:
        """Device -> the fine-tune an attempt runs there now (the latest started): two round
        trips, whatever the fleet's and the jobs' sizes."""
        pairs: dict[str, str] = self._redis.hgetall(self._keys.running())  # type: ignore[assignment]  # decoded replies
        keys = [key for d, j in pairs.items() for key in (self._keys.part(j, d), self._keys.progress(j, d))]
        replies = self._redis.mget(keys) if keys else []
        running = {}
        for (device_id, job_id), raw, progress in zip(pairs.items(), replies[::2], replies[1::2]):
            part = DevicePart.model_validate_json(raw) if raw else None
            if part is not None and part.attempt is not None:
                running[device_id] = Running(job_id, part, FinetuneProgress.model_validate_json(progress) if progress else None)
        return running

    def parts_in(self, pairs: list[tuple[str, PartState]]) -> dict[tuple[str, PartState], list[str]]:
        """For each (job, state): the job's devices whose part is in it (one round trip)."""
        with self._redis.pipeline(transaction=False) as p:
            for job_id, state in pairs:
                self._as_json(args=["SMEMBERS", self._keys.parts_in(job_id, state.value)], client=p)
            return {pair: _json_list(members) for pair, members in zip(pairs, p.execute())}

    def event_routing_keys(self) -> list[str]:
        """The routing keys of the receivers bound to Celery's event exchange (kombu's bindings)."""
        return [member.split(KOMBU_SEPARATOR)[0] for member in texts(self._redis.smembers(EVENT_BINDINGS))]

    def queue_lengths(self, queues: list[str]) -> dict[str, int]:
        """Messages waiting in each broker queue (Celery's Redis transport: a list per queue; one round trip)."""
        return dict(zip(queues, self._each("LLEN", queues)))

    def note_master(self) -> tuple[str, str] | None:
        """Behind Sentinel: record the master the store runs on now; (previous, current) when it
        moved since the last note, for exactly one caller. None without Sentinel, on the first
        note, and while it stays."""
        current = master_address(self._redis)
        if current is None:
            return None
        previous = text(self._redis.getset(self._keys.store_master(), current))
        return (previous, current) if previous is not None and previous != current else None
