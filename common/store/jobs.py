"""Job records: the spec as submitted, each device's part, progress and the event log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

from ..jobs import (
    TERMINAL,
    AttemptLog,
    CheckpointRef,
    DevicePart,
    EventKind,
    FinetuneProgress,
    JobEvent,
    JobRecord,
    JobStatus,
    JobSummary,
    PartState,
    job_state,
)
from ..keys import Keys
from ..schemas import JobSpec, utc_now
from .connection import texts

T = TypeVar("T")


class JobNotFoundError(KeyError):
    """No job has this id."""


class JobStore:
    """Jobs by id, each with one part per device."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._redis, self._keys = client, keys

    def _transaction(self, key: str, apply: Callable[[Pipeline], T]) -> T:
        """`apply`'s value, its writes (queued after `multi()`) made only if `key` did not change
        since `apply` read it; run again while another process changes it first."""
        with self._redis.pipeline() as p:
            while True:
                try:
                    p.watch(key)
                    value = apply(p)
                    p.execute()
                    return value
                except redis.WatchError:
                    continue

    def create(self, job_id: str, spec: JobSpec) -> JobRecord:
        """Store a new job with a pending part per device, and its `submitted` event."""
        record = JobRecord(job_id=job_id, spec=spec)
        event = JobEvent(kind=EventKind.submitted, message="submitted")
        with self._redis.pipeline() as p:
            p.set(self._keys.job(job_id), record.model_dump_json())
            for d in spec.devices:
                part = DevicePart(device_id=d.device_id, power_cap_w=d.power_cap_w)
                p.set(self._keys.part(job_id, d.device_id), part.model_dump_json())
            for d in spec.devices:
                p.sadd(self._keys.device_jobs(d.device_id), job_id)
            p.zadd(self._keys.jobs(), {job_id: record.created_at.timestamp()})
            p.rpush(self._keys.events(job_id), event.model_dump_json())
            p.execute()
        return record

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record (spec and submission time), None for an unknown id."""
        raw = self._redis.get(self._keys.job(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    def part(self, job_id: str, device_id: str) -> DevicePart:
        """One device's part of a job; JobNotFoundError when there is none."""
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
        return [DevicePart.model_validate_json(raw) for raw in raws if raw is not None]

    def update_part(
        self, job_id: str, device_id: str, changes: dict[str, Any], expect: PartState | None = None
    ) -> DevicePart | None:
        """Apply `changes` to a part atomically (compare and set), if it is still in state
        `expect` (any state when None); returns the part as stored, or None when it had moved
        on (another process changed its state first)."""
        key = self._keys.part(job_id, device_id)

        def apply(p: Pipeline) -> DevicePart | None:
            raw = p.get(key)
            if raw is None:
                raise JobNotFoundError(f"job {job_id} has no device {device_id}")
            part = DevicePart.model_validate_json(raw)
            if expect is not None and part.state != expect:
                p.unwatch()
                return None
            part = part.model_copy(update=changes | {"updated_at": utc_now()})
            p.multi()
            p.set(key, part.model_dump_json())
            if part.state in TERMINAL:
                p.srem(self._keys.device_jobs(device_id), job_id)
            return part

        return self._transaction(key, apply)

    def device_jobs(self, device_id: str) -> list[str]:
        """Jobs with an unfinished part on `device_id`."""
        return sorted(texts(self._redis.smembers(self._keys.device_jobs(device_id))))

    def progress(self, job_id: str, device_id: str) -> FinetuneProgress | None:
        """The latest evaluation of a running fine-tune, if any."""
        raw = self._redis.get(self._keys.progress(job_id, device_id))
        return FinetuneProgress.model_validate_json(raw) if raw else None

    def set_checkpoint(self, job_id: str, device_id: str, checkpoint: CheckpointRef) -> None:
        """Record where a fine-tune's latest checkpoint is."""
        self._redis.set(self._keys.checkpoint(job_id, device_id), checkpoint.model_dump_json())

    def checkpoint(self, job_id: str, device_id: str) -> CheckpointRef | None:
        """A fine-tune's latest checkpoint, if it saved one."""
        raw = self._redis.get(self._keys.checkpoint(job_id, device_id))
        return CheckpointRef.model_validate_json(raw) if raw else None

    def set_attempt_log(self, job_id: str, device_id: str, log: AttemptLog) -> None:
        """Record a fine-tune's attempts and what the lost ones cost."""
        self._redis.set(self._keys.attempt_log(job_id, device_id), log.model_dump_json())

    def attempt_log(self, job_id: str, device_id: str) -> AttemptLog:
        """A fine-tune's attempts so far (none yet: an empty log)."""
        raw = self._redis.get(self._keys.attempt_log(job_id, device_id))
        return AttemptLog.model_validate_json(raw) if raw else AttemptLog()

    def set_progress(self, job_id: str, device_id: str, progress: FinetuneProgress) -> None:
        """Record a running fine-tune's latest evaluation."""
        self._redis.set(self._keys.progress(job_id, device_id), progress.model_dump_json())

    def event(self, job_id: str, kind: EventKind, message: str, device_id: str | None = None) -> None:
        """Append an event to the job's log."""
        event = JobEvent(kind=kind, device_id=device_id, message=message)
        self._redis.rpush(self._keys.events(job_id), event.model_dump_json())

    def job_ids(self) -> list[str]:
        """Every job id, oldest first."""
        return texts(self._redis.zrange(self._keys.jobs(), 0, -1))

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
            cancelled_at=record.cancelled_at,
        )

    def summaries(self, limit: int = 100) -> list[JobSummary]:
        """The newest `limit` jobs, newest first, with their state (two round trips)."""
        ids = texts(self._redis.zrevrange(self._keys.jobs(), 0, limit - 1))
        records = [JobRecord.model_validate_json(raw) for raw in self._redis.mget([self._keys.job(j) for j in ids]) if raw] if ids else []
        with self._redis.pipeline(transaction=False) as p:
            for record in records:
                p.mget([self._keys.part(record.job_id, d.device_id) for d in record.spec.devices])
            all_parts = p.execute()
        return [
            JobSummary(
                job_id=record.job_id,
                state=job_state([DevicePart.model_validate_json(raw) for raw in raws if raw]),
                model=record.spec.model,
                devices=len(record.spec.devices),
                created_at=record.created_at,
            )
            for record, raws in zip(records, all_parts)
        ]

    def requeue(self, job_id: str, device_id: str, state: PartState) -> DevicePart | None:
        """Put a part that ended in `state` back to pending, to be planned again."""
        changes = {
            "state": PartState.pending, "reason": None, "waiting": None, "selection": None, "baseline1": None,
            "estimated_time_to_accuracy_s": None, "baseline1_estimated_time_to_accuracy_s": None, "report": None,
        }  # fmt: skip
        part = self.update_part(job_id, device_id, changes, state)
        if part is not None:
            self._redis.sadd(self._keys.device_jobs(device_id), job_id)
            self.event(job_id, EventKind.requeued, "re-queued", device_id)
        return part

    def cancelled(self, job_id: str) -> bool:
        """Whether cancelling the job was asked for."""
        record = self.record(job_id)
        return record is not None and record.cancelled_at is not None

    def cancel(self, job_id: str) -> JobRecord:
        """Ask for the job to stop: nothing more of it is dispatched, running fine-tunes stop
        at their next step. Returns the record (unchanged when it was cancelled already)."""
        key = self._keys.job(job_id)

        def apply(p: Pipeline) -> JobRecord:
            raw = p.get(key)
            if raw is None:
                raise JobNotFoundError(f"no job {job_id!r}")
            record = JobRecord.model_validate_json(raw)
            if record.cancelled_at is not None:
                p.unwatch()
                return record
            record = record.model_copy(update={"cancelled_at": utc_now()})
            p.multi()
            p.set(key, record.model_dump_json())
            p.rpush(self._keys.events(job_id), JobEvent(kind=EventKind.cancelled, message="cancel requested").model_dump_json())
            return record

        return self._transaction(key, apply)
