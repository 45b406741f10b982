"""Read the tasks waiting in a Redis broker queue, as Celery's Redis transport stores them
(a list named after the queue of JSON messages with a base64 body [args, kwargs, embed])."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class QueuedTask:
    """A task message waiting in a queue."""

    name: str
    args: list[Any]
    id: str = ""
    result_stored: bool = True  # False: the sender asked the worker not to store its result

    @property
    def payload(self) -> Any:
        """The single argument edgetrain's tasks take."""
        return self.args[0]


def queued_tasks(client: redis.Redis, queue: str) -> list[QueuedTask]:
    """The tasks waiting in `queue`, oldest first."""
    tasks = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # kombu pushes to the head, pops from the tail
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        headers = message["headers"]
        tasks.append(QueuedTask(headers["task"], args, headers["id"], not headers.get("ignore_result", False)))
    return tasks
