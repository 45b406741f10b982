"""Tasks that run on one device's queue (`device.<id>`): profiling and fine-tuning.

A task first checks that it reached the worker of the device it names; one that reached
another worker raises WrongDeviceError and changes nothing."""

from __future__ import annotations

import time

from celery import Task
from celery.utils.log import get_task_logger

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.jobs import EventKind, FinetuneProgress, PartState
from edgetrain.common.keys import table_id, table_resource
from edgetrain.common.models import get_model
from edgetrain.common.payloads import FinetuneRequest, ProfileRequest, ProfileResult
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import LearningRatePolicy, RunReport
from edgetrain.common.training import DeviceTotals, Trainer, make_optimizer, train_to_accuracy
from edgetrain.common.workload import measure_workload

from .app import app
from .context import attempts_exceeded, bound_device, store
from .contract import TaskFailed, TaskName, send
from .workflow import fail_resource, notify_waiters

logger = get_task_logger(__name__)
SPLIT_SEED = 0


@app.task(name=TaskName.profile_device.value, bind=True, pydantic=True)
def profile_device(self: Task, request: ProfileRequest) -> ProfileResult:
    """Measure T[b][f] and P[b][f] for the model and store the table for the device type."""
    device = bound_device(request.device_id)
    resource = table_resource(table_id(device.device_type, request.model, get_model(request.model).input_shape))
    if attempts_exceeded(self.request.id):
        reason = f"profiling on {request.device_id} was interrupted too many times (worker lost)"
        fail_resource(resource, reason)
        raise TaskFailed(reason)
    try:
        table = profile(
            device, get_model(request.model), request.batch_sizes, request.options,
            LearningRatePolicy(optimizer=request.optimizer), request.power_cap_w,
        )  # fmt: skip
    except Exception as exc:
        fail_resource(resource, f"profiling on {request.device_id} failed: {exc}")
        raise TaskFailed(f"profiling on {request.device_id} failed: {exc}") from exc
    s = store()
    tid = s.resources.put_table(table)
    s.coordination.release(resource)
    notify_waiters(resource)
    return ProfileResult(table_id=tid, points_measured=table.points_measured or 0, simulated=table.simulated)


@app.task(name=TaskName.finetune.value, bind=True, pydantic=True)
def finetune(self: Task, request: FinetuneRequest) -> RunReport | None:
    """Fine-tune with the selected (batch size, frequency) until the target accuracy."""
    bound_device(request.device_id)
    s = store()
    job_id, device_id = request.job_id, request.device_id
    part = s.jobs.part(job_id, device_id)
    if part.state != PartState.finetuning:  # done already (redelivered) or not selected
        logger.info("finetune %s/%s skipped: the part is %s", job_id, device_id, part.state.value)
        return None
    try:
        if attempts_exceeded(self.request.id):
            raise RuntimeError("fine-tuning was interrupted too many times (worker lost)")
        report = _finetune(request)
    except Exception as exc:
        reason = f"fine-tuning failed: {exc}"
        s.jobs.put_part(job_id, part.model_copy(update={"state": PartState.failed, "reason": reason}))
        s.jobs.event(job_id, EventKind.failed, f"failed: {reason}", device_id)
        raise TaskFailed(reason) from exc
    else:
        s.jobs.put_part(job_id, part.model_copy(update={"state": PartState.completed, "report": report}))
        s.jobs.event(job_id, EventKind.completed, f"completed, accuracy {report.final_accuracy:.3f}", device_id)
        return report
    finally:
        send(app, TaskName.advance_job, job_id)


def _finetune(request: FinetuneRequest) -> RunReport:
    s = store()
    device = bound_device(request.device_id)
    entry = get_model(request.model)
    data = load_dataset(request.dataset, entry, SPLIT_SEED)
    model = initial_model(request.model, request.weights, data.num_classes)
    device.bind_workload(measure_workload(request.model, model, entry.example_input(data.num_classes)))
    b, f = request.batch_size, request.frequency_hz
    trainer = Trainer(model, make_optimizer(model, request.lr, b), b, data.train, data.test, seed=request.seed)
    started = time.perf_counter()

    def progress(samples: int, accuracy: float, totals: DeviceTotals) -> None:
        s.jobs.set_progress(
            request.job_id, request.device_id,
            FinetuneProgress(
                samples=samples, accuracy=accuracy, device_time_s=totals.elapsed_s, energy_j=totals.energy_j,
                target_accuracy=request.target_accuracy, max_samples=request.max_samples,
            ),
        )  # fmt: skip

    device.set_frequency(f)
    try:
        outcome, totals = train_to_accuracy(
            trainer, request.target_accuracy, request.eval_every_samples, request.max_samples, request.seed, device, progress
        )
    finally:
        device.restore()
    return RunReport(
        device_id=request.device_id,
        device_type=device.device_type,
        simulated=device.simulated,
        batch_size=b,
        frequency_hz=f,
        reached=outcome.reached,
        final_accuracy=outcome.final_accuracy,
        samples_to_accuracy=outcome.samples_to_accuracy,
        samples_processed=outcome.samples_processed,
        steps=totals.steps,
        device_time_s=totals.elapsed_s,
        energy_j=totals.energy_j,
        peak_power_w=totals.peak_power_w,
        wall_s=time.perf_counter() - started,
    )
