"""Task events only while something follows them. A control worker runs a task per step of
every job, and each task's events (received, started, succeeded: their encoding and three
PUBLISHes, about a fifth of the worker's main process per paced job) are read only by Flower
or `celery events`. As a task arrives, at most once a second, the control worker looks at the
receivers bound to Celery's event exchange (kombu's bindings; Flower binds `#`, a worker's
gossip only `worker.#`) and sends task events while one of them takes them; worker events
always."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any

import redis
from celery.signals import task_received

from edgetrain.common.store import Store

logger = logging.getLogger(__name__)

TASK_EVENTS_KEY = "task.multi"  # the routing key of a worker's batched task events
WORKER_GROUPS = {"worker"}  # the event groups sent while no one follows task events
CHECK_EVERY_S = 1.0


def follows_task_events(routing_keys: list[str]) -> bool:
    """Whether a receiver bound with one of `routing_keys` (AMQP topic patterns) takes task events."""
    return any(fnmatchcase(TASK_EVENTS_KEY, key.replace("#", "*")) for key in routing_keys)


class TaskEventsGate:
    """Turns this worker's task events on and off as its tasks arrive (Celery's `task_received`,
    sent by the consumer before the task's first event)."""

    def __init__(self, store: Store, every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.store, self.every_s, self.clock = store, every_s, clock
        self.checked_at = -float("inf")
        task_received.connect(self.received, weak=False)

    def received(self, sender: Any = None, **_: Any) -> None:
        """A task arrived at the consumer `sender`: look again if the last look is `every_s` old."""
        dispatcher = getattr(sender, "event_dispatcher", None)  # made again when the broker connection is
        if dispatcher is None or self.clock() - self.checked_at < self.every_s:
            return
        self.checked_at = self.clock()
        try:
            followed = follows_task_events(self.store.monitoring.event_routing_keys())
        except redis.RedisError as exc:  # Redis restarting: as it was until the next look
            logger.warning("cannot tell whether task events are followed: %s", exc)
            return
        dispatcher.groups = None if followed else WORKER_GROUPS
