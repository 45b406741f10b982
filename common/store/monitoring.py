"""What monitoring reads and counts: counters of events (tasks handed on, retries), jobs with
their parts and progress in a few round trips, the fine-tunes running on devices, queue
lengths, and the master the store ran on last (behind Redis Sentinel)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from ..jobs.state import DevicePart, FinetuneProgress, JobRecord, PartState
from ..keys import Keys
from .connection import master_address, text, texts


@dataclass(frozen=True)
class DeviceLabels:
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


class Monitoring:
    """Counters and the bulk reads of the metrics exporter and `edgetrain doctor`."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def count(self, name: str, label: str, by: int = 1) -> None:
        """Add `by` to counter `name` under `label` (e.g. tasks handed on, by worker role)."""
        self._redis.hincrby(self._keys.counter(name), label, by)

    def counts(self, name: str) -> dict[str, int]:
        """Counter `name` by label (an empty dict before the first count)."""
        counts: dict[str, str] = self._redis.hgetall(self._keys.counter(name))  # type: ignore[assignment]  # decoded replies
        return {label: int(value) for label, value in counts.items()}

    def last_seen(self) -> dict[str, float]:
        """Every device ever registered -> its last heartbeat (Redis time, s since the epoch)."""
        seen: list[tuple[str, float]] = self._redis.zrange(self._keys.fleet_seen(), 0, -1, withscores=True)  # type: ignore[assignment]
        return dict(seen)

    def live_devices(self) -> list[DeviceLabels]:
        """The devices with a live heartbeat, by id, as metrics label them (two round trips;
        their records read as JSON, not validated: a scrape of a big fleet parses no more)."""
        ids = sorted(texts(self._redis.smembers(self._keys.fleet_ids())))
        raws = self._redis.mget([self._keys.device(d) for d in ids]) if ids else []
        found = [json.loads(raw) for raw in raws if raw]
        return [DeviceLabels(d["device_id"], d["device_type"], d["backend"], bool(d.get("simulated"))) for d in found]

    def unfinished_jobs(self, devices: list[str] | None = None) -> set[str]:
        """Every job with an unfinished part on one of `devices` (default: every device ever registered)."""
        devices = list(self.last_seen()) if devices is None else devices
        return set(texts(self._redis.sunion([self._keys.device_jobs(d) for d in devices]))) if devices else set()

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
                p.smembers(self._keys.parts_in(job_id, state.value))
            return {pair: texts(members) for pair, members in zip(pairs, p.execute())}

    def queue_lengths(self, queues: list[str]) -> dict[str, int]:
        """Messages waiting in each broker queue (Celery's Redis transport: a list per queue)."""
        with self._redis.pipeline(transaction=False) as p:
            for q in queues:
                p.llen(q)
            return {q: int(n) for q, n in zip(queues, p.execute())}

    def note_master(self) -> tuple[str, str] | None:
        """Behind Sentinel: record the master the store runs on now; (previous, current) when it
        moved since the last note, for exactly one caller. None without Sentinel, on the first
        note, and while it stays."""
        current = master_address(self._redis)
        if current is None:
            return None
        previous = text(self._redis.getset(self._keys.store_master(), current))
        return (previous, current) if previous is not None and previous != current else None
