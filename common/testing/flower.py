"""`edgetrain flower` in its own process on a free loopback port, its HTTP API open (tests)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

from edgetrain.common.polling import poll_until

from .redis_server import free_port


def answers(url: str) -> bool:
    """Whether `url` answers an HTTP GET."""
    try:
        urllib.request.urlopen(url, timeout=5)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def flower(redis_url: str, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Flower on the Redis at `redis_url` while the block runs; yields its API's URL once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "edgetrain.workers.cli", "--redis-url", redis_url, "flower", "--port", str(port)],
        env={**os.environ, "FLOWER_UNAUTHENTICATED_API": "true"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}/api"
        poll_until(lambda: answers(f"{api}/workers") or None, start_timeout_s, 0.5, "Flower")
        yield api
    finally:
        process.terminate()
        process.wait(timeout=30)
