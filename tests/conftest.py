"""Shared fixtures: a real Redis server (embedded, on a Unix socket) per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.common.store import Store
from edgetrain.workers.cluster import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def store(redis_server: EmbeddedRedis) -> Store:
    s = Store.from_url(redis_server.url)
    s.r.flushdb()
    return s


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path
