"""kombu's Redis channels keep one client: sending messages makes no new `redis.Redis` each."""

import redis

from edgetrain.common.settings import Settings
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.contract import CONTROL_QUEUE, TaskName, send


def test_sending_messages_makes_one_redis_client_per_channel(redis_server, monkeypatch) -> None:
    redis.Redis.from_url(redis_server.url).delete(CONTROL_QUEUE)
    producer = producer_app(Settings(redis_url=redis_server.url))
    send(producer, TaskName.advance_job, "j0")  # the channel and its client made
    made = []
    init = redis.Redis.__init__
    monkeypatch.setattr(redis.Redis, "__init__", lambda self, *a, **kw: made.append(1) or init(self, *a, **kw))
    for i in range(1, 6):
        send(producer, TaskName.advance_job, f"j{i}")
    monkeypatch.undo()
    assert made == [] and len(queued_tasks(redis.Redis.from_url(redis_server.url), CONTROL_QUEUE)) == 6
