"""Redis connections."""

from __future__ import annotations

import redis


def connect(url: str) -> redis.Redis:
    """A Redis client for redis://, rediss:// or unix:// URLs (strings decoded)."""
    return redis.Redis.from_url(url, decode_responses=True)
