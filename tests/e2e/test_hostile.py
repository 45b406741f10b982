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

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import Dispatched, Identified
from edgetrain.common.jobs.state import PartState
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.models import build_model
from edgetrain.common.payloads import FinetuneRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import EstimationRequest, JobSpec, Selection, TrainingOutcome
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName, device_queue
from edgetrain.workers.processes.cluster import LocalCluster

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

    def raw(self, task: TaskName, payload: object, queue: str, timeout_s: float = 120, task_id: str | None = None) -> AsyncResult:
        """Send a raw task message (as task `task_id`) and wait until a worker has run it."""
        result = self.app.send_task(task.value, args=[payload], queue=queue, task_id=task_id)
        result.get(timeout=timeout_s, propagate=False)
        return result

    def dispatched(self, device_id: str = DEVICE, **changes: object) -> tuple[str, str, dict]:
        """A job whose part on `device_id` was dispatched the fine-tune `finetune_payload(**changes)`
        as the control worker would (no task is sent): its id, the dispatch token (the task id
        to send it as) and the payload. The payload must be well-formed (`changes` that are not
        are applied to what is sent, not to what was dispatched)."""
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec.model_validate(quick_job([{"device_id": device_id, "power_cap_w": 5.0}]))
        self.store.jobs.create(job_id, spec)
        payload = self.finetune_payload(job_id, device_id, **changes)
        request = FinetuneRequest.model_validate(payload)
        choice = Selection(batch_size=request.batch_size, frequency_hz=request.frequency_hz, estimated_time_s=1.0, peak_power_w=None)
        token = uuid.uuid4().hex
        identity = Identified(device_type="jetson-nano", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)
        self.store.jobs.apply(job_id, device_id, Dispatched(device=identity, token=token, request=request, selection=choice,
                                                             estimated_time_to_accuracy_s=None))  # fmt: skip
        return job_id, token, payload

    def finetune_payload(self, job_id: str, device_id: str = DEVICE, **changes: object) -> dict:
        base = {
            "job_id": job_id, "device_id": device_id, "model": "smallcnn", "weights": "init:0",
            "dataset": {"name": "mnist5k", "fraction": 0.1}, "target_accuracy": 0.5, "batch_size": 16,
            "frequency_hz": self.frequency_hz, "lr": {}, "eval_every_samples": 64, "max_samples": 128, "seed": 0,
            "target": {"device_id": device_id, "power_cap_w": 5.0}, "objective": "time", "table_id": "none", "vector_key": "none",
        }  # fmt: skip
        return base | changes

    def proxy_payload(self, **changes: object) -> dict:
        request = {
            "model": "smallcnn", "weights": "init:0", "proxy_dataset": {"name": "digits"}, "target_accuracy": 0.5,
            "batch_sizes": [32], "seeds": [0], "lr": {}, "eval_every_samples": 128, "max_samples": 256,
        } | changes  # fmt: skip
        return {"request": request, "batch_size": 32, "seed": 0}

    def dispatched_proxy_payload(self, **changes: object) -> dict:
        """A proxy run of a request recorded as sent for estimation, as `estimate_relation_vector`
        records it (one whose model the allow-list refuses: recorded before the list changed)."""
        payload = self.proxy_payload(**changes)
        self.store.resources.put_vector_request(EstimationRequest.model_validate(payload["request"]))
        return payload


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
    job_id, token, payload = fleet.dispatched("nano-a")
    before = fleet.store.jobs.status(job_id)
    result = fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), task_id=token)
    assert result.state == "FAILURE" and "reached the worker of 'nano-h'" in str(result.result)
    time.sleep(1.0)  # room for an advance the task might have sent
    after = fleet.store.jobs.status(job_id)
    assert after.parts == before.parts and after.events == before.events and after.progress == {}
    assert after.parts["nano-a"].state == PartState.queued  # dispatched to a device nothing serves: it waits on its queue


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            {"model": f"{EVIL}:build"},
            f"model: '{EVIL}:build': module '{EVIL}' is not allowed here (EDGETRAIN_ALLOWED_MODEL_MODULES: {GOOD})",
        ),
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
    kinds = poll_until(lambda: (k := [e.kind.value for e in fleet.store.jobs.status(job_id).events])[-1] == "finished" and k or None,
                       30, 0.1, "the job's finished event, written after its last part's")  # fmt: skip
    assert kinds == ["submitted", "failed", "finished"]


def test_raw_fine_tune_naming_a_path_as_dataset_is_refused(fleet: Fleet) -> None:
    job_id, token, payload = fleet.dispatched(dataset={"name": "../../etc/passwd"})
    fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), task_id=token)
    part = wait_for_part(fleet, job_id, PartState.failed)
    assert "fine-tuning failed: dataset: unknown dataset '../../etc/passwd'" in part.reason


@pytest.mark.parametrize("model", [f"{EVIL}:build", "os:system", "builtins:eval", f"{GOOD}:nn"])
def test_raw_proxy_run_with_a_forbidden_model_is_refused_on_the_server(fleet: Fleet, model: str) -> None:
    result = fleet.raw(TaskName.train_proxy, fleet.dispatched_proxy_payload(model=model), SERVER_QUEUE)
    assert result.state == "FAILURE"
    assert any(words in str(result.result) for words in ("not allowed here", "standard library", "not a factory defined in"))
    assert not fleet.marker.exists()


def test_raw_proxy_run_with_an_allowed_user_model_trains(fleet: Fleet) -> None:
    result = fleet.raw(TaskName.train_proxy, fleet.dispatched_proxy_payload(model=f"{GOOD}:build"), SERVER_QUEUE)
    assert result.state == "SUCCESS", result.result
    assert result.result["samples_processed"] == 256


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside/a.txt", "escape/a.txt", "escape"])
def test_raw_fine_tune_reading_outside_the_data_roots_is_refused(fleet: Fleet, path: str) -> None:
    job_id, token, payload = fleet.dispatched(dataset={"name": "text", "path": path}, model="char_transformer")
    fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), task_id=token)
    part = wait_for_part(fleet, job_id, PartState.failed)
    assert "fine-tuning failed: dataset.path:" in part.reason
    assert ("contains '..'" if ".." in path else "is outside the data roots") in part.reason
    assert not fifo_opened(fleet.outside / "a.txt") and fleet.store.jobs.status(job_id).progress == {}


def test_raw_fine_tune_reading_user_data_inside_the_roots_runs(fleet: Fleet) -> None:
    job_id, token, payload = fleet.dispatched(dataset={"name": "text", "path": "mine.txt"}, model="char_transformer", batch_size=4)
    fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), timeout_s=300, task_id=token)
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
        job_id, token, payload = fleet.dispatched(weights=weights)
        fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), task_id=token)
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
    job_id, token, payload = fleet.dispatched()
    before = fleet.store.jobs.status(job_id)
    result = fleet.raw(TaskName.finetune, payload | changes, device_queue(DEVICE), task_id=token)
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


def test_a_forged_fine_tune_runs_nothing_and_changes_nothing(fleet: Fleet) -> None:
    job_id, token, payload = fleet.dispatched()
    before = fleet.store.jobs.status(job_id)
    forged_task = fleet.raw(TaskName.finetune, payload, device_queue(DEVICE), task_id=uuid.uuid4().hex)  # not the task dispatched
    forged_request = fleet.raw(TaskName.finetune, payload | {"target_accuracy": 0.2, "batch_size": 64}, device_queue(DEVICE),
                               task_id=token)  # the task's id, another configuration and target  # fmt: skip
    assert forged_task.state == forged_request.state == "SUCCESS" and forged_task.result is None
    assert fleet.log_says(f"device-{DEVICE}", "it was not dispatched to the part (a stale or forged fine-tune)")
    assert fleet.log_says(f"device-{DEVICE}", "its request is not the one dispatched (a forged fine-tune)")
    after = fleet.store.jobs.status(job_id)
    assert after.parts == before.parts and after.events == before.events and after.progress == {}
    fleet.app.send_task(TaskName.finetune.value, args=[payload], queue=device_queue(DEVICE), task_id=token)  # the real one
    part = wait_for_part(fleet, job_id, PartState.completed, timeout_s=120)
    assert part.report.batch_size == 16 and part.report.reached == (part.report.final_accuracy >= 0.5)


def test_raw_estimation_naming_a_forbidden_model_is_refused_before_any_run(fleet: Fleet) -> None:
    request = EstimationRequest.model_validate(fleet.proxy_payload(model=f"{EVIL}:build", max_samples=512)["request"])
    result = fleet.raw(TaskName.estimate_relation_vector, request.model_dump(mode="json"), SERVER_QUEUE)
    assert result.state == "FAILURE" and f"refused: model: '{EVIL}:build': module '{EVIL}' is not allowed here" in str(result.result)
    assert fleet.store.resources.vector_request(vector_key(request)) is None and not fleet.marker.exists()


VICTIM = {"batch_sizes": [16, 64], "target_accuracy": 0.5, "eval_every_samples": 256, "max_samples": 2048}


def test_a_forged_proxy_run_is_refused_and_the_victims_job_completes(fleet: Fleet) -> None:
    """A submitter may push onto `server`: a run outside its request, or of a request nobody
    sent for estimation, is refused and records nothing, so the vector it aimed at is estimated
    as usual when its job comes."""
    spec = quick_job([{"device_id": DEVICE, "power_cap_w": 5.0}], **VICTIM)
    request = JobSpec.model_validate(spec).estimation_request()
    key = vector_key(request)
    for b, words in [(32, "b=32 seed=0 is not a run of relation vector"), (16, "is not being estimated")]:
        forged = fleet.raw(TaskName.train_proxy, {"request": request.model_dump(mode="json"), "batch_size": b, "seed": 0}, SERVER_QUEUE)
        assert forged.state == "FAILURE" and words in str(forged.result), forged.result
    assert fleet.store.resources.vector_parts(key) == [] and fleet.store.coordination.failure(vector_resource(key)) is None
    client = EdgeTrainClient(fleet.cluster.url)
    status = client.wait(client.submit(spec), timeout_s=300)
    assert status.state.value == "completed", [e.line() for e in status.events]
    assert sorted((o.batch_size, o.seed) for o in fleet.store.resources.vector_parts(key)) == [(16, 0), (64, 0)]


def test_a_failed_aggregation_fails_the_waiting_job_and_the_next_one_estimates_again(fleet: Fleet) -> None:
    """A recorded run that cannot be aggregated (reached, but with no N_b) fails the vector with
    the reason: the job waiting on it fails at once instead of waiting behind the claim, and
    the runs are forgotten, so the next job with that vector runs them again and completes."""
    spec = quick_job([{"device_id": DEVICE, "power_cap_w": 5.0}], **VICTIM | {"eval_every_samples": 128})
    key = vector_key(JobSpec.model_validate(spec).estimation_request())
    broken = TrainingOutcome(batch_size=16, seed=0, samples_to_accuracy=None, reached=True, final_accuracy=0.6,
                             samples_processed=256, evaluations=2, wall_s=1.0)  # fmt: skip
    fleet.store.resources.put_vector_part(key, broken)
    client = EdgeTrainClient(fleet.cluster.url)
    status = client.wait(client.submit(spec), timeout_s=300)
    part = status.parts[DEVICE]
    assert part.state == PartState.failed and f"relation vector {key}: aggregating the proxy runs failed" in part.reason, part.reason
    assert fleet.store.coordination.holder(vector_resource(key)) is None and fleet.store.resources.vector_parts(key) == []
    again = client.wait(client.submit(spec), timeout_s=300)
    assert again.state.value == "completed", [e.line() for e in again.events]


@pytest.mark.parametrize(
    "task, payload, words",
    [
        (TaskName.advance_job, "j1:events", "job_id: 'j1:events' is not allowed: 1 to 64 letters"),
        (TaskName.advance_job, "*", "job_id: '*' is not allowed"),
        (TaskName.plan_submitted, "j1:events", "job_id: 'j1:events' is not allowed"),
        (TaskName.advance_page, {"job_id": "j1:part:nano-h", "page": 0}, "ValidationError"),
    ],
)
def test_a_control_task_naming_a_bad_job_id_is_refused(fleet: Fleet, task: TaskName, payload: object, words: str) -> None:
    result = fleet.raw(task, payload, CONTROL_QUEUE)
    assert result.state == "FAILURE" and words in f"{type(result.result).__name__}: {result.result}", result.result
