"""Redis connections, with retries that ride out a short outage (a Redis restart)."""

from __future__ import annotations

from collections.abc import Iterable

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

PATIENT_RETRIES = 12  # backoff 0.1 s doubling to 4 s: about 30 s in all
QUICK_RETRIES = 1


def text(value: object) -> str | None:
    """A reply of a client made by `connect` (strings decoded) as `str`, None kept."""
    return None if value is None else str(value)


def texts(values: Iterable[object]) -> list[str]:
    """Replies of a client made by `connect` as a list of `str`."""
    return [str(v) for v in values]


def connect(url: str, patient: bool = False) -> redis.Redis:
    """A Redis client for redis://, rediss:// or unix:// URLs (strings decoded).

    A `patient` client (worker processes) retries a failed command for about 30 s with
    exponential backoff, so a Redis restart or a network blip does not abort running work;
    otherwise (commands people run) it fails after one quick retry."""
    retry = Retry(ExponentialBackoff(cap=4.0, base=0.1), PATIENT_RETRIES if patient else QUICK_RETRIES)
    return redis.Redis.from_url(
        url, decode_responses=True, retry=retry, retry_on_error=[ConnectionError, TimeoutError], socket_connect_timeout=5
    )
