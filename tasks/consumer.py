"""The task consumer of every edgetrain worker (Celery's `worker_consumer`): Celery's own, made
to survive what Redis hands it.

kombu's Redis transport pops a queue's item (BRPOP) and decodes it inside the worker's event
loop, and Celery lets what it raises end the worker: a list item that is not JSON, not a kombu
envelope, or a Celery message of the wrong shape stops it (celery/kombu#2421,
celery/celery#4308), and so does a full Redis (`noeviction`) refusing to record the popped
message as unacknowledged. Here:
- an item that kombu cannot make into a message is dropped where it is read, with an error
  in the log saying what was wrong (it is already off the queue, so it is never redelivered);
- a message that Celery fails to take (headers or body of the wrong shape) is acknowledged,
  so dropped, with the same error;
- a message that Redis has no room to record waits in the worker until it has, then runs.
An unknown task name and a body that does not decode are Celery's own cases (logged, dropped);
a payload that fails validation fails its task, logged and acknowledged."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from celery.worker import state
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import OperationalError
from kombu.message import Message
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from pydantic import BaseModel, ConfigDict
from vine import promise as vine_promise  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)
SHOWN_CHARS = 300  # of a dropped item, in the log
FULL_RETRY_S = 1.0
BROKER_ERRORS = (redis.RedisError, OSError, OperationalError)  # the connection's fault, not the message's


def _what(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc})"
    return f"not a message ({exc.__class__.__name__}: {exc})"


def drop_malformed_items(channel: Any) -> None:
    """Make `channel`'s BRPOP answer "nothing" for an item kombu cannot make into a message,
    logging why; kombu then waits for the next item (redis-py's response callback for BRPOP
    on the channel's own client)."""
    client = channel.client
    parse = client.response_callbacks.get("BRPOP")  # redis-py's: the reply as (queue, item), or None

    def checked(response: Any, **options: Any) -> Any:
        popped = parse(response, **options) if parse else response
        if not popped:
            return popped
        queue, item = popped
        try:
            delivery = channel.Message(loads(bytes_to_str(item)), channel=channel).delivery_info
            delivery["exchange"], delivery["routing_key"]  # noqa: B018 (what recording it as unacknowledged reads)
        except Exception as exc:
            logger.error("dropped a malformed message from queue %s: %s: %s", bytes_to_str(queue), _what(exc),
                         repr(item)[:SHOWN_CHARS])  # fmt: skip
            return None
        return popped

    client.set_response_callback("BRPOP", checked)


def _stopping() -> bool:
    return state.should_stop is not None or state.should_terminate is not None


def hold_while_full(channel: Any) -> None:
    """Make `channel` wait, instead of failing, while Redis is too full to record a popped
    message as unacknowledged (the message exists only in this process then); at shutdown
    the message is logged in full, since it cannot be put back."""
    qos = channel.qos
    append = qos.append

    def append_when_room(message: Message, delivery_tag: str) -> None:
        since = None
        while True:
            try:
                append(message, delivery_tag)
            except redis.exceptions.OutOfMemoryError:
                task = (message.headers or {}).get("task"), (message.headers or {}).get("id")
                if since is None:
                    since = time.monotonic()
                    logger.error("Redis is full: task %s[%s] waits in this worker until Redis has room "
                                 "(raise its maxmemory or free memory)", *task)  # fmt: skip
                if _stopping():
                    logger.error("stopping while Redis is full: task %s[%s] is lost; send it again: %s", *task,
                                 message.body)  # fmt: skip
                    raise
                time.sleep(FULL_RETRY_S)
                continue
            if since is not None:
                logger.warning("Redis has room again: task recorded after %.0f s", time.monotonic() - since)
            return

    qos.append = append_when_room


class TaskHeaders(BaseModel):
    """The headers of a task message (Celery's protocol 2) that the worker reads after taking
    it, outside the consumer's handler, where a value of the wrong type would stop it."""

    model_config = ConfigDict(extra="allow")

    id: str
    task: str
    shadow: str | None = None
    timelimit: tuple[float | None, float | None] | None = None
    retries: int = 0
    ignore_result: bool | None = None
    stamped_headers: list[str] | None = None
    stamps: dict[str, Any] | None = None


class Consumer(CeleryConsumer):
    """Celery's consumer, with the guards of this module on its task channel."""

    def create_task_handler(self, promise: Callable[..., Any] = vine_promise) -> Callable[[Message], None]:
        """Celery's handler of task messages (made each time the consumer (re)connects),
        dropping a message it fails on instead of stopping the worker."""
        channel = self.task_consumer.channel
        drop_malformed_items(channel)
        hold_while_full(channel)
        handle = super().create_task_handler(promise)

        def on_task_received(message: Message) -> None:
            try:
                TaskHeaders.model_validate(message.headers)
                handle(message)
            except BROKER_ERRORS:
                raise
            except Exception as exc:
                logger.error("dropped a malformed task message (%s: %s): headers %s, body %s", exc.__class__.__name__, exc,
                             repr(message.headers)[:SHOWN_CHARS], repr(message.body)[:SHOWN_CHARS])  # fmt: skip
                if not message.acknowledged:
                    message.ack()

        return on_task_received

    def shutdown(self) -> None:
        """Celery's, except that closing the channels of a broker that is gone (the consumer
        was reconnecting when the worker was told to stop) does not end the process with a
        traceback: Celery's steps then find no connection to ignore the errors of."""
        try:
            super().shutdown()
        except AttributeError:
            if self.connection is not None:
                raise
            logger.info("the broker is gone: the consumer stopped without closing its channels")
