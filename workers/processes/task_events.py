"""Task events only while something follows them. A control worker runs a task per step of
every job, and each task's events (received, started, succeeded: their encoding and three
PUBLISHes, about a fifth of the worker's main process per paced job) are read only by Flower
or `celery events`. At each heartbeat the control worker looks at the receivers bound to
Celery's event exchange (kombu's bindings; Flower binds `#`, a worker's gossip only
`worker.#`) and sends task events while one of them takes them; worker events always."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from celery.signals import worker_ready

from edgetrain.common.store import Store

TASK_EVENTS_KEY = "task.multi"  # the routing key of a worker's batched task events
WORKER_GROUPS = {"worker"}  # the event groups sent while no one follows task events


def follows_task_events(routing_keys: list[str]) -> bool:
    """Whether a receiver bound with one of `routing_keys` (AMQP topic patterns) takes task events."""
    return any(fnmatchcase(TASK_EVENTS_KEY, key.replace("#", "*")) for key in routing_keys)


class TaskEventsGate:
    """Turns this worker's task events on and off (`update`, from its heartbeat)."""

    def __init__(self, store: Store):
        self.store, self.consumer = store, None
        worker_ready.connect(self._ready, weak=False)

    def _ready(self, sender: Any = None, **_: Any) -> None:
        self.consumer = sender

    def update(self) -> None:
        """Send task events from now on if a receiver takes them, else none."""
        dispatcher = getattr(self.consumer, "event_dispatcher", None)  # made again when the broker connection is
        if dispatcher is not None:
            dispatcher.groups = None if follows_task_events(self.store.monitoring.event_routing_keys()) else WORKER_GROUPS
