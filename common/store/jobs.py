"""Job records: the spec as submitted, each device's part, progress and the event log."""

from __future__ import annotations

import redis

from ..jobs import DevicePart, EventKind, FinetuneProgress, JobEvent, JobRecord, JobStatus, job_state
from ..keys import Keys
from ..schemas import JobSpec, utc_now


class JobNotFoundError(KeyError):
    """No job has this id."""


class JobStore:
    """Jobs by id, each with one part per device."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def create(self, job_id: str, spec: JobSpec) -> JobRecord:
        """Store a new job with a pending part per device, and its `submitted` event."""
        record = JobRecord(job_id=job_id, spec=spec)
        event = JobEvent(kind=EventKind.submitted, message="submitted")
        with self._redis.pipeline() as p:
            p.set(self._keys.job(job_id), record.model_dump_json())
            for d in spec.devices:
                part = DevicePart(device_id=d.device_id, power_cap_w=d.power_cap_w)
                p.set(self._keys.part(job_id, d.device_id), part.model_dump_json())
            p.zadd(self._keys.jobs(), {job_id: record.created_at.timestamp()})
            p.rpush(self._keys.events(job_id), event.model_dump_json())
            p.execute()
        return record

    def record(self, job_id: str) -> JobRecord | None:
        raw = self._redis.get(self._keys.job(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    def part(self, job_id: str, device_id: str) -> DevicePart:
        raw = self._redis.get(self._keys.part(job_id, device_id))
        if raw is None:
            raise JobNotFoundError(f"job {job_id} has no device {device_id}")
        return DevicePart.model_validate_json(raw)

    def parts(self, job_id: str, device_ids: list[str]) -> list[DevicePart]:
        """The parts of `device_ids`, in that order (one round trip)."""
        raws = self._redis.mget([self._keys.part(job_id, d) for d in device_ids]) if device_ids else []
        missing = [d for d, raw in zip(device_ids, raws) if raw is None]
        if missing:
            raise JobNotFoundError(f"job {job_id} has no device {missing[0]}")
        return [DevicePart.model_validate_json(raw) for raw in raws]

    def put_part(self, job_id: str, part: DevicePart) -> DevicePart:
        """Store `part` (stamped with the time); returns what was stored."""
        part = part.model_copy(update={"updated_at": utc_now()})
        self._redis.set(self._keys.part(job_id, part.device_id), part.model_dump_json())
        return part

    def set_progress(self, job_id: str, device_id: str, progress: FinetuneProgress) -> None:
        self._redis.set(self._keys.progress(job_id, device_id), progress.model_dump_json())

    def event(self, job_id: str, kind: EventKind, message: str, device_id: str | None = None) -> None:
        """Append an event to the job's log."""
        event = JobEvent(kind=kind, device_id=device_id, message=message)
        self._redis.rpush(self._keys.events(job_id), event.model_dump_json())

    def job_ids(self) -> list[str]:
        """Every job id, oldest first."""
        return list(self._redis.zrange(self._keys.jobs(), 0, -1))

    def status(self, job_id: str) -> JobStatus:
        """The job's record, parts, progress and events, in two round trips whatever its size."""
        record = self.record(job_id)
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        ids = [d.device_id for d in record.spec.devices]
        with self._redis.pipeline(transaction=False) as p:
            p.mget([self._keys.part(job_id, d) for d in ids])
            p.mget([self._keys.progress(job_id, d) for d in ids])
            p.lrange(self._keys.events(job_id), 0, -1)
            raw_parts, raw_progress, raw_events = p.execute()
        parts = {d: DevicePart.model_validate_json(raw) for d, raw in zip(ids, raw_parts)}
        return JobStatus(
            job_id=job_id,
            state=job_state(list(parts.values())),
            spec=record.spec,
            parts=parts,
            progress={d: FinetuneProgress.model_validate_json(raw) for d, raw in zip(ids, raw_progress) if raw},
            created_at=record.created_at,
            events=[JobEvent.model_validate_json(raw) for raw in raw_events],
        )
