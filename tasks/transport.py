"""Less work for kombu's Redis transport per message, same behaviour:

- it made a new `redis.Redis` for every message it sends, takes off the unacknowledged set or
  acknowledges (`Channel.conn_or_acquire`): about 70 µs each on the 2-core development machine,
  mostly the client's table of reply parsers, three or four times per job step in a control
  worker. A channel keeps one client on its connection pool instead (a client is thread-safe
  and takes a connection from the pool per command); a new pool gets a new one;
- it wrapped the two writes that note a delivered message as unacknowledged (index and
  message), and the two that forget it on acknowledgement, in MULTI/EXEC: four of the nine
  commands Redis ran for each message a worker takes. They are sent as a plain pipeline (one
  round trip, in order): the only reader of those entries, a restore of the unacknowledged
  (`restore_by_tag`, the visibility timeout's and tasks/reaper.py's), reads one message's entry
  in its own transaction and takes an entry without its message for one already acknowledged,
  so nothing reads a half-written pair as anything else. A restore's own pipeline is kept."""

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


@contextmanager
def _pipe_or_acquire(qos: Any, pipe: Any = None, client: Any = None) -> Iterator[Any]:
    if pipe:
        yield pipe
        return
    with qos.channel.conn_or_acquire(client) as client:
        yield client.pipeline(transaction=False)


def reuse_redis_clients() -> None:
    """Make every kombu Redis channel of this process keep one client, and note and forget
    unacknowledged messages without a transaction (idempotent)."""
    kombu_redis.Channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign,assignment]  # a method replaced
    kombu_redis.QoS.pipe_or_acquire = _pipe_or_acquire  # type: ignore[method-assign,assignment]  # a method replaced
