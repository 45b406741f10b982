"""Job and device ids are one form, checked at every entry (command line, client, task payloads)
and where a key is built: anything else is refused with one line naming the field, and no key
is made from it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from edgetrain.common.ids import InvalidIdError, checked_id
from edgetrain.common.keys import Keys
from edgetrain.common.payloads import FinetuneRequest, JobPage
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.tasks.client import EdgeTrainClient
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]
BAD_IDS = ["a:b", "*", "nano\n1", "x" * 10_000, "", "-lead", "../x", "nano 1", "j1:events", "j1:part:nano-1"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_no_key_is_built_from_a_bad_id(bad: str) -> None:
    keys = Keys("p")
    for build in (keys.job, keys.events, keys.device, keys.device_cap, keys.device_jobs, keys.device_owner):
        with pytest.raises(InvalidIdError):
            build(bad)
    with pytest.raises(InvalidIdError, match="device_id"):
        keys.part("j1", bad)
    with pytest.raises(InvalidIdError, match="job_id"):
        keys.progress(bad, "nano-1")


def test_a_refused_id_is_named_on_one_short_line() -> None:
    with pytest.raises(InvalidIdError) as refused:
        checked_id("x" * 10_000 + "\n", "device_id")
    message = str(refused.value)
    assert "\n" not in message and len(message) < 200 and message.startswith("device_id: 'xxx")
    assert "(10001 characters)" in message and "letters, digits" in message
    assert checked_id("nano-1.a_b", "device_id") == "nano-1.a_b"


@pytest.mark.parametrize("bad", ["a:b", "*", "x" * 10_000, "nano\n1"])
def test_the_client_refuses_a_bad_device_id_and_writes_nothing(store, redis_server, bad: str) -> None:
    client = EdgeTrainClient(redis_server.url)
    before = set(store._redis.keys("*"))
    with pytest.raises(InvalidIdError, match="device_id"):
        client.set_power_cap(bad, 3.0)
    with pytest.raises(InvalidIdError, match="device_id"):
        client.requeue("j1", bad)
    for call in (client.status, client.cancel, client.job_vector, client.report):
        with pytest.raises(InvalidIdError, match="job_id"):
            call(bad)
    assert set(store._redis.keys("*")) == before


@pytest.mark.parametrize(
    "argv",
    [["status", "j1:part:nano-1"], ["status", "j1:events"], ["cancel", "*"], ["requeue", "j1", "a:b"], ["cap", "a:b", "3"],
     ["vector", "show", "--job", "j1:x"]],
)  # fmt: skip
def test_the_command_line_refuses_a_bad_id_with_the_usage_status(store, redis_server, argv: list[str]) -> None:
    store.jobs.create("j1", JobSpec.model_validate(quick_job([{"device_id": "nano-1"}])))
    done = subprocess.run([*CLI, *argv, "--redis-url", redis_server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.usage, done.stderr
    error = [line for line in done.stderr.splitlines() if not line.startswith("usage:") and not line.startswith(" ")]
    assert len(error) == 1 and "is not allowed: 1 to 64 letters" in error[0], done.stderr
    assert "Traceback" not in done.stderr and "WRONGTYPE" not in done.stderr


def test_an_id_refused_deeper_in_a_command_is_a_usage_error(store, redis_server, capsys, monkeypatch) -> None:
    monkeypatch.setattr(EdgeTrainClient, "status", lambda self, job_id, *view: checked_id("a:b", "job_id"))
    assert main(["status", "j1", "--redis-url", redis_server.url]) == ExitCode.usage
    assert (
        capsys.readouterr().err.strip() == "edgetrain: job_id: 'a:b' is not allowed: 1 to 64 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit"
    )


@pytest.mark.parametrize("bad", ["a:b", "*", "x" * 65])
def test_task_payloads_refuse_bad_ids(bad: str) -> None:
    with pytest.raises(ValidationError, match="job_id"):
        JobPage(job_id=bad, page=0)
    with pytest.raises(ValidationError, match="device_id"):
        FinetuneRequest.model_validate({"job_id": "j1", "device_id": bad})
    with pytest.raises(ValidationError, match="devices.0.device_id"):
        JobSpec.model_validate(quick_job([{"device_id": bad}]))


def test_a_job_listed_under_a_bad_id_does_not_break_the_listing(store, redis_server) -> None:
    store.jobs.create("j1", JobSpec.model_validate(quick_job([{"device_id": "nano-1"}])))
    store._redis.zadd(store.keys.jobs(), {"x:y": 1e12})  # written straight into Redis
    assert [j.job_id for j in EdgeTrainClient(redis_server.url).jobs()] == ["j1"]
