"""The package's Celery app sends and consumes only once configured from the settings: a script
that imports the tasks and sends before configuring gets an error naming EDGETRAIN_REDIS_URL,
never Celery's default broker (amqp://localhost). A worker's send rides out a Redis restart."""

from __future__ import annotations

import os
import subprocess
import sys

import redis

from edgetrain.common.settings import Settings
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks import context
from edgetrain.tasks.contract import CONTROL_QUEUE
from edgetrain.workers.processes.cluster import EmbeddedRedis

UNCONFIGURED = """
import sys
from edgetrain.tasks.app import NotConfigured
from edgetrain.tasks.workflow import advance_job
from edgetrain.tasks.app import app
for what, use in (("send", lambda: advance_job.delay("j1")), ("consume", lambda: app.connection_for_read().connect()),
                  ("control", lambda: app.control.ping(timeout=1))):
    try:
        use()
    except NotConfigured as exc:
        print(what, "refused:", exc)
    else:
        sys.exit(f"{what}: not refused")
"""


def test_the_unconfigured_app_refuses_to_send_or_consume_naming_the_setting() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGETRAIN_REDIS")}
    done = subprocess.run([sys.executable, "-c", UNCONFIGURED], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(" refused:")[0] for line in lines] == ["send", "consume", "control"], done.stdout
    assert all("is not configured, so it has no broker" in line and "EDGETRAIN_REDIS_URL" in line for line in lines), lines
    assert "amqp" not in done.stdout + done.stderr


def test_once_configured_it_sends_to_the_settings_redis(redis_server) -> None:
    broker = redis.Redis.from_url(redis_server.url)
    broker.delete(CONTROL_QUEUE)
    context.init(Settings(redis_url=redis_server.url), ("edgetrain.tasks.workflow",))
    from edgetrain.tasks.workflow import advance_job

    advance_job.delay("j1")
    assert broker.llen(CONTROL_QUEUE) == 1
    broker.delete(CONTROL_QUEUE)


SEND_THROUGH_A_RESTART = """
import sys, threading
from pathlib import Path
from edgetrain.common.settings import Settings
from edgetrain.tasks import context
from edgetrain.workers.processes.cluster import EmbeddedRedis
server = EmbeddedRedis(Path(sys.argv[1]), persistent=True)
try:
    context.init(Settings(redis_url=server.url), ("edgetrain.tasks.workflow",))
    from edgetrain.tasks.workflow import advance_job
    server.kill()  # before its first send: a pool process's first task connects anew
    restart = threading.Timer(8.0, server.start)
    restart.start()
    advance_job.delay("j1")
    restart.join()
    print(server.url)
finally:
    server.stop()
"""


def test_a_worker_sends_through_a_redis_restart(tmp_path) -> None:
    """A task sent while Redis restarts (8 s) waits for it, as the worker's store does, instead
    of failing the task that sends (Celery's own retries give up after about 4 s). In a
    process of its own: the app keeps its broker connections once made."""
    done = subprocess.run([sys.executable, "-c", SEND_THROUGH_A_RESTART, str(tmp_path / "redis")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    server = EmbeddedRedis(tmp_path / "redis", persistent=True)  # the same data, from its append-only file
    try:
        assert [t.args for t in queued_tasks(redis.Redis.from_url(server.url), CONTROL_QUEUE)] == [["j1"]]
    finally:
        server.stop()
