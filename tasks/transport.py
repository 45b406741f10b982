"""kombu's Redis transport made a new `redis.Redis` for every message it sends, takes off the
unacknowledged set or acknowledges (`Channel.conn_or_acquire`): about 70 µs each on the 2-core
development machine, mostly the client's table of reply parsers, three or four times per job
step in a control worker. A channel keeps one client on its connection pool instead (a client
is thread-safe and takes a connection from the pool per command); a new pool gets a new one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

_CLIENT = "_edgetrain_client"  # the attribute a channel keeps its client under


@contextmanager
def _conn_or_acquire(channel: Any, client: Any = None) -> Iterator[Any]:
    if client:
        yield client
        return
    kept = channel.__dict__.get(_CLIENT)
    if kept is None or kept.connection_pool is not channel.pool:
        kept = channel._create_client()
        setattr(channel, _CLIENT, kept)
    yield kept


def reuse_redis_clients() -> None:
    """Make every kombu Redis channel of this process keep one client (idempotent)."""
    kombu_redis.Channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign,assignment]  # a method replaced
