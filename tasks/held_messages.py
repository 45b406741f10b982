"""The messages a control worker has taken and not yet acknowledged, noted under keys of that
worker instance's own: kombu's hash and index of unacknowledged messages, one pair per
instance (node:pid of its main process), instead of the pair the other workers share.

So a control task needs no lease (four Redis commands to take one and five to release it, per
job step): when the instance stops heartbeating, or its node heartbeats from another process
(started again), the reaper (tasks/reaper.py) puts exactly that instance's messages back at the
head of their queues. A pool process lost, or past its hard time limit, while its worker lives
is Celery's to requeue (`task_reject_on_worker_lost`, and CONTROL_TASK_OPTIONS); a step handed
to a pool process that never begins it (stopped while idle) is the reaper's again, once held
for twice a step's time limit (`overdue`). The tasks of the ledger of sent tasks that a control
worker runs (wake-ups, a big job's pages) are struck off once run, as a lease's release does
elsewhere, and count as held while a live instance holds their message. The reaper reads and
restores the other workers' unacknowledged messages, under kombu's shared keys, here too."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.signals import task_postrun
from kombu.transport import redis as kombu_redis

from .context import store
from .contract import tracked

CONTROL_TASK_OPTIONS = {"acks_on_timeout": False}  # past its hard time limit a step goes back to its queue, to run again


def transport_options(instance: str) -> dict[str, str]:
    """kombu's transport options that keep the unacknowledged messages of `instance` apart."""
    return {"unacked_key": f"unacked:{instance}", "unacked_index_key": f"unacked_index:{instance}",
            "unacked_mutex_key": f"unacked_mutex:{instance}"}  # fmt: skip


def keep_apart(app: Celery, instance: str) -> None:
    """Make the worker `app` (before it starts consuming) note the messages it takes under
    `instance`'s own keys."""
    app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}), **transport_options(instance)}


@dataclass(frozen=True)
class TaskMessage:
    """A task's broker message: its task, its id and, for an unacknowledged one, its queue."""

    task: str
    task_id: str
    queue: str | None = None


def task_message(raw: bytes | str, unacked: bool = False) -> TaskMessage | None:
    """A message waiting on a queue, or an entry of kombu's hash of unacknowledged messages
    (`unacked`: [message, exchange, routing key]); None for anything else (a malformed message,
    which a worker drops when it takes it, is no reason to stop the reaper's pass)."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    queue = None
    if unacked:
        if not (isinstance(message, list) and len(message) == 3):
            return None
        message, _, queue = message
    headers = message.get("headers") if isinstance(message, dict) else None
    if not isinstance(headers, dict) or not isinstance(task_id := headers.get("id"), str):
        return None
    return TaskMessage(str(headers.get("task", "?")), task_id, None if queue is None else str(queue))


_HEADER_ID = re.compile(rb'"id":\s*"([^"\\]*)"')  # a message's task id as kombu's JSON writes it (its body is base64)


def waiting(raws: list[bytes], task_ids: set[str]) -> set[str]:
    """Those of `task_ids` whose message is among `raws` (messages waiting on a queue). Only a
    message that names one of them, or whose id cannot be read without parsing it, is parsed
    whole: a device's queue can hold thousands of fine-tunes that the reaper looks through."""
    wanted = {t.encode() for t in task_ids}
    found = set()
    for raw in raws:
        named = _HEADER_ID.findall(raw)
        if (not named or wanted.intersection(named)) and (m := task_message(raw)) and m.task_id in task_ids:
            found.add(m.task_id)
    return found


def restore(
    app: Celery, instance: str | None = None, task_ids: set[str] | None = None, taken_before: float | None = None
) -> list[TaskMessage]:
    """Put the messages `instance` took and did not acknowledge (None: any server or device
    worker, whose share kombu's default keys) back at the head of their queues, only those of
    `task_ids` when given, and only those taken before `taken_before` (s since the epoch, as
    kombu notes it) when given; kombu's own restore, each in one transaction, so two control
    workers doing it at once put each message back once. Returns them."""
    restored = []
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        qos = kombu_redis.QoS(channel)
        if instance is not None:
            keys = transport_options(instance)
            qos.unacked_key, qos.unacked_index_key = keys["unacked_key"], keys["unacked_index_key"]
        if taken_before is None:
            held = channel.client.hgetall(qos.unacked_key)
        elif tags := channel.client.zrangebyscore(qos.unacked_index_key, "-inf", taken_before):
            held = {tag: raw for tag, raw in zip(tags, channel.client.hmget(qos.unacked_key, tags)) if raw is not None}
        else:
            held = {}
        for tag, raw in held.items():
            message = task_message(raw, unacked=True)
            if task_ids is None or (message is not None and message.task_id in task_ids):
                qos.restore_by_tag(tag)
                restored.append(message or TaskMessage("?", "?"))
    return restored


def held_ids(app: Celery, instances: list[str]) -> set[str]:
    """The task ids of the messages `instances` took and have not acknowledged (running, or
    waiting in their pool)."""
    with app.connection_for_write() as connection, connection.default_channel.client.pipeline(transaction=False) as p:
        for instance in instances:
            p.hvals(transport_options(instance)["unacked_key"])
        return {message.task_id for raws in p.execute() for raw in raws if (message := task_message(raw, unacked=True))}


def overdue(app: Celery, instances: list[str], taken_before: float) -> list[str]:
    """Those of `instances` that hold a message they took before `taken_before` (s since the
    epoch, as kombu notes it), in one round trip."""
    if not instances:
        return []
    with app.pool.acquire(block=True) as connection, connection.default_channel.client.pipeline(transaction=False) as p:
        for instance in instances:
            p.zcount(transport_options(instance)["unacked_index_key"], "-inf", taken_before)
        return [instance for instance, count in zip(instances, p.execute()) if count]


def _ran(task_id: str, **_: Any) -> None:
    """task_postrun: a task of the ledger of sent tasks (a wake-up, a page) has run: strike it
    off, as a lease's release does on the other workers."""
    if tracked(task_id):
        store().ledger.done(task_id)


def strike_off_when_run() -> None:
    """Strike the tasks of the ledger this worker process runs off it once they have run."""
    task_postrun.connect(_ran, weak=False, dispatch_uid="edgetrain-ledger-done")
