"""The messages a control worker has taken and not yet acknowledged, noted under keys of that
worker instance's own: kombu's hash and index of unacknowledged messages, one pair per
instance (node:pid of its main process), instead of the pair the other workers share.

So a control task needs no lease (four Redis commands to take one and five to release it, per
job step): when the instance stops heartbeating, or its node heartbeats from another process
(started again), the reaper (tasks/reaper.py) puts exactly that instance's messages back at the
head of their queues. A pool process lost, or past its hard time limit, while its worker lives
is Celery's to requeue (`task_reject_on_worker_lost`, and CONTROL_TASK_OPTIONS). The tasks of
the ledger of sent tasks that a control worker runs (wake-ups, a big job's pages) are struck off
once run, as a lease's release does elsewhere, and count as held while a live instance holds
their message."""

from __future__ import annotations

import json
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
class Restored:
    """A message put back on its queue."""

    task: str
    task_id: str
    queue: str


def _restored(raw: bytes | str) -> Restored:
    """What an entry of kombu's unacknowledged hash ([message, exchange, routing key]) was."""
    try:
        message, _, queue = json.loads(raw)
        headers = message.get("headers") or {}
        return Restored(str(headers.get("task", "?")), str(headers.get("id", "?")), str(queue))
    except (ValueError, TypeError, AttributeError):
        return Restored("?", "?", "?")


def restore(app: Celery, instance: str) -> list[Restored]:
    """Put every message `instance` took and did not acknowledge back at the head of its queue
    (kombu's own restore, each in one transaction, so two control workers doing it at once put
    each message back once)."""
    keys = transport_options(instance)
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        qos = kombu_redis.QoS(channel)
        qos.unacked_key, qos.unacked_index_key = keys["unacked_key"], keys["unacked_index_key"]
        held = channel.client.hgetall(qos.unacked_key)
        for tag in held:
            qos.restore_by_tag(tag)
    return [_restored(raw) for raw in held.values()]


def held_ids(app: Celery, instances: list[str]) -> set[str]:
    """The task ids of the messages `instances` took and have not acknowledged (running, or
    waiting in their pool)."""
    with app.connection_for_write() as connection, connection.default_channel.client.pipeline(transaction=False) as p:
        for instance in instances:
            p.hvals(transport_options(instance)["unacked_key"])
        return {_restored(raw).task_id for raws in p.execute() for raw in raws}


def _ran(task_id: str, **_: Any) -> None:
    """task_postrun: a task of the ledger of sent tasks (a wake-up, a page) has run: strike it
    off, as a lease's release does on the other workers."""
    if tracked(task_id):
        store().ledger.done(task_id)


def strike_off_when_run() -> None:
    """Strike the tasks of the ledger this worker process runs off it once they have run."""
    task_postrun.connect(_ran, weak=False, dispatch_uid="edgetrain-ledger-done")
