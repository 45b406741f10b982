"""kombu's Redis channels keep one client: sending messages makes no new `redis.Redis` each; a
message taken is noted and forgotten as unacknowledged without MULTI/EXEC."""

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


def _transactions(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("multi", "exec"))


def test_a_message_taken_is_noted_and_forgotten_as_unacknowledged_without_a_transaction(redis_server) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.delete(CONTROL_QUEUE, "unacked", "unacked_index")
    producer = producer_app(Settings(redis_url=redis_server.url))
    send(producer, TaskName.advance_job, "j0")
    with producer.connection_for_write() as connection:
        channel = connection.default_channel
        before = _transactions(client)
        message = channel.basic_get(CONTROL_QUEUE, no_ack=False)
        assert message is not None and client.hlen("unacked") == 1 and client.zcard("unacked_index") == 1
        channel.basic_ack(message.delivery_tag)
        assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
        assert _transactions(client) == before
