"""Job records: the spec as submitted, each device's part, progress and the event log.

A part changes only through `apply`, which runs common/jobs/events.py's `transition` on the
part as read and writes the change, only if the part is still so, in one script with
everything that follows from it: the job's summary (parts per state), the device's index of
unfinished jobs and of the job it runs, the ledger of dispatched fine-tunes, the event log
and, once every part is final, the job's `finished` event and its expiry. The attempt
running a fine-tune writes its progress and checkpoint through `attempt_write`, fenced by its
token: a write of an attempt that no longer holds the part is refused."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

import redis
from redis.client import Pipeline

from ..ids import is_id
from ..jobs.events import Change, PartEvent, transition
from ..jobs.state import (
    TERMINAL,
    CheckpointRef,
    DevicePart,
    EventField,
    EventKind,
    FinetuneProgress,
    JobEvent,
    JobRecord,
    JobState,
    JobStatus,
    JobSummary,
    PartState,
    state_of_counts,
)
from ..keys import Keys
from ..limits import MAX_EVENTS_KEPT, RECORDS_KEPT
from ..schemas import DeviceInfo, JobSpec, utc_now
from .connection import text, texts, transaction

logger = logging.getLogger(__name__)


# KEYS: the part, the job's events, its summary, the part's progress and checkpoint; ARGV: the
# attempt's token, then an event, the progress and the checkpoint (JSON, or "" for none), then
# the events kept. Writes them only while the part is fine-tuning and held by that attempt (the
# summary's progress totals move by what the new progress adds); answers "gone" (no part),
# "stale" (another attempt holds it, or none), "cancel" (written; the job asks the attempt to
# stop) or "ok".
_FENCED_WRITE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 'gone' end
local part = cjson.decode(raw)
local attempt = part['attempt']
if part['state'] ~= 'finetuning' or type(attempt) ~= 'table' or attempt['token'] ~= ARGV[1] then return 'stale' end
if ARGV[3] ~= '' then
  local new, old = cjson.decode(ARGV[3]), redis.call('GET', KEYS[4])
  old = old and cjson.decode(old) or {}
  for _, total in ipairs({'samples', 'device_time_s', 'energy_j'}) do
    redis.call('HINCRBYFLOAT', KEYS[3], total, new[total] - (old[total] or 0))
  end
  redis.call('SET', KEYS[4], ARGV[3])
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[5], ARGV[4]) end
if ARGV[2] ~= '' then
  if redis.call('RPUSH', KEYS[2], ARGV[2]) > tonumber(ARGV[5]) then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1) end
end
if type(part['cancel_requested_at']) == 'string' then return 'cancel' end
return 'ok'
"""


# KEYS: the part; ARGV: the part as it was read (JSON), then the writes (a JSON list of commands,
# each a list of strings; "LOG key entry n" appends to a log kept to its newest n entries,
# "UNSET key field value" deletes a hash's field while it holds that value). Runs the writes
# only while the part is as read: 1 when it ran them, 0 when the part changed (or is gone) since.
_COMPARE_AND_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for _, command in ipairs(cjson.decode(ARGV[2])) do
  local name = command[1]
  if name == 'LOG' then
    if redis.call('RPUSH', command[2], command[3]) > tonumber(command[4]) then
      redis.call('LTRIM', command[2], -tonumber(command[4]), -1)
    end
  elseif name == 'UNSET' then
    if redis.call('HGET', command[2], command[3]) == command[4] then redis.call('HDEL', command[2], command[3]) end
  else
    redis.call(unpack(command))
  end
end
return 1
"""
Command = list[str]


NOT_REACHED = "not_reached"  # a field of a job's summary: parts completed without reaching the target
CANCELLED = "cancelled_at"  # a field of a job's summary: when cancelling it was asked for
TOTALS = ("samples", "device_time_s", "energy_j")  # fields of a job's summary: its parts' progress summed


@dataclass(frozen=True)
class Tally:
    """A job's summary as Redis keeps it (one hash, changed with every part and progress write):
    its parts per state, those completed short of the target, whether it was cancelled, and the
    sums over its parts of their latest progress or final report (samples, device time s,
    energy J)."""

    counts: dict[PartState, int]
    not_reached: int = 0
    cancelled: bool = False
    samples: float = 0.0
    device_time_s: float = 0.0
    energy_j: float = 0.0

    @classmethod
    def parse(cls, raw: dict) -> Tally:
        """The summary from its hash (as HGETALL answers)."""
        fields = {str(k): str(v) for k, v in raw.items()}
        states = {s.value for s in PartState}
        return cls(
            counts={PartState(k): int(v) for k, v in fields.items() if k in states and int(v)},
            not_reached=int(fields.get(NOT_REACHED, 0)),
            cancelled=CANCELLED in fields,
            **{total: float(fields.get(total, 0.0)) for total in TOTALS},
        )

    @property
    def state(self) -> JobState:
        """The job's state."""
        return state_of_counts(self.counts, self.cancelled)

    @property
    def finished(self) -> bool:
        """No part is left to finish."""
        return not any(n > 0 for s, n in self.counts.items() if s not in TERMINAL)


class JobNotFoundError(KeyError):
    """No job has this id."""


class JobFinished(ValueError):
    """The job has finished: there is nothing left to stop."""


class Written(str, Enum):
    """What became of an attempt's write."""

    ok = "ok"
    cancel = "cancel"  # written; the job asks the attempt to stop
    stale = "stale"  # refused: the attempt no longer holds the part
    gone = "gone"  # refused: the part is not in the store (the job was deleted, or Redis lost it)


@dataclass(frozen=True)
class Applied:
    """A change `apply` made: the part before and after, and whether the job finished with it."""

    before: DevicePart
    change: Change
    finished: JobState | None = None

    @property
    def part(self) -> DevicePart:
        """The part as stored now."""
        return self.change.part


@dataclass
class PageRead:
    """A page of a job's parts as read, and those of its devices that are registered."""

    job_id: str
    device_ids: list[str]
    raws: list
    devices: dict[str, DeviceInfo]
    _parts: list[DevicePart] | None = None

    def parts(self) -> list[DevicePart]:
        """The parts, in the page's order (parsed once); JobNotFoundError when one is missing."""
        if self._parts is None:
            self._parts = _parsed_parts(self.job_id, self.device_ids, self.raws)
        return self._parts


PLAN_EARLY_AT = 6  # jobs at the doorbell that end a planning step's wait (at 250 jobs/s: 24 ms)


def _parsed_parts(job_id: str, device_ids: list[str], raws: list) -> list[DevicePart]:
    """The parts of `device_ids` read as `raws`; JobNotFoundError when one is missing."""
    missing = [d for d, raw in zip(device_ids, raws) if raw is None]
    if missing:
        raise JobNotFoundError(f"job {job_id} has no device {missing[0]}")
    return [DevicePart.model_validate_json(raw) for raw in raws]


class JobStore:
    """Jobs by id, each with one part per device. Finished jobs expire `retention_s` seconds
    after they finish (None: kept until pruned)."""

    def __init__(self, client: redis.Redis, keys: Keys, retention_s: float | None = None):
        self._redis, self._keys, self.retention_s = client, keys, retention_s
        self._fenced_write = client.register_script(_FENCED_WRITE)
        self._compare_and_write = client.register_script(_COMPARE_AND_WRITE)
        self._parsed: OrderedDict[str, tuple[bytes | str, JobRecord, dict[str, int]]] = OrderedDict()
        self._parsed_lock = threading.Lock()

    def create(self, job_id: str, spec: JobSpec, ring_for_s: float = 0.0) -> int:
        """Store a new job with a pending part per device, and its `submitted` event, among the
        jobs no control worker took up yet, and (for `ring_for_s` > 0) ring the doorbell of those
        jobs, which stays rung for `ring_for_s` (s) unless answered. Returns how many jobs rang
        it since it was last answered, this one included (0 without ringing): at 1 the caller
        sends `plan_submitted`, at PLAN_EARLY_AT it calls `plan_now`."""
        record = JobRecord(job_id=job_id, spec=spec)
        event = JobEvent(kind=EventKind.submitted, message="submitted")
        with self._redis.pipeline() as p:
            p.set(self._keys.job(job_id), record.model_dump_json())
            for d in spec.devices:
                part = DevicePart(device_id=d.device_id, power_cap_w=d.power_cap_w)
                p.set(self._keys.part(job_id, d.device_id), part.model_dump_json())
            for d in spec.devices:
                p.sadd(self._keys.device_jobs(d.device_id), job_id)
            p.hset(self._keys.job_states(job_id), PartState.pending.value, len(spec.devices))
            p.sadd(self._keys.parts_in(job_id, PartState.pending.value), *[d.device_id for d in spec.devices])
            p.zadd(self._keys.jobs(), {job_id: record.created_at.timestamp()})
            p.zadd(self._keys.unplanned(), {job_id: record.created_at.timestamp()})
            p.rpush(self._keys.events(job_id), event.model_dump_json())
            if ring_for_s > 0:
                p.incr(self._keys.plan_doorbell())
                p.pexpire(self._keys.plan_doorbell(), max(1, round(ring_for_s * 1e3)))
            replies = p.execute()
        return int(replies[-2]) if ring_for_s > 0 else 0

    def plan_now(self) -> None:
        """Enough jobs rang the doorbell: the planning step waiting for more (`wait_to_plan`) goes on."""
        self._redis.rpush(self._keys.plan_now(), 1)

    def wait_to_plan(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` (s) for `plan_now`."""
        if timeout_s > 0:
            self._redis.blpop([self._keys.plan_now()], timeout=timeout_s)

    def answer_doorbell(self, limit: int) -> list[str]:
        """Up to `limit` jobs no control worker took up yet, oldest first, and the doorbell
        silenced in the same transaction: a job submitted after this read rings it again."""
        with self._redis.pipeline() as p:
            p.delete(self._keys.plan_doorbell(), self._keys.plan_now())
            p.zrange(self._keys.unplanned(), 0, limit - 1)
            return texts(p.execute()[1])

    def records(self, job_ids: list[str]) -> list[JobRecord | None]:
        """The records of `job_ids` (see `record`; None also for one that does not parse), in one
        round trip. Unlike `take_up`, it leaves them among the jobs not taken up until `planned`,
        so a step lost midway takes them up again."""
        raws = self._redis.mget([self._keys.job(j) for j in job_ids]) if job_ids else []
        return [self._readable(j, raw) for j, raw in zip(job_ids, raws)]

    def _readable(self, job_id: str, raw: bytes | str | None) -> JobRecord | None:
        try:
            parsed = self._parse(job_id, raw) if raw else None
        except ValueError:  # written past the client: its step would fail on every read
            return None
        return parsed[1] if parsed else None

    def planned(self, job_ids: list[str]) -> None:
        """The first step of `job_ids` was carried out: strike them off the jobs not taken up."""
        if job_ids:
            self._redis.zrem(self._keys.unplanned(), *job_ids)

    def take_up(self, job_id: str) -> JobRecord | None:
        """The job's record (see `record`), struck off the jobs no control worker took up yet,
        in one round trip; None for an unknown id."""
        with self._redis.pipeline(transaction=False) as p:
            p.get(self._keys.job(job_id))
            p.zrem(self._keys.unplanned(), job_id)
            raw, _ = p.execute()
        parsed = self._parse(job_id, raw)
        return parsed[1] if parsed else None

    def unplanned(self, before_s: float, limit: int) -> list[str]:
        """Up to `limit` jobs submitted before `before_s` (s) that no control worker took up yet
        (the message that was to start them is lost, or no control worker runs)."""
        return texts(self._redis.zrangebyscore(self._keys.unplanned(), "-inf", before_s, start=0, num=limit))

    def remind(self, job_ids: list[str], at_s: float) -> None:
        """The jobs were sent their first step again at `at_s` (s)."""
        if job_ids:
            self._redis.zadd(self._keys.unplanned(), dict.fromkeys(job_ids, at_s), xx=True)

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record (spec and submission time), None for an unknown id. Records are
        parsed once per process and change: a job of 10 000 devices is a megabyte of JSON."""
        parsed = self._parse(job_id)
        return parsed[1] if parsed else None

    def position(self, job_id: str, device_id: str) -> int | None:
        """Where `device_id` is in the job's list of devices; None when the job or the device
        in it is unknown."""
        parsed = self._parse(job_id)
        return parsed[2].get(device_id) if parsed else None

    def _parse(self, job_id: str, raw: bytes | str | None = None) -> tuple[bytes | str, JobRecord, dict[str, int]] | None:
        """(raw, record, position of each device id), parsed again only when the raw (read now
        unless given) changed."""
        raw = raw if raw is not None else self._redis.get(self._keys.job(job_id))
        if not raw:
            return None
        with self._parsed_lock:
            kept = self._parsed.get(job_id)
        if kept is not None and kept[0] == raw:
            return kept
        record = JobRecord.model_validate_json(raw)
        parsed = (raw, record, {d.device_id: i for i, d in enumerate(record.spec.devices)})
        with self._parsed_lock:
            self._parsed[job_id] = parsed
            self._parsed.move_to_end(job_id)
            while len(self._parsed) > RECORDS_KEPT:
                self._parsed.popitem(last=False)
        return parsed

    def part(self, job_id: str, device_id: str) -> DevicePart:
        """One device's part of a job; JobNotFoundError when there is none."""
        raw = self._redis.get(self._keys.part(job_id, device_id))
        if raw is None:
            raise JobNotFoundError(f"job {job_id} has no device {device_id}")
        return DevicePart.model_validate_json(raw)

    def parts(self, job_id: str, device_ids: list[str]) -> list[DevicePart]:
        """The parts of `device_ids`, in that order (one round trip)."""
        raws = self._redis.mget([self._keys.part(job_id, d) for d in device_ids]) if device_ids else []
        return _parsed_parts(job_id, device_ids, raws)

    def parts_and_devices(self, pages: list[tuple[str, list[str]]]) -> list[PageRead]:
        """For each page (job id, device ids): its parts and those of its devices that are
        registered (`FleetRegistry.devices_by_id`); every page in one command."""
        keys = [k for job_id, ids in pages for k in [*(self._keys.part(job_id, d) for d in ids), *map(self._keys.device, ids)]]
        raws, at, reads = (self._redis.mget(keys) if keys else []), 0, []
        for job_id, ids in pages:
            parts, registered = raws[at : at + len(ids)], raws[at + len(ids) : at + 2 * len(ids)]
            at += 2 * len(ids)
            devices = {d: DeviceInfo.model_validate_json(raw) for d, raw in zip(ids, registered) if raw}
            reads.append(PageRead(job_id, ids, parts, devices))
        return reads

    def parts_at(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], DevicePart]:
        """The parts of these (job, device) pairs that exist, in one command."""
        raws = self._redis.mget([self._keys.part(j, d) for j, d in pairs]) if pairs else []
        return {pair: DevicePart.model_validate_json(raw) for pair, raw in zip(pairs, raws) if raw}

    def apply(self, job_id: str, device_id: str, event: PartEvent, seen: DevicePart | None = None) -> Applied:
        """Apply `event` to the part of `device_id` (common/jobs/events.py decides the change)
        and write it, with what follows from it, only if the part did not change meanwhile (else
        read it again and decide again): one round trip from `seen` (the part as the caller
        read it), two otherwise, and reads of the part's last progress when its attempt ends and
        of the job's counts when the change may finish it. Refused (common/jobs/state.py) when it
        does not apply, JobNotFoundError when there is no such part."""
        key = self._keys.part(job_id, device_id)
        raw, written = (seen.model_dump_json() if seen is not None else None), None
        while True:
            if raw is None and (raw := text(self._redis.get(key))) is None:
                raise JobNotFoundError(f"job {job_id} has no device {device_id}")
            if raw == written:  # the write went through but its reply was lost, and the retry found it done
                break
            before = seen if seen is not None else DevicePart.model_validate_json(raw)
            change = transition(before, event, utc_now())
            if change.part == before:
                break
            reported = change.part.report is not None and before.report is None
            last = self._redis.get(self._keys.progress(job_id, device_id)) if reported else None  # only the attempt ending now writes it
            writes = self._write(job_id, before, change, FinetuneProgress.model_validate_json(last) if last else None)
            if self._compare_and_write(keys=[key], args=[raw, json.dumps(writes)]):
                break
            raw, seen, written = None, None, writes[0][2]  # changed since it was read (or by this very write: see above)
        if change.part.state == PartState.failed and before.state != PartState.failed:  # every failure passes here
            logger.warning("job %s, %s failed: %s", job_id, device_id, change.part.reason)
        finished = self._finished(job_id) if change.part.state in TERMINAL and before.state not in TERMINAL else None
        return Applied(before, change, finished)

    def _write(self, job_id: str, before: DevicePart, change: Change, last: FinetuneProgress | None) -> list[Command]:
        """The writes of `change`, as Redis commands; `last`: the part's progress before a
        report that ends it."""
        after, device_id, k = change.part, before.device_id, self._keys
        summary, member = k.job_states(job_id), f"{job_id}/{device_id}"
        writes = [["SET", k.part(job_id, device_id), after.model_dump_json()]]
        if after.state != before.state:
            writes += [["HINCRBY", summary, before.state.value, "-1"], ["HINCRBY", summary, after.state.value, "1"],
                       ["SMOVE", k.parts_in(job_id, before.state.value), k.parts_in(job_id, after.state.value), device_id]]  # fmt: skip
            if after.report is not None and not after.report.reached:
                writes.append(["HINCRBY", summary, NOT_REACHED, "1"])
        if after.report is not None and before.report is None:  # the totals hold the final figures from now on
            final = (after.report.samples_processed, after.report.device_time_s, after.report.energy_j)
            writes += [["HINCRBYFLOAT", summary, total, repr(value - (getattr(last, total) if last else 0.0))]
                       for total, value in zip(TOTALS, final)]  # fmt: skip
        if before.attempt is None and after.attempt is not None:
            writes.append(["HSET", k.running(), device_id, job_id])
        elif before.attempt is not None and after.attempt is None:  # unless another job's attempt runs there since
            writes.append(["UNSET", k.running(), device_id, job_id])
        if after.state in TERMINAL:
            writes += [["SREM", k.device_jobs(device_id), job_id], ["ZREM", k.dispatched(), member]]
        elif before.state in TERMINAL:  # planned again
            writes += [["SADD", k.device_jobs(device_id), job_id], ["DEL", k.once(f"finished:{job_id}")]]
            writes += [["PERSIST", key] for key in self._job_keys(job_id)]
        if after.dispatch is not None and (before.dispatch is None or before.dispatch.token != after.dispatch.token):
            writes.append(["ZADD", k.dispatched(), repr(after.updated_at.timestamp()), member])
        elif after.dispatch is None and before.dispatch is not None:
            writes.append(["ZREM", k.dispatched(), member])
        if change.message is not None and change.kind is not None:
            event = JobEvent(kind=change.kind, device_id=device_id, message=change.message, at=after.updated_at, fields=change.fields)
            writes.append(["LOG", k.events(job_id), event.model_dump_json(), str(MAX_EVENTS_KEPT)])
        return writes

    def _log(self, p: Pipeline, job_id: str, event: JobEvent) -> None:
        p.rpush(self._keys.events(job_id), event.model_dump_json())
        p.ltrim(self._keys.events(job_id), -MAX_EVENTS_KEPT, -1)

    def _finished(self, job_id: str) -> JobState | None:
        """The job's state if no part of it is left to finish (its `finished` event is logged and
        its keys set to expire, once per finish), else None."""
        tally = self.tallies([job_id])[job_id]
        if not tally.finished:
            return None
        once, state = self._keys.once(f"finished:{job_id}"), tally.state
        keys = self._job_keys(job_id) if self.retention_s is not None else []
        with self._redis.pipeline() as p:  # the mark, the event and the expiries together: none without the others
            try:
                p.watch(once)
                if p.exists(once):
                    return None
                p.multi()
                p.set(once, "1")
                self._log(p, job_id, JobEvent(kind=EventKind.finished, message=f"finished: {state.value}"))
                for key in keys:
                    p.expire(key, int(self.retention_s or 0))
                p.execute()
            except redis.WatchError:  # another process marked it first
                return None
        return state

    def _job_keys(self, job_id: str) -> list[str]:
        """Every key of a job: its record, parts, progress, checkpoints, events, counts and
        devices by state."""
        record = self.record(job_id)
        devices = [d.device_id for d in record.spec.devices] if record else []
        k = self._keys
        per_device = [key for d in devices for key in (k.part(job_id, d), k.progress(job_id, d), k.checkpoint(job_id, d))]
        by_state = [k.parts_in(job_id, s.value) for s in PartState]
        return [k.job(job_id), k.events(job_id), k.job_states(job_id), k.once(f"finished:{job_id}"), *by_state, *per_device]

    def tallies(self, job_ids: list[str]) -> dict[str, Tally]:
        """The summary of each of `job_ids` (one round trip; an unknown job's is empty)."""
        with self._redis.pipeline(transaction=False) as p:
            for job_id in job_ids:
                p.hgetall(self._keys.job_states(job_id))
            return {job_id: Tally.parse(raw) for job_id, raw in zip(job_ids, p.execute())}

    def running_on(self, device_ids: list[str]) -> dict[str, str]:
        """The job whose fine-tune an attempt runs on each of `device_ids` that runs one now
        (the latest started; one command)."""
        jobs = self._redis.hmget(self._keys.running(), device_ids) if device_ids else []
        return {d: text(job) for d, job in zip(device_ids, jobs) if job}  # type: ignore[misc]

    def attempt_write(
        self, job_id: str, device_id: str, attempt: str, progress: FinetuneProgress | None = None,
        checkpoint: CheckpointRef | None = None, event: tuple[EventKind, str] | None = None,
    ) -> Written:  # fmt: skip
        """Write what a running attempt measured (its progress, its checkpoint, an event for the
        log), only while it holds the part (see `Written`)."""
        k = self._keys
        keys = [k.part(job_id, device_id), k.events(job_id), k.job_states(job_id), k.progress(job_id, device_id),
                k.checkpoint(job_id, device_id)]  # fmt: skip
        logged = JobEvent(kind=event[0], device_id=device_id, message=event[1]).model_dump_json() if event else ""
        values = [value.model_dump_json() if value is not None else "" for value in (progress, checkpoint)]
        return Written(text(self._fenced_write(keys=keys, args=[attempt, logged, *values, MAX_EVENTS_KEPT])))

    def device_jobs(self, device_id: str) -> list[str]:
        """Jobs with an unfinished part on `device_id`."""
        return sorted(texts(self._redis.smembers(self._keys.device_jobs(device_id))))

    def progress(self, job_id: str, device_id: str) -> FinetuneProgress | None:
        """The latest evaluation of a running fine-tune, if any."""
        raw = self._redis.get(self._keys.progress(job_id, device_id))
        return FinetuneProgress.model_validate_json(raw) if raw else None

    def checkpoint(self, job_id: str, device_id: str) -> CheckpointRef | None:
        """A fine-tune's latest checkpoint, if it saved one."""
        raw = self._redis.get(self._keys.checkpoint(job_id, device_id))
        return CheckpointRef.model_validate_json(raw) if raw else None

    def event(self, job_id: str, kind: EventKind, message: str, device_id: str | None = None,
              fields: dict[str, EventField] | None = None) -> None:  # fmt: skip
        """Append an event that changes no part (a dispatch to the server pool, a table not
        reused) to the job's log, with its typed fields."""
        with self._redis.pipeline() as p:
            self._log(p, job_id, JobEvent(kind=kind, device_id=device_id, message=message, fields=fields or {}))
            p.execute()

    def job_ids(self) -> list[str]:
        """Every job id, oldest first."""
        return texts(self._redis.zrange(self._keys.jobs(), 0, -1))

    def dispatched_since(self, before_s: float, limit: int) -> list[tuple[str, str]]:
        """(job, device) of up to `limit` dispatched fine-tunes whose task was last seen before
        `before_s` (s since the epoch), oldest first."""
        members = texts(self._redis.zrangebyscore(self._keys.dispatched(), "-inf", before_s, start=0, num=limit))
        return [(m.split("/", 1)[0], m.split("/", 1)[1]) for m in members]

    def seen_dispatched(self, parts: list[tuple[str, str]], at_s: float) -> None:
        """A task was seen for these dispatched fine-tunes at `at_s` (only those still listed)."""
        if parts:
            self._redis.zadd(self._keys.dispatched(), {f"{j}/{d}": at_s for j, d in parts}, xx=True)

    def status(self, job_id: str, devices: list[str] | None = None, newest_events: int | None = None) -> JobStatus:
        """The job's record, counts of parts per state, the parts and progress of `devices`
        (default: every device), and its events (the newest `newest_events`, default every
        one kept): two round trips whatever the job's size."""
        parsed = self._parse(job_id)
        if parsed is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        _, record, positions = parsed
        ids = [d.device_id for d in record.spec.devices] if devices is None else devices
        unknown = [d for d in ids if d not in positions]
        if unknown:
            raise JobNotFoundError(f"job {job_id} has no device {unknown[0]!r}")
        with self._redis.pipeline(transaction=False) as p:
            p.lrange(self._keys.events(job_id), -newest_events if newest_events else 0, -1)
            p.hgetall(self._keys.job_states(job_id))
            if ids:
                p.mget([self._keys.part(job_id, d) for d in ids])
                p.mget([self._keys.progress(job_id, d) for d in ids])
            raw_events, raw_counts, *per_device = p.execute()
        raw_parts, raw_progress = per_device or ([], [])
        tally = Tally.parse(raw_counts)
        return JobStatus(
            job_id=job_id,
            state=tally.state,
            spec=record.spec,
            parts={d: DevicePart.model_validate_json(raw) for d, raw in zip(ids, raw_parts) if raw},
            progress={d: FinetuneProgress.model_validate_json(raw) for d, raw in zip(ids, raw_progress) if raw},
            created_at=record.created_at,
            events=[JobEvent.model_validate_json(raw) for raw in raw_events],
            cancelled_at=record.cancelled_at,
            counts=tally.counts,
        )

    def devices_in(self, job_id: str, state: PartState) -> list[str]:
        """The job's devices whose part is in `state`, in the job's order."""
        parsed = self._parse(job_id)
        if parsed is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        members = [d for d in texts(self._redis.smembers(self._keys.parts_in(job_id, state.value))) if d in parsed[2]]
        return sorted(members, key=parsed[2].__getitem__)

    def summaries(self, limit: int = 100) -> list[JobSummary]:
        """The newest `limit` jobs, newest first, with their state and, for a job with failed
        parts, one of them and why it failed (at most three round trips); jobs whose record
        expired are dropped from the list."""
        ids = [j for j in texts(self._redis.zrevrange(self._keys.jobs(), 0, limit - 1)) if is_id(j)]  # a member written past the client
        with self._redis.pipeline(transaction=False) as p:
            for job_id in ids:
                p.get(self._keys.job(job_id))
                p.hgetall(self._keys.job_states(job_id))
            raws = p.execute()
        gone = [j for j, raw in zip(ids, raws[::2]) if raw is None]
        if gone:
            self._redis.zrem(self._keys.jobs(), *gone)
        kept = [(JobRecord.model_validate_json(raw), Tally.parse(counts)) for raw, counts in zip(raws[::2], raws[1::2]) if raw]
        failed = [r.job_id for r, tally in kept if tally.counts.get(PartState.failed)]
        failures = dict(zip(failed, self._one_failed(failed)))
        return [JobSummary(
            job_id=record.job_id, state=tally.state, model=record.spec.model, devices=len(record.spec.devices),
            created_at=record.created_at, not_reached=tally.not_reached, failed=tally.counts.get(PartState.failed, 0),
            failure=failures.get(record.job_id),
        ) for record, tally in kept]  # fmt: skip

    def _one_failed(self, job_ids: list[str]) -> list[str | None]:
        """For each job, one of its failed parts and why, "device: reason" (two round trips)."""
        if not job_ids:
            return []
        with self._redis.pipeline(transaction=False) as p:
            for job_id in job_ids:
                p.srandmember(self._keys.parts_in(job_id, PartState.failed.value))
            devices = [text(d) for d in p.execute()]
        keys = [self._keys.part(j, d) for j, d in zip(job_ids, devices) if d]
        parts = iter(self._redis.mget(keys) if keys else [])
        found = [DevicePart.model_validate_json(raw) if d and (raw := next(parts)) else None for d in devices]
        return [f"{part.device_id}: {part.reason}" if part else None for part in found]

    def cancel(self, job_id: str) -> JobRecord:
        """Record that cancelling the job was asked for (the planner then stops each part).
        Returns the record (unchanged when it was cancelled already); JobFinished, changing
        nothing, when every part has finished."""
        key = self._keys.job(job_id)

        def apply(p: Pipeline) -> JobRecord:
            raw = p.get(key)
            if raw is None:
                raise JobNotFoundError(f"no job {job_id!r}")
            record = JobRecord.model_validate_json(raw)
            tally = Tally.parse(p.hgetall(self._keys.job_states(job_id)))
            if tally.finished:
                p.unwatch()
                raise JobFinished(f"job {job_id} has already finished ({tally.state.value}): nothing to cancel")
            if record.cancelled_at is not None:
                p.unwatch()
                return record
            now = utc_now()
            record = record.model_copy(update={"cancelled_at": now})
            p.multi()
            p.set(key, record.model_dump_json())
            p.hset(self._keys.job_states(job_id), CANCELLED, now.isoformat())
            self._log(p, job_id, JobEvent(kind=EventKind.cancelled, message="cancel requested"))
            return record

        return transaction(self._redis, apply, key, self._keys.job_states(job_id))  # a part finishing meanwhile may finish the job

    def prune(self, older_than_s: float) -> list[str]:
        """Delete the finished jobs submitted more than `older_than_s` seconds ago; returns
        their ids."""
        cutoff = utc_now().timestamp() - older_than_s
        pruned = []
        for job_id in texts(self._redis.zrangebyscore(self._keys.jobs(), "-inf", cutoff)):
            keys = self._job_keys(job_id)

            def delete_if_finished(p: Pipeline, job_id: str = job_id, keys: list[str] = keys) -> bool:
                if not Tally.parse(p.hgetall(self._keys.job_states(job_id))).finished:
                    p.unwatch()
                    return False
                p.multi()
                p.delete(*keys)
                p.zrem(self._keys.jobs(), job_id)
                return True

            if transaction(self._redis, delete_if_finished, self._keys.job_states(job_id)):  # a part re-queued meanwhile keeps the job
                pruned.append(job_id)
        return pruned
