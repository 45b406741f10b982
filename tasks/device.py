"""Tasks that run on one device's queue (`device.<id>`): profiling and fine-tuning."""

from __future__ import annotations

import time

from celery import Task

from edgetrain.common.artifacts import initial_model
from edgetrain.common.datasets import load_dataset
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import LearningRatePolicy, PartState, ProfilingOptions, RunReport
from edgetrain.common.store import table_id
from edgetrain.common.training import DeviceTotals, Trainer, make_optimizer, train_to_accuracy
from edgetrain.common.workload import measure_workload

from .app import app
from .context import attempts_exceeded, bound_device, store
from .workflow import advance_job, fail_resource, notify_waiters, table_resource

SPLIT_SEED = 0


@app.task(name="edgetrain.profile_device", bind=True)
def profile_device(
    self: Task,
    device_id: str,
    model: str,
    batch_sizes: list[int],
    options: dict,
    lr: dict,
    power_cap_w: float | None = None,
) -> dict:
    """Measure T[b][f] and P[b][f] for `model` and store the table for the device type."""
    device = bound_device(device_id)
    entry = get_model(model)
    resource = table_resource(table_id(device.device_type, model, entry.input_shape))
    s = store()
    if attempts_exceeded(self.request.id):
        fail_resource(resource, f"profiling on {device_id} was interrupted too many times (worker lost)")
        return {"failed": "worker lost"}
    try:
        table = profile(
            device, entry, batch_sizes, ProfilingOptions.model_validate(options),
            LearningRatePolicy.model_validate(lr), power_cap_w,
        )  # fmt: skip
    except Exception as exc:
        fail_resource(resource, f"profiling on {device_id} failed: {exc}")
        raise
    tid = s.put_table(table)
    s.release(resource)
    notify_waiters(resource)
    return {"table": tid, "points": table.points_measured, "simulated": table.simulated}


@app.task(name="edgetrain.finetune", bind=True)
def finetune(self: Task, job_id: str, device_id: str) -> dict:
    """Fine-tune with the selected (batch size, frequency) until the target accuracy."""
    s = store()
    part = s.part(job_id, device_id)
    if part.state != PartState.finetuning:  # done already (redelivered) or not selected
        return {"skipped": part.state.value}
    try:
        if attempts_exceeded(self.request.id):
            raise RuntimeError("fine-tuning was interrupted too many times (worker lost)")
        report = _finetune(job_id, device_id)
        s.put_part(job_id, part.model_copy(update={"state": PartState.completed, "report": report}))
        s.event(job_id, f"{device_id}: completed, accuracy {report.final_accuracy:.3f}")
        return report.model_dump(mode="json")
    except Exception as exc:
        s.put_part(job_id, part.model_copy(update={"state": PartState.failed, "reason": f"fine-tuning failed: {exc}"}))
        s.event(job_id, f"{device_id}: failed: fine-tuning failed: {exc}")
        return {"failed": str(exc)}
    finally:
        advance_job.delay(job_id)


def _finetune(job_id: str, device_id: str) -> RunReport:
    s = store()
    spec = s.job_spec(job_id)
    part = s.part(job_id, device_id)
    target = next(d for d in spec.devices if d.device_id == device_id)
    device = bound_device(device_id)
    entry = get_model(spec.model)
    data = load_dataset(spec.dataset_for(target), entry, SPLIT_SEED)
    model = initial_model(spec.model, spec.weights, data.num_classes)
    device.bind_workload(measure_workload(spec.model, model, entry.example_input(data.num_classes)))
    b, f = part.selection.batch_size, part.selection.frequency_hz
    trainer = Trainer(model, make_optimizer(model, spec.lr, b), b, data.train, data.test, seed=spec.seeds[0])
    started = time.perf_counter()

    def progress(samples: int, accuracy: float, totals: DeviceTotals) -> None:
        s.set_progress(
            job_id, device_id, samples=samples, accuracy=accuracy, device_time_s=totals.elapsed_s,
            energy_j=totals.energy_j, target=spec.target_accuracy, max_samples=spec.max_samples,
        )  # fmt: skip

    device.set_frequency(f)
    try:
        outcome, totals = train_to_accuracy(
            trainer, spec.target_accuracy, spec.eval_every_samples, spec.max_samples, spec.seeds[0], device, progress
        )
    finally:
        device.restore()
    return RunReport(
        device_id=device_id,
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
