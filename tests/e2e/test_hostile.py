"""Hostile job records and raw Celery tasks, sent past the client straight to Redis, against
real worker processes: each is refused with its reason, nothing of another job changes, no
user module outside the allow-list is imported and no file outside the stores is read."""

from __future__ import annotations

import hashlib
import io
import os
import time
import uuid
from pathlib import Path

import pytest
import torch
from celery.result import AsyncResult

from edgetrain.common.jobs import PartState
from edgetrain.common.models import build_model
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName, device_queue
from edgetrain.workers.cluster import LocalCluster

pytestmark = pytest.mark.e2e
DEVICE = "nano-h"
EVIL = "evilmod_hostile"
GOOD = "goodmod_hostile"
EVIL_SOURCE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
def build(num_classes, input_shape):
    Path({marker!r}).write_text("called")
"""
GOOD_SOURCE = """
from torch import nn
def build(num_classes, input_shape):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes))
build.input_shape = (1, 28, 28)
"""
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 40


class Fleet:
    """The cluster, its folders and a producer that sends raw task messages."""

    def __init__(self, cluster: LocalCluster, base: Path):
        self.cluster, self.base = cluster, base
        self.store = cluster.store()
        self.app = producer_app(Settings(redis_url=cluster.redis_url))
        self.marker = base / "evil.imported"
        self.outside = base / "outside"
        self.frequency_hz = self.store.fleet.device(DEVICE).frequencies_hz[0]

    def log_says(self, worker: str, words: str, timeout_s: float = 10.0) -> bool:
        """Whether the log of `worker` says `words` (within `timeout_s`)."""
        log = self.cluster.worker(worker).log
        deadline = time.monotonic() + timeout_s
        while words not in log.read_text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def raw(self, task: TaskName, payload: object, queue: str, timeout_s: float = 120) -> AsyncResult:
        """Send a raw task message and wait until a worker has run it."""
        result = self.app.send_task(task.value, args=[payload], queue=queue)
        result.get(timeout=timeout_s, propagate=False)
        return result

    def job_in_finetuning(self, device_id: str = DEVICE) -> str:
        """A job whose part on `device_id` waits for its fine-tuning task (no task is sent)."""
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec.model_validate(quick_job([{"device_id": device_id, "power_cap_w": 5.0}]))
        self.store.jobs.create(job_id, spec)
        part = self.store.jobs.part(job_id, device_id)
        self.store.jobs.update_part(job_id, part.device_id, {"state": PartState.finetuning})
        return job_id

    def finetune_payload(self, job_id: str, device_id: str = DEVICE, **changes: object) -> dict:
        base = {
            "job_id": job_id, "device_id": device_id, "model": "smallcnn", "weights": "init:0",
            "dataset": {"name": "mnist5k", "fraction": 0.1}, "target_accuracy": 0.5, "batch_size": 16,
            "frequency_hz": self.frequency_hz, "lr": {}, "eval_every_samples": 64, "max_samples": 128, "seed": 0,
        }  # fmt: skip
        return base | changes

    def proxy_payload(self, **changes: object) -> dict:
        request = {
            "model": "smallcnn", "weights": "init:0", "proxy_dataset": {"name": "digits"}, "target_accuracy": 0.5,
            "batch_sizes": [32], "seeds": [0], "lr": {}, "eval_every_samples": 128, "max_samples": 256,
        } | changes  # fmt: skip
        return {"request": request, "batch_size": 32, "seed": 0}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    modules, data, artifacts, outside = (base / name for name in ("modules", "data", "artifacts", "outside"))
    for folder in (modules, data, artifacts, outside):
        folder.mkdir()
    (modules / f"{EVIL}.py").write_text(EVIL_SOURCE.format(marker=str(base / "evil.imported")))
    (modules / f"{GOOD}.py").write_text(GOOD_SOURCE)
    os.mkfifo(outside / "a.txt")  # whoever opens it to read blocks until a writer comes
    (data / "mine.txt").write_text(TEXT)
    (data / "escape").symlink_to(outside, target_is_directory=True)
    env = {
        "EDGETRAIN_ARTIFACT_DIR": str(artifacts),
        "EDGETRAIN_DATA_ROOTS": str(data),
        "EDGETRAIN_ALLOWED_MODEL_MODULES": GOOD,
        "PYTHONPATH": os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")]),
    }
    with LocalCluster(base, devices={DEVICE: "sim:jetson-nano"}, env=env) as cluster:
        fleet = Fleet(cluster, base)
        yield fleet
        assert not fleet.marker.exists(), "a module outside the allow-list was imported"


def fifo_opened(fifo: Path) -> bool:
    """Whether some process holds `fifo` open for reading."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def wait_for_part(fleet: Fleet, job_id: str, state: PartState, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while (part := fleet.store.jobs.part(job_id, DEVICE)).state != state:
        assert time.monotonic() < deadline, f"part still {part.state.value}: {part.reason}"
        time.sleep(0.2)
    return part


def test_a_task_for_another_device_changes_nothing_of_its_job(fleet: Fleet) -> None:
    job_id = fleet.job_in_finetuning("nano-a")
    before = fleet.store.jobs.status(job_id)
    result = fleet.raw(TaskName.finetune, fleet.finetune_payload(job_id, "nano-a"), device_queue(DEVICE))
    assert result.state == "FAILURE" and "reached the worker of 'nano-h'" in str(result.result)
    time.sleep(1.0)  # room for an advance the task might have sent
    after = fleet.store.jobs.status(job_id)
    assert after.parts == before.parts and after.events == before.events and after.progress == {}
    assert after.parts["nano-a"].state == PartState.finetuning


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"model": f"{EVIL}:build"}, f"model: '{EVIL}:build': module '{EVIL}' is not allowed here (EDGETRAIN_ALLOWED_MODEL_MODULES: {GOOD})"),
        ({"weights": "file:///etc/shadow"}, "weights: 'file:///etc/shadow' is not 'init:<integer seed>'"),
        ({"dataset": {"name": "npz", "path": "../../etc/passwd"}}, "dataset.path: '../../etc/passwd' contains '..'"),
        ({"dataset": {"name": "../../etc/passwd"}}, "dataset.name: unknown dataset '../../etc/passwd'"),
    ],
)
def test_a_job_record_written_past_the_client_fails_at_the_control_worker(fleet: Fleet, changes: dict, words: str) -> None:
    job_id = uuid.uuid4().hex[:12]
    fleet.store.jobs.create(job_id, JobSpec.model_validate(quick_job([{"device_id": DEVICE}], **changes)))
    fleet.app.send_task(TaskName.advance_job.value, args=[job_id], queue=CONTROL_QUEUE)
    part = wait_for_part(fleet, job_id, PartState.failed)
    assert part.reason.startswith("refused: ") and words in part.reason, part.reason
    assert not fleet.marker.exists()
    assert [e.kind.value for e in fleet.store.jobs.status(job_id).events] == ["submitted", "failed", "finished"]


def test_raw_fine_tune_naming_a_path_as_dataset_is_refused(fleet: Fleet) -> None:
    job_id = fleet.job_in_finetuning()
    fleet.raw(TaskName.finetune, fleet.finetune_payload(job_id, dataset={"name": "../../etc/passwd"}), device_queue(DEVICE))
    part = wait_for_part(fleet, job_id, PartState.failed)
    assert "fine-tuning failed: dataset: unknown dataset '../../etc/passwd'" in part.reason


@pytest.mark.parametrize("model", [f"{EVIL}:build", "os:system", "builtins:eval", f"{GOOD}:nn"])
def test_raw_proxy_run_with_a_forbidden_model_is_refused_on_the_server(fleet: Fleet, model: str) -> None:
    result = fleet.raw(TaskName.train_proxy, fleet.proxy_payload(model=model), SERVER_QUEUE)
    assert result.state == "FAILURE"
    assert any(words in str(result.result) for words in ("not allowed here", "standard library", "not a factory defined in"))
    assert not fleet.marker.exists()


def test_raw_proxy_run_with_an_allowed_user_model_trains(fleet: Fleet) -> None:
    result = fleet.raw(TaskName.train_proxy, fleet.proxy_payload(model=f"{GOOD}:build"), SERVER_QUEUE)
    assert result.state == "SUCCESS", result.result
    assert result.result["samples_processed"] == 256


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside/a.txt", "escape/a.txt", "escape"])
def test_raw_fine_tune_reading_outside_the_data_roots_is_refused(fleet: Fleet, path: str) -> None:
    job_id = fleet.job_in_finetuning()
    payload = fleet.finetune_payload(job_id, dataset={"name": "text", "path": path}, model="char_transformer")
    fleet.raw(TaskName.finetune, payload, device_queue(DEVICE))
    part = wait_for_part(fleet, job_id, PartState.failed)
    assert "fine-tuning failed: dataset.path:" in part.reason
    assert ("contains '..'" if ".." in path else "is outside the data roots") in part.reason
    assert not fifo_opened(fleet.outside / "a.txt") and fleet.store.jobs.status(job_id).progress == {}


def test_raw_fine_tune_reading_user_data_inside_the_roots_runs(fleet: Fleet) -> None:
    job_id = fleet.job_in_finetuning()
    payload = fleet.finetune_payload(job_id, dataset={"name": "text", "path": "mine.txt"}, model="char_transformer", batch_size=4)
    fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), timeout_s=300)
    part = wait_for_part(fleet, job_id, PartState.completed)
    assert part.report.samples_processed == 128


def test_raw_pretrain_reading_outside_the_data_roots_is_refused(fleet: Fleet) -> None:
    payload = {"model": "char_transformer", "dataset": {"name": "text", "path": str(fleet.outside)}, "samples": 64}
    result = fleet.raw(TaskName.pretrain, payload, SERVER_QUEUE)
    assert result.state == "FAILURE" and "is outside the data roots" in str(result.result)
    assert not fifo_opened(fleet.outside / "a.txt")


def test_raw_fine_tune_loading_weights_outside_the_store_is_refused(fleet: Fleet) -> None:
    buffer = io.BytesIO()
    torch.save(build_model("smallcnn", 10, 3).state_dict(), buffer)
    (fleet.outside / "w.pt").write_bytes(buffer.getvalue())
    store = Path(fleet.cluster.env["EDGETRAIN_ARTIFACT_DIR"])
    (store / "link.pt").symlink_to(fleet.outside / "w.pt")  # a valid checkpoint, reached through a link
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    for weights, words in [
        (f"artifact:link.pt#sha256={digest}", "is outside the artifact store"),
        ("file:///etc/shadow", "files outside the artifact store are never read"),
        (f"file://{fleet.outside / 'w.pt'}#sha256={digest}", "files outside the artifact store are never read"),
    ]:
        job_id = fleet.job_in_finetuning()
        fleet.raw(TaskName.finetune, fleet.finetune_payload(job_id, weights=weights), device_queue(DEVICE))
        part = wait_for_part(fleet, job_id, PartState.failed)
        assert "fine-tuning failed: weights: " in part.reason and words in part.reason, part.reason


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"batch_size": 1 << 30}, "less than or equal to 4096"),
        ({"max_samples": 10**12}, "less than or equal to 10000000"),
        ({"seed": -5}, "greater than or equal to 0"),
        ({"device_id": "nano-h; touch /tmp/pwned"}, "should match pattern"),
        ({"job_id": "*"}, "should match pattern"),
        ({"extra": "field"}, "Extra inputs are not permitted"),
    ],
)
def test_raw_fine_tune_outside_the_bounds_is_refused_before_it_runs(fleet: Fleet, changes: dict, words: str) -> None:
    job_id = fleet.job_in_finetuning()
    before = fleet.store.jobs.status(job_id)
    result = fleet.raw(TaskName.finetune, fleet.finetune_payload(job_id) | changes, device_queue(DEVICE))
    assert result.state == "FAILURE" and "ValidationError" in str(result.result), result.result
    assert fleet.log_says(f"device-{DEVICE}", words)  # the validation message is in the worker's log
    after = fleet.store.jobs.status(job_id)
    assert after.parts == before.parts and after.events == before.events and after.progress == {}


def test_raw_profile_and_proxy_runs_outside_the_bounds_are_refused(fleet: Fleet) -> None:
    profile = {"device_id": DEVICE, "model": "smallcnn", "batch_sizes": [4], "optimizer": "adam",
               "options": {"measure_batches": 10**9}}  # fmt: skip
    result = fleet.raw(TaskName.profile_device, profile, device_queue(DEVICE))
    assert result.state == "FAILURE" and "ValidationError" in str(result.result)
    assert fleet.log_says(f"device-{DEVICE}", "options.measure_batches\n  Input should be less than or equal to 100")
    result = fleet.raw(TaskName.train_proxy, fleet.proxy_payload(seeds=list(range(10**4))), SERVER_QUEUE)
    assert result.state == "FAILURE" and "ValidationError" in str(result.result)
    assert fleet.log_says("server-0", "request.seeds\n  List should have at most 16 items")
