"""Fixtures of the tasks' in-process tests against a real Redis (the session's, emptied per test)."""

import pytest
import redis

from edgetrain.common.settings import Settings
from edgetrain.common.store import Store
from edgetrain.tasks import context


@pytest.fixture
def s(redis_server) -> Store:
    """The store of a context set up as a control worker's (an empty Redis: store keys and broker queues)."""
    redis.Redis.from_url(redis_server.url).flushdb()
    return context.init(Settings(redis_url=redis_server.url), ("edgetrain.tasks.workflow",))


@pytest.fixture
def broker(redis_server) -> redis.Redis:
    """A plain client of the same Redis, to read and change the broker's queues."""
    return redis.Redis.from_url(redis_server.url)
