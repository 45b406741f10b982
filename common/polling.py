"""Waiting for something another process does, by asking again until it answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(check: Callable[[], T | None], timeout_s: float | None, poll_s: float, what: str) -> T:
    """Call `check` every `poll_s` seconds until it returns a value; TimeoutError after `timeout_s`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (value := check()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} not finished after {timeout_s} s")
        time.sleep(poll_s)
    return value
