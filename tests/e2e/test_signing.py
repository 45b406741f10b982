"""Message signing on a real control worker: a task signed by a trusted key runs; an unsigned
one and one signed by a key outside the worker's certificate store are refused before they
are decoded, and the jobs they name stay as they were."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.common.settings import Settings
from edgetrain.common.store import Store, connect
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.common.testing.certificates import Identity, issue
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.contract import CONTROL_QUEUE, TaskName, send
from edgetrain.workers.processes.cluster import EmbeddedRedis, WorkerProcess

pytestmark = pytest.mark.e2e
SEND_ADVANCE = "import sys; from edgetrain.common.settings import Settings; from edgetrain.tasks.app import producer_app; " \
    "from edgetrain.tasks.contract import TaskName, send; send(producer_app(Settings()), TaskName.advance_job, sys.argv[1])"  # fmt: skip


def signing_env(identity: Identity, store: Path) -> dict[str, str]:
    return {
        "EDGETRAIN_SIGNING_KEY": str(identity.key),
        "EDGETRAIN_SIGNING_CERTIFICATE": str(identity.certificate),
        "EDGETRAIN_SIGNING_CERT_STORE": str(store),
    }


def wait_for_log(log: Path, words: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and words in log.read_text()):
        assert time.monotonic() < deadline, f"{words!r} not in {log}"
        time.sleep(0.3)


def test_only_tasks_signed_by_a_trusted_key_run(tmp_path: Path) -> None:
    fleet, intruder = issue(tmp_path / "keys", "fleet"), issue(tmp_path / "keys", "intruder")
    trusted, own = tmp_path / "trusted", tmp_path / "intruder-store"
    trusted.mkdir(), own.mkdir()
    shutil.copy(fleet.certificate, trusted / "fleet.pem")
    shutil.copy(intruder.certificate, own / "intruder.pem")
    server = EmbeddedRedis(tmp_path / "redis")
    env = {**os.environ, "EDGETRAIN_REDIS_URL": server.url}
    worker = WorkerProcess("control", ["worker", "control"], tmp_path / "control.log")
    worker.start(env | signing_env(fleet, trusted))
    try:
        wait_for_log(worker.log, "ready.")
        store = Store.connect(server.url)
        spec = JobSpec.model_validate(quick_job([{"device_id": "ghost"}], device_grace_s=0))
        unsigned, forged = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
        for job_id in (unsigned, forged):  # records only a message would start (records are the ACL's to guard, not signing's)
            store.jobs.create(job_id, spec)
        store.jobs.planned([unsigned, forged])
        send(producer_app(Settings(redis_url=server.url)), TaskName.advance_job, unsigned)
        subprocess.run([sys.executable, "-c", SEND_ADVANCE, forged], env=env | signing_env(intruder, own), check=True)
        job_file = tmp_path / "job.json"
        job_file.write_text(json.dumps(quick_job([{"device_id": "ghost"}], device_grace_s=0)))  # fails at once: the device is unknown
        submit = [sys.executable, "-m", "edgetrain.workers.cli", "submit", str(job_file)]
        signed = subprocess.run(submit, env=env | signing_env(fleet, trusted), capture_output=True, text=True, check=True).stdout.strip()

        deadline = time.monotonic() + 60
        while store.jobs.part(signed, "ghost").state.value != "failed":  # it ran: the device is unknown
            assert time.monotonic() < deadline, store.jobs.status(signed).events
            time.sleep(0.2)
        assert "unknown device 'ghost'" in store.jobs.part(signed, "ghost").reason
        for job_id in (unsigned, forged):  # sent before the signed one, to the same single consumer
            status = store.jobs.status(job_id)
            assert status.parts["ghost"].state.value == "pending"
            assert [e.kind.value for e in status.events] == ["submitted"]
        assert queued_tasks(connect(server.url), CONTROL_QUEUE) == []  # consumed and refused, not waiting
        log = worker.log.read_text()
        assert "Refusing to deserialize untrusted content of type json" in log
        assert "SecurityError(\"Unknown certificate: b'intruder " in log
    finally:
        worker.signal(15)
        worker.process.wait(timeout=30)
        server.stop()
