"""Federated jobs in Redis: the record, the state and each round's updates.

The state changes only in `change`, a WATCH/MULTI transaction: an update is accepted only
while its round is open and assigns its device (once), and closing a round fixes the updates
it aggregates in the same transaction, so a late update is refused and nothing is aggregated
twice, whichever worker races which."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import redis
from redis.client import Pipeline

from ..federated.records import FINAL, FederatedRecord, FederatedState, LocalUpdate, RoundRecord
from ..jobs import EventKind, JobEvent
from ..keys import Keys
from ..limits import MAX_EVENTS_KEPT
from ..schemas import utc_now
from .connection import text, texts


class Refused(Exception):
    """A change that does not apply to the federated job as it is now."""


class Accepted(str, Enum):
    """What became of a device's update."""

    accepted = "accepted"
    late = "late"  # its round closed (or the job finished): discarded
    duplicate = "duplicate"  # the device's update of that round is already in
    not_assigned = "not_assigned"  # the round does not assign the device (a forged or stale task)


Decide = Callable[[FederatedState, Pipeline], FederatedState]


class FederatedStore:
    """Federated job records, their state, rounds and rounds' updates; a finished job expires
    `retention_s` seconds after it finished (None: kept)."""

    def __init__(self, client: redis.Redis, keys: Keys, retention_s: float | None = None):
        self._redis, self._keys, self.retention_s = client, keys, retention_s

    def create(self, record: FederatedRecord) -> None:
        """Store a new federated job and its starting state (before round 1)."""
        k, job_id = self._keys, record.job_id
        with self._redis.pipeline() as p:
            p.set(k.federated(job_id), record.model_dump_json())
            p.set(k.federated_state(job_id), FederatedState(global_weights=record.spec.weights).model_dump_json())
            p.zadd(k.federated_jobs(), {job_id: record.created_at.timestamp()})
            p.sadd(k.federated_active(), job_id)
            p.rpush(k.federated_events(job_id), JobEvent(kind=EventKind.submitted, message="federated job submitted").model_dump_json())
            p.execute()

    def record(self, job_id: str) -> FederatedRecord | None:
        """The job as submitted; None for an unknown id."""
        raw = self._redis.get(self._keys.federated(job_id))
        return FederatedRecord.model_validate_json(raw) if raw else None

    def state(self, job_id: str) -> FederatedState | None:
        """Where the job is now; None for an unknown id."""
        raw = self._redis.get(self._keys.federated_state(job_id))
        return FederatedState.model_validate_json(raw) if raw else None

    def active(self) -> list[str]:
        """Federated jobs not yet finished."""
        return sorted(texts(self._redis.smembers(self._keys.federated_active())))

    def due(self) -> list[str]:
        """Federated jobs to advance without an event: an open round past its deadline, or a
        job waiting for devices or tables (the reaper advances them)."""
        now, due = utc_now(), []
        for job_id in self.active():
            state = self.state(job_id)
            if state is not None and (state.notice or (state.phase == "training" and state.deadline_at and now >= state.deadline_at)):
                due.append(job_id)
        return due

    def job_ids(self, limit: int = 100) -> list[str]:
        """The newest federated jobs first (some may have expired since)."""
        return texts(self._redis.zrevrange(self._keys.federated_jobs(), 0, limit - 1))

    def rounds(self, job_id: str, first: int = 0) -> list[RoundRecord]:
        """The rounds aggregated so far, in order, from the `first` (0: round 1)."""
        return [RoundRecord.model_validate_json(r) for r in self._redis.lrange(self._keys.federated_rounds(job_id), first, -1)]

    def updates(self, job_id: str, round_number: int) -> dict[str, LocalUpdate]:
        """The updates of a round that were accepted, by device."""
        raw = self._redis.hgetall(self._keys.federated_round(job_id, round_number))
        return {str(text(d)): LocalUpdate.model_validate_json(u) for d, u in raw.items()}

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's event log, oldest first."""
        return [JobEvent.model_validate_json(e) for e in self._redis.lrange(self._keys.federated_events(job_id), 0, -1)]

    def event(self, job_id: str, kind: EventKind, message: str, device_id: str | None = None) -> None:
        """Log an event of the job."""
        self._push_event(self._redis, job_id, JobEvent(kind=kind, message=message, device_id=device_id))

    def _push_event(self, p: redis.Redis | Pipeline, job_id: str, event: JobEvent) -> None:
        key = self._keys.federated_events(job_id)
        p.rpush(key, event.model_dump_json())
        p.ltrim(key, -MAX_EVENTS_KEPT, -1)

    def change(self, job_id: str, decide: Decide, event: JobEvent | None = None, watching: tuple[str, ...] = (),
               write_state: bool = True) -> FederatedState:  # fmt: skip
        """Apply `decide` (the state now -> the new state, or Refused; it may read the keys of
        `watching` and queue more writes on the pipeline, which run in the same transaction) and
        log `event`; returns the new state. `write_state` False: `decide` only queues writes
        of other keys (the state is left as it is)."""
        k = self._keys
        with self._redis.pipeline() as p:
            while True:
                try:
                    p.watch(k.federated_state(job_id), *watching)
                    raw = p.get(k.federated_state(job_id))
                    if raw is None:
                        raise Refused(f"no federated job {job_id}")
                    state = FederatedState.model_validate_json(raw)
                    p.multi()
                    new = decide(state, p)
                    if write_state:
                        new = new.model_copy(update={"updated_at": utc_now()})
                        p.set(k.federated_state(job_id), new.model_dump_json())
                    if new.phase in FINAL:
                        p.srem(k.federated_active(), job_id)
                        for key in (k.federated(job_id), k.federated_state(job_id), k.federated_rounds(job_id), k.federated_events(job_id)):
                            if self.retention_s is not None:
                                p.expire(key, int(self.retention_s))
                    if event is not None:
                        self._push_event(p, job_id, event)
                    p.execute()
                    return new
                except redis.WatchError:
                    continue

    def submit(self, update: LocalUpdate) -> Accepted:
        """Add a device's update to its round: only while that round is open, assigns the device
        and has no update of it yet."""
        key = self._keys.federated_round(update.job_id, update.round)
        outcome = Accepted.accepted

        def decide(state: FederatedState, p: Pipeline) -> FederatedState:
            nonlocal outcome
            if state.round != update.round or state.phase != "training":
                outcome = Accepted.late
            elif state.assigned(update.device_id) is None:
                outcome = Accepted.not_assigned
            elif self._redis.hexists(key, update.device_id):
                outcome = Accepted.duplicate
            else:
                outcome = Accepted.accepted
                p.hset(key, update.device_id, update.model_dump_json())
            return state

        self.change(update.job_id, decide, watching=(key,), write_state=False)
        return outcome

    def close_round(self, job_id: str, round_number: int, also: Callable[[Pipeline], None] = lambda _: None) -> FederatedState:
        """Close the open round `round_number` with the updates in now (Refused if it is not
        open); `also` queues writes that must happen with it (the aggregation, in the ledger)."""
        key = self._keys.federated_round(job_id, round_number)

        def decide(state: FederatedState, p: Pipeline) -> FederatedState:
            if state.round != round_number or state.phase != "training":
                raise Refused(f"round {round_number} is not open (round {state.round}, {state.phase})")
            also(p)
            arrived = sorted(texts(self._redis.hkeys(key)))
            return state.model_copy(update={"phase": "aggregating", "closed_with": arrived, "deadline_at": None})

        return self.change(job_id, decide, watching=(key,))

    def aggregated(self, job_id: str, done: RoundRecord, weights: str, event: JobEvent) -> FederatedState:
        """Record the aggregation of the closed round `done.round`: the new global weights
        (`weights`), their accuracy and the round (Refused when that round is not the one
        being aggregated: it was aggregated already)."""
        key = self._keys.federated_rounds(job_id)

        def decide(now: FederatedState, p: Pipeline) -> FederatedState:
            if now.phase != "aggregating" or now.round != done.round:
                raise Refused(f"round {done.round} is not being aggregated (round {now.round}, {now.phase})")
            p.rpush(key, done.model_dump_json())
            empty = 0 if done.devices else now.empty_rounds + 1
            return now.model_copy(update={
                "phase": "aggregated", "global_weights": weights, "accuracy": done.accuracy, "elapsed_s": done.elapsed_s,
                "empty_rounds": empty, "assignments": [], "closed_with": [],
            })  # fmt: skip

        return self.change(job_id, decide, event)

    def drop_round(self, job_id: str, round_number: int) -> None:
        """Forget a round's updates once it is aggregated."""
        self._redis.delete(self._keys.federated_round(job_id, round_number))
