"""Redis connections, with retries that ride out a short outage (a Redis restart or a Sentinel
failover); common/redis_address.py says which URLs name a Sentinel deployment."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ..redis_address import sentinel_address

PATIENT_RETRIES = 12  # backoff 0.1 s doubling to 4 s: about 30 s in all
QUICK_RETRIES = 1
CONNECT_TIMEOUT_S = 5.0
T = TypeVar("T")
_stopping = threading.Event()


def stop_retrying() -> None:
    """This process is stopping: from now on its patient clients give up at the first failure
    (and stop waiting at once), so an outage of Redis does not hold up the exit."""
    _stopping.set()


class PatientRetry(Retry):
    """redis-py's retry with exponential backoff, cut short by `stop_retrying`."""

    def call_with_retry(
        self, do: Callable[[], T], fail: Callable[..., Any], is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:  # fmt: skip
        """`do()`, retried after each failure of a supported kind as redis-py's Retry does,
        waiting the backoff's time (s) unless the process is stopping."""
        self._backoff.reset()
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                if failures > self._retries or _stopping.is_set() or _stopping.wait(self._backoff.compute(failures)):
                    raise


class MasterFollowingConnection(SentinelManagedConnection):
    """A connection to the master behind Sentinel that asks the sentinels where it is at every
    connection attempt. redis-py 8 reconnects a connection inside a command's retries without
    its Sentinel lookup, so a command in flight when the master died would dial the old address
    for all its retries (about 30 s) and fail, though the sentinels had promoted a replica. An
    attempt through `connect_to` has just been given the address the sentinels named: it asks
    them once, not twice."""

    _addressed = False  # the attempt under way dials the address `connect_to` was just given

    def connect_to(self, address: Any) -> None:
        """Connect to `address` (host, port), the master the sentinels named just now."""
        self._addressed = True
        try:
            super().connect_to(address)
        finally:
            self._addressed = False

    def _connect(self) -> Any:
        if self.connection_pool.is_master and not self._addressed:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()


def text(value: object) -> str | None:
    """A reply of a client made by `connect` (strings decoded) as `str`, None kept."""
    return None if value is None else str(value)


def texts(values: Iterable[object]) -> list[str]:
    """Replies of a client made by `connect` as a list of `str`."""
    return [str(v) for v in values]


def transaction(client: redis.Redis, apply: Callable[[redis.client.Pipeline], T], *keys: str) -> T:
    """`apply`'s value, its writes (queued after `multi()`) made only if none of `keys` changed
    since `apply` read them; run again while another process changes one first."""
    with client.pipeline() as p:
        while True:
            try:
                p.watch(*keys)
                value = apply(p)
                p.execute()
                return value
            except redis.WatchError:
                continue


def connect(url: str, patient: bool = False) -> redis.Redis:
    """A Redis client for redis://, rediss://, unix:// or sentinel:// URLs (strings decoded).

    A `patient` client (worker processes) retries a failed command for about 30 s with
    exponential backoff, so a Redis restart, a Sentinel failover or a network blip does not
    abort running work, until the process stops (`stop_retrying`); otherwise (commands people
    run) it fails after one quick retry. Behind Sentinel, each new connection asks the
    sentinels where the master is now."""
    backoff = ExponentialBackoff(cap=4.0, base=0.1)
    retry = PatientRetry(backoff, PATIENT_RETRIES) if patient else Retry(backoff, QUICK_RETRIES)
    options: dict[str, Any] = dict(decode_responses=True, retry=retry, retry_on_error=[ConnectionError, TimeoutError],
                                   socket_connect_timeout=CONNECT_TIMEOUT_S)  # fmt: skip
    address = sentinel_address(url)
    if address is None:
        return redis.Redis.from_url(url, **options)
    timeouts = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": CONNECT_TIMEOUT_S}
    sentinel = Sentinel(list(address.sentinels), sentinel_kwargs=timeouts)
    return sentinel.master_for(address.master_name, db=address.db, username=address.username, password=address.password,
                               connection_class=MasterFollowingConnection, **options)  # fmt: skip


def master_address(client: redis.Redis) -> str | None:
    """HOST:PORT of the master a client made by `connect` on a Sentinel address uses now, as
    the sentinels name it; None for a client of a plain Redis URL."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    host, port = pool.get_master_address()
    return f"{host}:{port}"
