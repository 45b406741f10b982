"""The reaper: hands on the tasks whose process is gone, sends again a dispatched fine-tune that
has no task anywhere, and wakes the jobs of devices that stopped heartbeating, and once more
when they are heard from again. It runs as a thread of every control worker; each lost task
is handed on by exactly one of them.

A lost task (its lease not renewed for `lease_ttl_s`) is handed on at once, instead of after
the broker's visibility timeout:
- `profile_device`: its claim on the table is released and the jobs waiting on the table
  re-plan (onto another device of that type, or the same one once it is back);
- `finetune`: its part lets the attempt go first (so the restarted device can start a new
  one), then its unacknowledged message goes back to the device's queue, and the fine-tune
  resumes from its checkpoint;
- every other task: its message goes back to its queue, for any server worker.
The lease is removed last, so a control worker that dies midway leaves it for the next pass.
A control worker's own tasks (the job steps) hold no lease: the messages an instance of it took
and did not acknowledge go back to their queue once it stops heartbeating for `lease_ttl_s`, or
at once when its node heartbeats from a new process (tasks/held_messages.py); a step a live
instance holds for longer than twice a step's time limit (its pool process never began it)
goes back too.

A dispatched fine-tune that, for longer than a lease, nothing runs (no lease) and whose
message does not wait on its device's queue is sent on: its message, when a worker took it
and never acknowledged it (a crash lost the hand-on), goes back to the queue; else it is
sent again under the same task id. So is a profile, an estimation or a proxy run of the
ledger of sent tasks (common/store/ledger.py): Redis can lose a message that a worker popped
just before Redis died.

Jobs waiting on a table or vector that nobody claims (its claim expired) are woken, to plan
again."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

import redis
from celery import Celery
from typing_extensions import override

from edgetrain.common.jobs.events import AttemptLost, Redispatched, Refused
from edgetrain.common.jobs.state import DISPATCHED, EventKind
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.payloads import ProfileRequest, ProxyRunRequest, profile_resource
from edgetrain.common.settings import Settings
from edgetrain.common.store import JobNotFoundError, Lease, Store, token_job

from . import held_messages
from .contract import CONTROL_QUEUE, HANDED_ON, TaskName, device_queue, queue_role, send, send_again, wake_ups
from .held_messages import TaskMessage
from .store_failover import note_failover

logger = logging.getLogger(__name__)
RECHECK_BATCH = 500  # dispatched fine-tunes looked at per pass, at most


def restore_message(app: Celery, task_id: str) -> bool:
    """Put the unacknowledged broker message of `task_id` back at the head of its queue
    (kombu's own restore, as the visibility timeout would); False if it is not unacknowledged."""
    return bool(_restore_unacked(app, {task_id}))


def _queued(app: Celery, queues: set[str], task_ids: set[str]) -> set[str]:
    """Those of `task_ids` with a message waiting on one of `queues` (one round trip)."""
    with app.connection_for_write() as connection, connection.default_channel.client.pipeline(transaction=False) as p:
        for queue in queues:
            p.lrange(queue, 0, -1)
        return held_messages.waiting([raw for raws in p.execute() for raw in raws], task_ids)


def _restore_unacked(app: Celery, task_ids: set[str]) -> set[str]:
    """Put back on their queues the unacknowledged messages of `task_ids`; returns those found."""
    return {message.task_id for message in held_messages.restore(app, task_ids=task_ids)}


def _release_profile(store: Store, app: Celery, lease: Lease) -> str:
    request = ProfileRequest.model_validate(lease.payload)
    resource = profile_resource(request)
    woken = store.coordination.settle(resource, wake_ups, owner=request.owner)
    if woken is None:
        return "its claim had already moved on"
    for sent in woken:
        send_again(app, sent)
    return "its claim on the table was released; the jobs waiting on it plan again"


def _job_of(store: Store, lease: Lease) -> str | None:
    """The job a lost task served: named in its payload, or, for a proxy run, the job that
    claimed the relation vector."""
    if lease.job_id or lease.task != TaskName.train_proxy.value or not lease.payload:
        return lease.job_id
    holder = store.coordination.holder(vector_resource(vector_key(ProxyRunRequest.model_validate(lease.payload).request)))
    return token_job(holder) if holder else None


def _let_attempt_go(store: Store, job_id: str, device_id: str, attempt: str, outcome: str) -> None:
    try:
        store.jobs.apply(job_id, device_id, AttemptLost(attempt=attempt, outcome=outcome))
    except (Refused, JobNotFoundError) as exc:
        logger.info("%s/%s: the lost attempt was let go already: %s", job_id, device_id, exc)


def hand_on(store: Store, app: Celery, settings: Settings, lease: Lease) -> bool:
    """Hand a lost task on (see the module docstring) and say so in its job's events; False
    when another control worker did, a new run of the task holds the lease now, or its process
    renewed it since the leases were listed (a network blip over many devices: the pass is long)."""
    if not store.liveness.still_expired(lease.task_id, settings.lease_ttl_s):
        return False
    job_id = _job_of(store, lease)
    fine_tune = lease.task == TaskName.finetune.value and job_id and lease.device_id
    if fine_tune:
        assert job_id is not None and lease.device_id is not None
        _let_attempt_go(store, job_id, lease.device_id, lease.attempt, "its task is handed on")
    if lease.task == TaskName.profile_device.value and lease.payload:
        outcome = _release_profile(store, app, lease)
    elif restore_message(app, lease.task_id):
        outcome = "re-queued"
    else:
        outcome = "its message was already handled"
    # an idle worker may take the message put back, and its run the lease, before the lease is
    # reaped: the hand-on is this pass's all the same (only one pass puts the message back)
    if not store.liveness.reap(lease) and outcome != "re-queued":
        return False
    store.monitoring.count(HANDED_ON, queue_role(lease.queue))
    message = f"the worker running {lease.task.removeprefix('edgetrain.')} ({lease.node}) stopped; {outcome}"
    logger.warning("task %s: %s", lease.task_id, message)
    if job_id and not fine_tune:  # a fine-tune's part logged it when it let the attempt go
        store.jobs.event(job_id, EventKind.attempt_lost, message, lease.device_id)
    if job_id:
        _advance(store, app, job_id, lease.device_id)
    return True


def restore_gone_consumers(store: Store, app: Celery, settings: Settings) -> list[TaskMessage]:
    """Put back on their queues the messages that control worker instances took and never
    acknowledged, once an instance has not heartbeated for `lease_ttl_s` or its node heartbeats
    from another process (tasks/held_messages.py). Returns them."""
    restored = []
    for instance in store.liveness.gone(store.liveness.consumers(), settings.lease_ttl_s):
        restored += _requeue_held(store, app, instance, "stopped")
        store.liveness.forget_consumer(instance)
    return restored


def restore_stuck_steps(store: Store, app: Celery, settings: Settings) -> list[TaskMessage]:
    """Put back on their queues the steps a live control worker instance has held for longer
    than a step can take: twice its hard time limit (one waiting for a pool process, one
    running) and a lease for the hosts' clocks. Such a step went to a pool process that never
    began it (stopped while idle, say), where no time limit runs and only kombu's visibility
    timeout, hours away, would free it; a step run twice does no harm. Returns them."""
    before = time.time() - 2 * settings.control_time_limit_s - settings.lease_ttl_s  # kombu notes a take in time.time()
    restored = []
    for instance in held_messages.overdue(app, store.liveness.consumers(), before):
        restored += _requeue_held(store, app, instance, "holds it unstarted past twice a step's time limit", before)
    return restored


def _requeue_held(store: Store, app: Celery, instance: str, why: str, taken_before: float | None = None) -> list[TaskMessage]:
    """`held_messages.restore` the messages control worker `instance` holds (those taken before
    `taken_before`, s since the epoch, when given), each counted as handed on and logged with `why`."""
    restored = held_messages.restore(app, instance, taken_before=taken_before)
    for message in restored:
        store.monitoring.count(HANDED_ON, queue_role(message.queue))
        logger.warning("task %s (%s): the worker %s %s; re-queued", message.task_id, message.task, instance, why)
    return restored


def redispatch_orphans(store: Store, app: Celery, settings: Settings) -> list[tuple[str, str]]:
    """Send on the dispatched fine-tunes that nothing has run for longer than a lease and that
    do not wait on their queue (see the module docstring). Returns their (job, device)."""
    from .workflow import dispatch_fine_tune

    now = store.liveness.now()
    listed = store.jobs.dispatched_since(now - settings.lease_ttl_s, RECHECK_BATCH)
    parts = store.jobs.parts_at(listed)
    tokens = {key: p.dispatch.token for key, p in parts.items() if p.state in DISPATCHED and p.dispatch is not None}
    missing = _unheld(store, app, {token: device_queue(device_id) for (_, device_id), token in tokens.items()})
    orphans = [(key, token) for key, token in tokens.items() if token in missing]
    for (job_id, device_id), _ in orphans:
        part = parts[(job_id, device_id)]
        if part.attempt is not None:  # its lease vanished without a hand-on
            _let_attempt_go(store, job_id, device_id, part.attempt.token, "its lease vanished")
    restored = _restore_unacked(app, missing) if missing else set()
    for (job_id, device_id), token in orphans:
        outcome = "its unacknowledged message was put back on the queue" if token in restored else "it was sent again"
        try:
            seen = parts[(job_id, device_id)].dispatch
            assert seen is not None
            store.jobs.apply(job_id, device_id, Redispatched(token=token, outcome=outcome, seen_at=seen.at))
        except (Refused, JobNotFoundError):
            continue
        if token not in restored:
            part = parts[(job_id, device_id)]
            assert part.dispatch is not None
            dispatch_fine_tune(token, part.dispatch.request, part.control)
        logger.warning("fine-tune %s/%s (task %s) ran nowhere: %s", job_id, device_id, token, outcome)
    store.jobs.seen_dispatched(listed, now)
    return [key for key, _ in orphans]


def _unheld(store: Store, app: Celery, queues: dict[str, str]) -> set[str]:
    """Those of the tasks (task id -> its queue) that no process runs (no lease) and whose
    message does not wait on their queue."""
    missing = set(queues) - store.liveness.held(list(queues))
    if any(queues[t] == CONTROL_QUEUE for t in missing):  # a control worker's steps hold no lease
        missing -= held_messages.held_ids(app, store.liveness.consumers())
    return missing - _queued(app, {queues[t] for t in missing}, missing) if missing else missing


def resend_lost(store: Store, app: Celery, settings: Settings) -> list[str]:
    """Send on the tasks of the ledger of sent tasks (a profile, an estimation, a proxy run)
    that nothing has run for longer than a lease and that do not wait on their queue: the
    unacknowledged message of one a worker took goes back to its queue, one that Redis lost is
    sent again under its task id. Returns their task ids."""
    now = store.liveness.now()
    listed = store.ledger.unseen_since(now - settings.lease_ttl_s, RECHECK_BATCH)
    missing = _unheld(store, app, {t.task_id: t.queue for t in listed})
    restored = _restore_unacked(app, missing) if missing else set()
    for sent in listed:
        if sent.task_id in missing - restored:
            send_again(app, sent)
        if sent.task_id in missing:
            how = "its unacknowledged message was put back on the queue" if sent.task_id in restored else "it was sent again"
            logger.warning("%s (task %s) ran nowhere for %g s: %s", sent.task, sent.task_id, settings.lease_ttl_s, how)
    store.ledger.seen([t.task_id for t in listed], now)
    return sorted(missing)


def wake_unclaimed(store: Store, app: Celery, settings: Settings) -> list[str]:
    """Wake the jobs waiting on a table or vector that nobody claims (its claim expired, or its
    producer stopped after it released the claim and before it woke them): they plan again. A
    resource is looked at once a lease at most, so its waiters are woken once a lease at most.
    Returns the jobs woken."""
    now = store.liveness.now()
    woken = store.coordination.wake_unclaimed(now - settings.lease_ttl_s, now, RECHECK_BATCH, wake_ups)
    for sent in woken:
        send_again(app, sent)
    if woken:
        logger.warning("woke %d job(s) waiting on a table or vector nobody produces", len(woken))
    return [str(sent.payload) for sent in woken]


def start_unplanned(store: Store, app: Celery, settings: Settings) -> list[str]:
    """Send the first step again of jobs submitted more than a lease ago that no control worker
    took up (Redis lost the message that was to start them); each at most once a lease."""
    now = store.liveness.now()
    jobs = store.jobs.unplanned(now - settings.lease_ttl_s, RECHECK_BATCH)
    for job_id in jobs:
        send(app, TaskName.advance_job, job_id)
    store.jobs.remind(jobs, now)
    return jobs


def _advance(store: Store, app: Celery, job_id: str, device_id: str | None) -> None:
    """Advance the page of the job that holds `device_id` (the whole job without a device)."""
    from .workflow import advance_device

    if device_id is not None:
        advance_device(job_id, device_id)
    elif store.jobs.record(job_id) is not None:
        send(app, TaskName.advance_job, job_id)


def reap_once(store: Store, app: Celery, settings: Settings, silent_before: frozenset[str] = frozenset()) -> frozenset[str]:
    """One pass: note a failover of the store (behind Sentinel); hand on lost tasks; send again
    dispatched fine-tunes that nothing holds; advance the jobs of devices that stopped
    heartbeating, and of those in `silent_before` (the previous pass's answer) that are heard
    from again, so their parts drop the notice that the device is missing; advance the jobs
    waiting for a device that had not registered, once it has or their grace is over; wake the
    jobs waiting on a table or vector nobody produces. Returns the devices silent now. A step
    that fails on anything but Redis is logged and the pass goes on with the next, so one bad
    record or message cannot stop the others pass after pass."""
    note_failover(store)
    _guarded("putting back the messages of stopped control workers", lambda: restore_gone_consumers(store, app, settings))
    _guarded("putting back the steps held unstarted", lambda: restore_stuck_steps(store, app, settings))
    for lease in store.liveness.expired(settings.lease_ttl_s):
        _guarded(f"handing on task {lease.task_id}", functools.partial(hand_on, store, app, settings, lease))
    _guarded("sending on orphaned fine-tunes", lambda: redispatch_orphans(store, app, settings))
    _guarded("sending on lost tasks", lambda: resend_lost(store, app, settings))
    _guarded("waking jobs waiting on what nobody produces", lambda: wake_unclaimed(store, app, settings))
    _guarded("starting unplanned jobs", lambda: start_unplanned(store, app, settings))
    for job_id in store.federated.due():
        send(app, TaskName.federated_advance, job_id)
    silent = frozenset(store.fleet.silent_since(settings.heartbeat_ttl_s))
    for device_id in sorted(silent | silent_before | set(store.fleet.take_awaited())):
        for job_id in store.jobs.device_jobs(device_id):
            _advance(store, app, job_id, device_id)
    return silent


def _guarded(what: str, step: Callable[[], object]) -> None:
    """Run one step of a pass; Redis errors stop the pass (tried again next period), any other
    error is logged and the pass goes on."""
    try:
        step()
    except redis.RedisError:
        raise
    except Exception:
        logger.exception("reaper: %s failed; the pass goes on", what)


class Reaper(threading.Thread):
    """Runs `reap_once` every `settings.reaper_interval_s` seconds until stopped."""

    def __init__(self, store: Store, app: Celery, settings: Settings):
        super().__init__(name="edgetrain-reaper", daemon=True)
        self.store, self.app, self.settings = store, app, settings
        self.stopped = threading.Event()

    @override
    def run(self) -> None:
        silent: frozenset[str] = frozenset()
        while not self.stopped.wait(self.settings.reaper_interval_s):
            try:
                silent = reap_once(self.store, self.app, self.settings, silent)
            except Exception:  # Redis restarting, or a bug: log it and try again next period
                logger.exception("reaper pass failed")

    def stop(self) -> None:
        """Stop after the current pass."""
        self.stopped.set()
