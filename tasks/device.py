"""Tasks that run on one device's queue (`device.<id>`): profiling and fine-tuning.

A task first checks that it reached the worker of the device it names; one that reached
another worker raises WrongDeviceError and changes nothing. Device workers run tasks in a pool
child, so a model that kills its process does not take the worker down: `on_lost_child`
(in the worker's main process) fails the part or the table with the reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.utils.log import get_task_logger

from edgetrain.common.adaptive import AdaptiveControl, CapFollower, Switched
from edgetrain.common.artifacts import initial_model
from edgetrain.common.checkpoints import (
    checkpoint_name,
    load_checkpoint,
    save_checkpoint,
)
from edgetrain.common.datasets.loading import load_dataset
from edgetrain.common.devices.base import Device
from edgetrain.common.jobs import (
    AttemptLog,
    CheckpointRef,
    EventKind,
    FinetuneProgress,
    PartState,
)
from edgetrain.common.keys import table_id, table_resource
from edgetrain.common.models import get_model
from edgetrain.common.payloads import FinetuneRequest, ProfileRequest, ProfileResult
from edgetrain.common.planner import resource_ids, strategy_for
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import ConfigSwitch, LearningRatePolicy, PowerGuardReport, RunReport
from edgetrain.common.tables import merge, storable_problem
from edgetrain.common.training import (
    DeviceTotals,
    Trainer,
    make_optimizer,
    train_to_accuracy,
)
from edgetrain.common.workload import measure_workload

from .app import app
from .context import attempts_exceeded, bound_device, bound_device_id, settings, store
from .contract import TaskFailed, TaskName
from .workflow import advance_device, fail_resource, notify_waiters

logger = get_task_logger(__name__)
SPLIT_SEED = 0
DEVICE_TASK_OPTIONS: dict[str, Any] = {"bind": True, "pydantic": True, "reject_on_worker_lost": False}


def _table_resource(request: ProfileRequest) -> str:
    return table_resource(table_id(request.device_type, request.model, get_model(request.model).input_shape))


@app.task(name=TaskName.profile_device.value, **DEVICE_TASK_OPTIONS)
def profile_device(self: Task, request: ProfileRequest) -> ProfileResult | None:
    """Measure T[b][f] and P[b][f] for the model and store the table for the device type."""
    device = bound_device(request.device_id)
    s = store()
    resource = _table_resource(request)
    if s.coordination.holder(resource) != request.owner:  # released after a lost attempt, and re-planned
        logger.info("profile request of %s is stale: %s no longer holds %s", request.device_id, request.owner, resource)
        return None
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
        reason = f"profiling on {request.device_id} failed: {_describe(exc)}"
        fail_resource(resource, reason)
        raise TaskFailed(reason) from exc
    if problem := storable_problem(table):  # never store an empty table over a good one
        reason = f"profiling on {request.device_id}: {problem}"
        fail_resource(resource, reason)
        raise TaskFailed(reason)
    current = s.resources.table(table_id(request.device_type, request.model, get_model(request.model).input_shape))
    if request.merge and current is not None:
        try:
            table = merge(current, table)
        except ValueError as exc:
            logger.warning("profile of %s stored alone: %s", request.device_id, exc)
    tid = s.resources.put_table(table)
    s.coordination.release(resource)
    notify_waiters(resource)
    return ProfileResult(table_id=tid, points_measured=table.points_measured or 0, simulated=table.simulated)


@app.task(name=TaskName.finetune.value, **DEVICE_TASK_OPTIONS)
def finetune(self: Task, request: FinetuneRequest) -> RunReport | None:
    """Fine-tune with the selected (batch size, frequency) until the target accuracy,
    continuing from the last checkpoint when an earlier attempt died."""
    bound_device(request.device_id)
    s = store()
    job_id, device_id = request.job_id, request.device_id
    if s.jobs.part(job_id, device_id).state != PartState.finetuning:  # done already (redelivered) or not selected
        logger.info("finetune %s/%s skipped: the part is %s", job_id, device_id, s.jobs.part(job_id, device_id).state.value)
        return None
    try:
        if attempts_exceeded(self.request.id):
            raise RuntimeError("fine-tuning was interrupted too many times (worker lost)")
        report = _finetune(request)
    except Cancelled as stop:
        reason = f"cancelled after {stop.samples} samples; the device's settings were restored"
        if s.jobs.update_part(job_id, device_id, {"state": PartState.cancelled, "reason": reason, "waiting": None}, PartState.finetuning):
            s.jobs.event(job_id, EventKind.cancelled, reason, device_id)
        advance_device(job_id, device_id)
        return None
    except Exception as exc:
        _fail_part(job_id, device_id, f"fine-tuning failed: {_describe(exc)}")
        raise TaskFailed(f"fine-tuning failed: {_describe(exc)}") from exc
    changes = {"state": PartState.completed, "report": report, "waiting": None}
    if s.jobs.update_part(job_id, device_id, changes, PartState.finetuning):
        s.jobs.event(job_id, EventKind.completed, f"completed, accuracy {report.final_accuracy:.3f}", device_id)
    (settings().artifact_dir / checkpoint_name(job_id, device_id)).unlink(missing_ok=True)
    advance_device(job_id, device_id)
    return report


class Cancelled(Exception):
    """The job of a running fine-tune was cancelled: it stops where it is."""

    def __init__(self, samples: int):
        super().__init__(f"cancelled after {samples} samples")
        self.samples = samples


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"exceeded its time limit ({type(exc).__name__})"
    return str(exc) or type(exc).__name__


def _fail_part(job_id: str, device_id: str, reason: str) -> None:
    s = store()
    if s.jobs.update_part(job_id, device_id, {"state": PartState.failed, "reason": reason, "waiting": None}, PartState.finetuning):
        s.jobs.event(job_id, EventKind.failed, f"failed: {reason}", device_id)
    advance_device(job_id, device_id)


def _count_attempt(request: FinetuneRequest) -> AttemptLog:
    """Count this attempt; a previous one that died lost its work after its last checkpoint
    (up to its last progress report)."""
    s = store()
    log = s.jobs.attempt_log(request.job_id, request.device_id)
    progress = s.jobs.progress(request.job_id, request.device_id)
    if log.attempts and progress is not None:
        checkpoint = s.jobs.checkpoint(request.job_id, request.device_id)
        kept_s, kept_j = (checkpoint.device_time_s, checkpoint.energy_j) if checkpoint else (0.0, 0.0)
        log.lost_device_time_s += max(0.0, progress.device_time_s - kept_s)
        log.lost_energy_j += max(0.0, progress.energy_j - kept_j)
    log.attempts += 1
    s.jobs.set_attempt_log(request.job_id, request.device_id, log)
    return log


def _finetune(request: FinetuneRequest) -> RunReport:
    s = store()
    job_id, device_id = request.job_id, request.device_id
    device = bound_device(device_id)
    log = _count_attempt(request)
    entry = get_model(request.model)
    data = load_dataset(request.dataset, entry, SPLIT_SEED)
    model = initial_model(request.model, request.weights, data.num_classes, settings().artifact_dir)
    device.bind_workload(measure_workload(request.model, model, entry.example_input(data.num_classes)))
    b, f = request.batch_size, request.frequency_hz
    trainer = Trainer(model, make_optimizer(model, request.lr, b), b, data.train, data.test, seed=request.seed)
    totals = None
    checkpoint = s.jobs.checkpoint(job_id, device_id)
    if log.attempts > 1 and checkpoint is not None:
        totals = load_checkpoint(checkpoint.url, settings().artifact_dir, trainer)
        resumed = f"attempt {log.attempts} resumed from the checkpoint at {trainer.samples} samples"
        s.jobs.event(job_id, EventKind.resumed, resumed, device_id)
    store_dir, name, every_s = settings().artifact_dir, checkpoint_name(job_id, device_id), settings().checkpoint_every_s
    started = last_checkpoint = time.perf_counter()

    def report_progress(samples: int, accuracy: float, run: DeviceTotals) -> None:
        s.jobs.set_progress(
            job_id, device_id,
            FinetuneProgress(
                samples=samples, accuracy=accuracy, device_time_s=run.elapsed_s, energy_j=run.energy_j,
                target_accuracy=request.target_accuracy, max_samples=request.max_samples,
                batch_size=trainer.batch_size, frequency_hz=control.frequency_hz if control else f,
                power_cap_w=control.cap_w if control else None, paused=control.paused if control else None,
            ),
        )  # fmt: skip

    def on_evaluation(samples: int, accuracy: float, run: DeviceTotals) -> None:
        nonlocal last_checkpoint
        if s.jobs.cancelled(job_id):
            raise Cancelled(samples)
        report_progress(samples, accuracy, run)
        if time.perf_counter() - last_checkpoint >= every_s:
            url = save_checkpoint(trainer, run, name, store_dir)
            ref = CheckpointRef(url=url, samples=samples, steps=trainer.steps, device_time_s=run.elapsed_s, energy_j=run.energy_j)
            s.jobs.set_checkpoint(job_id, device_id, ref)
            last_checkpoint = time.perf_counter()

    def on_switch(switch: ConfigSwitch, run: DeviceTotals) -> None:
        s.jobs.event(job_id, EventKind.reconfigured, switch.line().strip(), device_id)
        if switch.cause in ("pause", "resume"):
            waiting = f"paused: {switch.note}" if switch.cause == "pause" else None
            s.jobs.update_part(job_id, device_id, {"waiting": waiting}, PartState.finetuning)
        if run.history:
            report_progress(trainer.samples, run.history[-1][1], run)

    def while_paused() -> None:
        if s.jobs.cancelled(job_id):
            raise Cancelled(trainer.samples)

    control = _adaptive_control(request, device, trainer, on_switch, while_paused)
    device.set_frequency(f)
    try:
        outcome, totals = train_to_accuracy(
            trainer, request.target_accuracy, request.eval_every_samples, request.max_samples, request.seed, device,
            on_evaluation, totals, control,
        )  # fmt: skip
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
        attempts=log.attempts,
        lost_device_time_s=log.lost_device_time_s,
        lost_energy_j=log.lost_energy_j,
        switches=control.switches if control else [],
        paused_s=control.paused_s if control else 0.0,
        guard=control.guard.report if control else PowerGuardReport(peak_power_w=totals.peak_power_w),
    )


def _adaptive_control(request: FinetuneRequest, device: Device, trainer: Trainer, on_switch: Switched,
                      while_paused: Callable[[], None]) -> AdaptiveControl | None:  # fmt: skip
    """The control that follows the device's cap with the job's strategy, or None (with an
    event saying so) when the job's table or vector is no longer stored."""
    s = store()
    record = s.jobs.record(request.job_id)
    assert record is not None, "a fine-tune's job is stored"
    target = next(t for t in record.spec.devices if t.device_id == request.device_id)
    tid, vkey = resource_ids(record.spec, device.device_type)
    table, vector = s.resources.table(tid), s.resources.vector(vkey)
    if table is None or vector is None:
        s.jobs.event(request.job_id, EventKind.reconfigured, "the lookup table or relation vector is gone: cap changes are "
                     "not followed", request.device_id)  # fmt: skip
        return None
    caps = CapFollower(target, lambda: s.fleet.power_cap(request.device_id))
    return AdaptiveControl(
        device, trainer, request.lr, table, strategy_for(record.spec, target, vector), caps, target.cap_at(0.0), request.frequency_hz,
        on_switch=on_switch, while_paused=while_paused,
    )  # fmt: skip


def on_lost_child(sender: Task | None = None, task_id: str = "", exception: BaseException | None = None,
                  args: tuple[Any, ...] = (), **_: Any) -> None:  # fmt: skip
    """task_failure in a device worker's main process: the pool child running a device task
    died (a crash, the out-of-memory killer) or hit its hard time limit. The worker lives on;
    the part or the table fails with what happened, and the device's settings are restored."""
    if sender is None or not isinstance(exception, (WorkerLostError, TimeLimitExceeded)) or not args:
        return
    what = f"exceeded its time limit ({exception})" if isinstance(exception, TimeLimitExceeded) else f"its process died: {exception}"
    device_id = bound_device_id()
    if device_id is not None:
        bound_device(device_id).restore()
    store().liveness.release(task_id)
    if sender.name == TaskName.finetune.value:
        request = FinetuneRequest.model_validate(args[0])
        _fail_part(request.job_id, request.device_id, f"fine-tuning on {request.device_id} {what}")
    elif sender.name == TaskName.profile_device.value:
        request_p = ProfileRequest.model_validate(args[0])
        resource = _table_resource(request_p)
        if store().coordination.holder(resource) == request_p.owner:
            fail_resource(resource, f"profiling on {request_p.device_id} {what}")
