"""Federated jobs in Redis: the record, the state, each round's updates, the rounds and events.

The submitter writes the record (and an operator's request to cancel); everything else is the
workers'. The state changes only through `apply`, which runs common/federated/events.py's
`transition` inside one WATCH/MULTI transaction with what follows from the change: an accepted
update stored in its round, tasks that must not be lost written in the ledger of sent tasks, an
aggregated round appended and its updates dropped (buffered: all but the next buffer's), its
new global model kept track of until it is deleted, a finished job's keys given their expiry
and the updates it did not aggregate kept track of for deletion, and the line of the job's log.
An update is aggregated only if the state accepted it (its digest is in the state), so a write
beside `apply` changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import redis
from redis.client import Pipeline

from ..federated.events import Change, FederatedEvent, Refused, RoundAggregated, UpdateAccepted, transition
from ..federated.records import FINAL, FederatedRecord, FederatedState, LocalUpdate, Phase, RoundRecord
from ..jobs.state import EventKind, JobEvent
from ..keys import Keys
from ..limits import MAX_EVENTS_KEPT
from ..schemas import utc_now
from .connection import text, texts, transaction
from .ledger import SentTask, TaskLedger


def _digest_of(raw: bytes | str) -> str | None:
    """The digest of a stored update; None for an entry that is not one."""
    try:
        return LocalUpdate.model_validate_json(raw).digest()
    except ValueError:
        return None


def _accepted_weights(held: dict[str, str], accepted: dict[str, str]) -> list[str]:
    """The artifacts of the entries of `held` that the state accepted (`accepted`: key -> digest);
    an entry written beside `apply` may name any artifact, so it names none to delete."""
    return sorted(a for key, value in held.items() if key in accepted and _digest_of(value) == accepted[key]
                  for a in LocalUpdate.model_validate_json(value).artifacts())  # fmt: skip


def _ends(before: FederatedState, change: Change) -> bool:
    """Whether the change ends the job."""
    return change.state.phase in FINAL and before.phase not in FINAL


class FederatedStore:
    """Federated job records, their state, rounds and rounds' updates; a finished job expires
    `retention_s` seconds after it finished (None: kept)."""

    def __init__(self, client: redis.Redis, keys: Keys, ledger: TaskLedger, retention_s: float | None = None):
        self._redis, self._keys, self._ledger, self.retention_s = client, keys, ledger, retention_s

    # ---------------------------------------------------------------- the submitter's writes

    def create(self, record: FederatedRecord) -> None:
        """Store a new federated job as submitted; the control worker starts it."""
        k, job_id = self._keys, record.job_id
        with self._redis.pipeline() as p:
            p.set(k.federated(job_id), record.model_dump_json())
            p.zadd(k.federated_jobs(), {job_id: record.created_at.timestamp()})
            p.sadd(k.federated_active(), job_id)
            p.execute()

    def request_cancel(self, job_id: str) -> None:
        """Ask the control worker to cancel the job (it applies it at its next advance)."""
        self._redis.set(self._keys.federated_cancel(job_id), utc_now().isoformat(), nx=True)

    # ---------------------------------------------------------------- the one writer of the state

    def start(self, record: FederatedRecord) -> FederatedState:
        """The job's state, made at its first advance (before round 1) with its `submitted` event."""
        k, job_id = self._keys, record.job_id
        state = FederatedState(global_weights=record.spec.weights, buffered=record.spec.aggregation.mode == "buffered")
        if self._redis.set(k.federated_state(job_id), state.model_dump_json(), nx=True):
            submitted = JobEvent(at=record.created_at, kind=EventKind.submitted, message="federated job submitted")
            self._push_event(self._redis, job_id, submitted)
            return state
        current = self.state(job_id)  # another advance started it first
        assert current is not None
        return current

    def apply(self, job_id: str, event: FederatedEvent, tracked: Sequence[SentTask] = (), now: datetime | None = None) -> Change:
        """Apply `event` to the job's state in one transaction, with what follows from it, and
        write `tracked` (tasks that must not be lost) in the ledger with it; Refused when the
        event does not apply (its message says why)."""
        key = self._keys.federated_state(job_id)

        def apply(p: Pipeline) -> Change:
            raw = p.get(key)
            if raw is None:
                raise Refused(f"no federated job {job_id} has started")
            before = FederatedState.model_validate_json(raw)
            change = transition(before, event, now or utc_now())
            held = self._held(p, job_id, before, change, event)
            p.multi()
            if change.state != before:
                p.set(key, change.state.model_dump_json())
            self._follow(p, job_id, before, change, event, held)
            self._ledger.write(p, tracked)
            return change

        return transaction(self._redis, apply, key)

    def _held(self, p: Pipeline, job_id: str, before: FederatedState, change: Change, event: FederatedEvent) -> dict[str, str]:
        """The entries of the updates' hash (read on the watched `p`) where the change needs them:
        a buffered aggregation drops all but the next buffer's, and a job that ends drops them all."""
        if _ends(before, change) or (isinstance(event, RoundAggregated) and before.buffered):
            return {str(key): str(value) for key, value in p.hgetall(self._updates_key(job_id, before, before.round)).items()}
        return {}

    def _follow(self, p: Pipeline, job_id: str, before: FederatedState, change: Change, event: FederatedEvent,
                held: dict[str, str]) -> None:  # fmt: skip
        """Queue on `p` what follows from a change besides the state (`held`: `_held`)."""
        k = self._keys
        if isinstance(event, UpdateAccepted):
            p.hset(self._updates_key(job_id, before, event.update.round), event.update.key, event.update.model_dump_json())
        if isinstance(event, RoundAggregated):
            p.rpush(k.federated_rounds(job_id), event.record.model_dump_json())
            if event.weights != before.global_weights:  # a new global model (an empty round keeps the one before)
                p.sadd(k.federated_artifacts(job_id), event.weights)
            if variates := [a for a in (event.control, *event.drift.values()) if a]:
                p.sadd(k.federated_artifacts(job_id), *variates)  # drift correction's control variates, deleted once replaced
            if before.buffered and (dropped := set(held) - set(before.received)):  # the buffer aggregated, and entries written beside
                p.hdel(k.federated_buffer(job_id), *dropped)
            elif not before.buffered:
                p.delete(k.federated_round(job_id, event.record.round))
        if _ends(before, change):
            p.srem(k.federated_active(), job_id)
            p.delete(self._updates_key(job_id, before, before.round))
            if left := _accepted_weights(held, {**before.received, **before.aggregating}):
                p.sadd(k.federated_artifacts(job_id), *left)
            p.srem(k.federated_artifacts(job_id), change.state.global_weights)  # the job's result
            if self.retention_s is not None:
                for key in (k.federated(job_id), k.federated_cancel(job_id), k.federated_state(job_id), k.federated_rounds(job_id),
                            k.federated_events(job_id), k.federated_artifacts(job_id)):  # fmt: skip
                    p.expire(key, int(self.retention_s))
        if change.message is not None:
            self._push_event(p, job_id, JobEvent(kind=change.kind or EventKind.federated_round, message=change.message,
                                                 device_id=change.device_id, fields=change.fields))  # fmt: skip

    def _updates_key(self, job_id: str, state: FederatedState, round_number: int) -> str:
        """Where accepted updates are kept: per round, or (buffered) in the job's one buffer."""
        return self._keys.federated_buffer(job_id) if state.buffered else self._keys.federated_round(job_id, round_number)

    def note(self, job_id: str, kind: EventKind, message: str, device_id: str | None = None) -> None:
        """Log an event of the job that changes nothing (a profile sent, an update discarded)."""
        self._push_event(self._redis, job_id, JobEvent(kind=kind, message=message, device_id=device_id))

    def _push_event(self, p: redis.Redis | Pipeline, job_id: str, event: JobEvent) -> None:
        key = self._keys.federated_events(job_id)
        p.rpush(key, event.model_dump_json())
        p.ltrim(key, -MAX_EVENTS_KEPT, -1)

    # ---------------------------------------------------------------- reads

    def record(self, job_id: str) -> FederatedRecord | None:
        """The job as submitted; None for an unknown id."""
        raw = self._redis.get(self._keys.federated(job_id))
        return FederatedRecord.model_validate_json(raw) if raw else None

    def state(self, job_id: str) -> FederatedState | None:
        """Where the job is now; None before the control worker started it (or for an unknown id)."""
        raw = self._redis.get(self._keys.federated_state(job_id))
        return FederatedState.model_validate_json(raw) if raw else None

    def cancel_requested_at(self, job_id: str) -> datetime | None:
        """When an operator asked to cancel the job, if one did."""
        raw = text(self._redis.get(self._keys.federated_cancel(job_id)))
        return datetime.fromisoformat(raw) if raw else None

    def active(self) -> list[str]:
        """Federated jobs not yet finished."""
        return sorted(texts(self._redis.smembers(self._keys.federated_active())))

    def due(self) -> list[str]:
        """Federated jobs to advance without an event: one not started yet (the message that
        was to start it may be lost), one an operator asked to cancel, an open round past its
        deadline, or a job waiting for devices or tables (the reaper advances them)."""
        k, jobs, now = self._keys, self.active(), utc_now()
        if not jobs:
            return []
        with self._redis.pipeline(transaction=False) as p:
            for job_id in jobs:
                p.get(k.federated_state(job_id))
                p.exists(k.federated_cancel(job_id))
            read = p.execute()
        due = []
        for job_id, raw, cancel in zip(jobs, read[::2], read[1::2]):
            state = FederatedState.model_validate_json(raw) if raw else None
            overdue = state is not None and state.phase == Phase.training and state.deadline_at is not None and now >= state.deadline_at
            if state is None or cancel or overdue or state.notice:
                due.append(job_id)
        return due

    def job_ids(self, limit: int = 100) -> list[str]:
        """The newest federated jobs first (some may have expired since)."""
        return texts(self._redis.zrevrange(self._keys.federated_jobs(), 0, limit - 1))

    def rounds(self, job_id: str, first: int = 0) -> list[RoundRecord]:
        """The rounds aggregated so far, in order, from the `first` (0: round 1)."""
        return [RoundRecord.model_validate_json(r) for r in self._redis.lrange(self._keys.federated_rounds(job_id), first, -1)]

    def updates(self, job_id: str, state: FederatedState) -> tuple[dict[str, LocalUpdate], list[str]]:
        """The updates the state accepted in its round (buffered: in the buffer being
        aggregated), by key (the device; buffered: the device and its work), and the keys of
        the other entries: an entry the state did not accept (its digest is not the one the
        state holds: written beside `apply`) is never aggregated. Buffered, the updates the
        job accepted for its next buffers (by `state` or since) are neither."""
        taken = state.aggregating if state.buffered else state.received
        raw = {str(text(d)): u for d, u in self._redis.hgetall(self._updates_key(job_id, state, state.round)).items()}
        if state.buffered:  # the buffer filling meanwhile is not this aggregation's, nor a stray entry
            now = self.state(job_id)  # read after the entries: an update accepted since `state` was read is in it
            filling = {*state.received, *(now.received if now else {}), *(now.aggregating if now else {})} - set(taken)
            raw = {key: value for key, value in raw.items() if key not in filling}
        accepted = {}
        for key, value in raw.items():
            if key in taken and _digest_of(value) == taken[key]:
                accepted[key] = LocalUpdate.model_validate_json(value)
        return accepted, sorted(set(raw) - set(accepted))

    def models_to_delete(self, job_id: str) -> list[str]:
        """The job's models that nothing reads any more: those it keeps track of (its global
        models; once it ended, the updates it did not aggregate) but the ones its state needs
        (`FederatedState.models_needed`), read together; none once the state expired."""
        k = self._keys
        with self._redis.pipeline() as p:
            p.smembers(k.federated_artifacts(job_id))
            p.get(k.federated_state(job_id))
            members, raw = p.execute()
        if raw is None:
            return []
        return sorted(set(texts(members)) - FederatedState.model_validate_json(raw).models_needed())

    def models_deleted(self, job_id: str, weights: Sequence[str]) -> None:
        """Stop keeping track of the job's models `weights` (their files are deleted)."""
        if weights:
            self._redis.srem(self._keys.federated_artifacts(job_id), *weights)

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's event log, oldest first."""
        return [JobEvent.model_validate_json(e) for e in self._redis.lrange(self._keys.federated_events(job_id), 0, -1)]
