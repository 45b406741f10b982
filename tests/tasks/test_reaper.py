"""The reaper's pass in this process against a real Redis: what a submitter can put on a queue
does not stop it."""

import pytest
import redis

from edgetrain.common.settings import Settings
from edgetrain.tasks import context
from edgetrain.tasks.contract import SERVER_QUEUE, TaskName, to_track
from edgetrain.tasks.reaper import reap_once


@pytest.fixture
def s(redis_server):
    redis.Redis.from_url(redis_server.url).flushdb()
    return context.init(Settings(redis_url=redis_server.url), ("edgetrain.tasks.server",))


@pytest.mark.parametrize("junk", ["not json", "[]", "[1, 2]", '{"headers": null}', '{"headers": {"id": 7}}', "17"])
def test_a_malformed_message_waiting_on_a_queue_does_not_stop_the_pass(s, junk: str) -> None:
    """A submitter may push anything onto the server queue; a proxy run lost meanwhile (in the
    ledger, on no queue, held by nobody) is sent again all the same, and the rest of the pass runs."""
    client = redis.Redis.from_url(context.settings().redis_url)
    client.lpush(SERVER_QUEUE, junk)
    lost = to_track(TaskName.train_proxy, "payload", job_id="j1")
    s.ledger.record([lost])
    client.zadd(s.keys.sent_tasks(), {lost.task_id: 0})  # last seen long ago
    client.zadd(s.keys.unplanned(), {"j2": 0})  # a job no control worker took up: the pass's next step sends it
    reap_once(s, context.app(), context.settings())
    waiting = client.lrange(SERVER_QUEUE, 0, -1)
    assert waiting[-1].decode() == junk and len(waiting) == 2 and lost.task_id.encode() in waiting[0]
    assert s.jobs.unplanned(float("inf"), 10) == ["j2"] and client.zscore(s.keys.unplanned(), "j2") > 0  # reminded
