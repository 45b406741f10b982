"""Shared fixtures: a real Redis server (embedded, on a Unix socket) per test session, and the
fetchable datasets."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from edgetrain.common.settings import get_data_settings, reload_settings
from edgetrain.common.store import Store
from edgetrain.workers.commands.data_fetch import fetch
from edgetrain.workers.processes.cluster import EmbeddedRedis

# Several test processes and the workers they start share a few cores: PyTorch's thread pools,
# each as wide as the machine, would wait on one another (one thread per process; the workers
# the tests start inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# A suite started in the background by a non-interactive shell (or under nohup) inherits SIGINT
# ignored, and one started by a runner that blocks signals inherits it blocked; so would every
# process it starts: the tests that press Ctrl-C on a command or a worker (SIGINT) need it as a
# terminal leaves it. A handler, unlike an ignored signal, is not inherited across exec, so the
# commands the tests start get Python's own; a blocked mask is inherited, so it is cleared.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def store(redis_server: EmbeddedRedis) -> Store:
    s = Store.connect(redis_server.url)
    s.clear()
    return s


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def tmp_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as a data root besides the data directory, for tests that read their own files
    as user data (dataset.path is read only inside the data roots)."""
    monkeypatch.setenv("EDGETRAIN_DATA_ROOTS", os.pathsep.join([str(get_data_settings().data_dir), str(tmp_path)]))
    reload_settings()
    yield tmp_path
    reload_settings()


APT_DATASETS = {"fashion_mnist", "austen"}


@pytest.fixture(scope="session")
def fetched() -> dict[str, dict]:
    """Every fetchable dataset in settings.data_dir (fetched once; present ones are skipped)."""
    return fetch(None, get_data_settings().data_dir)


@pytest.fixture(scope="session")
def require_dataset(fetched: dict[str, dict]):
    """A check that a fetchable dataset is here: fails with the fetch error (skips only where
    apt-get does not exist)."""

    def require(name: str) -> None:
        result = fetched[name]
        if result["status"] == "failed":
            if name in APT_DATASETS and shutil.which("apt-get") is None:
                pytest.skip(f"{name}: no apt-get on this machine")
            pytest.fail(result["error"])

    return require


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist's `loadgroup`, the tests of a module that share a module- or class-scoped
    fixture (a cluster) run on one worker, one after the other; every other test goes wherever a
    worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info else []
        if any(d[-1].scope in ("module", "class", "package") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid.split("::")[0]))
