"""Tasks that run on one device's queue (`device.<id>`): profiling and fine-tuning.

A task first checks that it reached the worker of the device it names; one that reached
another worker raises WrongDeviceError and changes nothing. Device workers run tasks in a pool
child, so a model that kills its process does not take the worker down: tasks/stopped.py (in
the worker's main process) fails the part or the table with the reason."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery import Task
from celery.exceptions import Reject
from celery.utils.log import get_task_logger
from redis import RedisError

from edgetrain.common.finetune.checkpoints import remove_checkpoints
from edgetrain.common.finetune.learned import FinetuneRecord, data_identity
from edgetrain.common.finetune.recipe import CancelledRun, FineTune, Options, Stopping, Superseded
from edgetrain.common.finetune.trust import proxy_check, proxy_family, trust_width
from edgetrain.common.jobs.events import (
    AttemptCancelled,
    AttemptFailed,
    AttemptFinished,
    AttemptNoticed,
    AttemptSelected,
    AttemptStarted,
    AttemptStopped,
    PartEvent,
    Refused,
    ReportMismatch,
    request_digest,
)
from edgetrain.common.jobs.state import CheckpointRef, EventKind, FinetuneProgress, PartState, Started
from edgetrain.common.keys import learned_key, similar_key, table_id
from edgetrain.common.models import get_model
from edgetrain.common.payloads import FinetuneRequest, ProfileRequest, ProfileResult, profile_resource
from edgetrain.common.profiling import profile
from edgetrain.common.schemas import LearningRatePolicy, RelationVector, RunReport
from edgetrain.common.store import Applied, JobNotFoundError, Store, Written
from edgetrain.common.tables import merge, storable_problem

from .app import app
from .context import attempts_exceeded, bound_device, settings, store
from .contract import TaskFailed, TaskName, describe
from .leases import attempt_token, worker_instance
from .reporting import finetune_reporter, profiling_reporter, task_line
from .workflow import advance_device, fail_resource, notify_waiters

logger = get_task_logger(__name__)
DEVICE_TASK_OPTIONS: dict[str, Any] = {"bind": True, "pydantic": True, "reject_on_worker_lost": False}


@app.task(name=TaskName.profile_device.value, **DEVICE_TASK_OPTIONS)
def profile_device(self: Task, request: ProfileRequest) -> ProfileResult | None:
    """Measure T[b][f] and P[b][f] for the model and store the table for the device type."""
    device = bound_device(request.device_id)
    s = store()
    resource = profile_resource(request)
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
            LearningRatePolicy(optimizer=request.optimizer), request.power_cap_w, profiling_reporter(self, request.device_id),
        )  # fmt: skip
    except Exception as exc:
        reason = f"profiling on {request.device_id} failed: {describe(exc)}"
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
    notify_waiters(resource, owner=request.owner)
    return ProfileResult(table_id=tid, points_measured=table.points_measured or 0, simulated=table.simulated)


@app.task(name=TaskName.finetune.value, **DEVICE_TASK_OPTIONS)
def finetune(self: Task, request: FinetuneRequest) -> RunReport | None:
    """Run the fine-tune the control worker dispatched as this task (common/finetune/recipe.py) as one
    attempt of its part: the part accepts it only for the task and request it dispatched and
    while no other attempt runs it; a checkpoint of an earlier attempt is continued from."""
    device = bound_device(request.device_id)
    s, job_id, device_id = store(), request.job_id, request.device_id
    attempt = attempt_token(self.request.id)
    checkpoint = s.jobs.checkpoint(job_id, device_id)
    started = AttemptStarted(
        dispatch=self.request.id, digest=request_digest(request), attempt=attempt, node=self.request.hostname or "?",
        resumed_at_samples=checkpoint.samples if checkpoint else None, **_lost_work(s, job_id, device_id, checkpoint),
    )  # fmt: skip
    try:
        s.jobs.apply(job_id, device_id, started)
    except (Refused, JobNotFoundError) as exc:
        logger.info("finetune %s/%s not run: %s", job_id, device_id, exc)
        return None
    if attempts_exceeded(self.request.id):
        _end(job_id, device_id, AttemptFailed(attempt=attempt, reason="fine-tuning was interrupted too many times (worker lost)"))
        return None
    worker = worker_instance(self)
    with contextlib.ExitStack() as ending:  # the run's partial record is taken down however it ends
        try:
            vector = s.resources.vector(request.vector_key)
            memory = _Memory(request, vector)
            ending.callback(memory.withdraw)
            recipe = FineTune(request, device, _Writer(job_id, device_id, attempt, finetune_reporter(self), task_line(self)), Options(
                attempt=attempt, artifact_dir=settings().artifact_dir, checkpoint_every_s=settings().checkpoint_every_s,
                stop_requested=_stop_flag(worker), table=s.resources.table(request.table_id), vector=vector,
                device_cap=lambda: s.fleet.power_cap(device_id), records=memory.records, similar=memory.similar(), publish=memory.publish,
                claim=memory.claim, trust=memory.trust(), data=memory.data,
            ))  # fmt: skip
            with _stopping_on_sigterm():
                recipe.setup(checkpoint)
                run = recipe.run()
        except Superseded as stop:
            logger.warning("finetune %s/%s: %s", job_id, device_id, stop.reason)
            return None
        except CancelledRun as stop:
            _end(job_id, device_id, AttemptCancelled(attempt=attempt, reason=stop.reason))
            return None
        except Stopping as stop:
            if _end(job_id, device_id, AttemptStopped(attempt=attempt, reason=stop.reason), advance=False) is not None:
                s.coordination.uncount_attempt(self.request.id)  # a clean stop is no lost worker: its next delivery is no retry
                raise Reject(stop.reason, requeue=True) from None  # back on the device's queue, for when a worker serves it again
            return None
        except Exception as exc:
            _end(job_id, device_id, AttemptFailed(attempt=attempt, reason=f"fine-tuning failed: {describe(exc)}"))
            raise TaskFailed(f"fine-tuning failed: {describe(exc)}") from exc
        ended = _end(job_id, device_id, AttemptFinished(attempt=attempt, report=run))
        if ended is not None and ended.part.state == PartState.completed:
            remove_checkpoints(job_id, device_id, settings().artifact_dir)
            if recipe.record is not None:
                memory.keep(recipe.record)
        return run


class _Memory:
    """What fine-tunes on this data measured (common/finetune/learned.py), kept in Redis for later jobs;
    the fine-tunes running on it now; and how far the proxy's r_b were on other data
    (common/finetune/trust.py). A read or write that fails is a warning: the run goes on with what it has
    (a stored entry that does not load here, a newer worker's, is left out by the store)."""

    def __init__(self, request: FinetuneRequest, prior: RelationVector | None):
        self.data = data_identity(request.dataset, settings().readable_data_roots())
        self.key = learned_key(request.model, request.weights, self.data, request.target_accuracy, request.lr)
        self.kind = similar_key(request.model, request.weights, request.dataset.name, request.lr)
        self.record_id, self.prior = f"{request.job_id}:{request.device_id}", prior
        self.family = proxy_family(prior.request) if prior else None
        self._kept, self._records = -1, list[FinetuneRecord]()
        self._live = list[FinetuneRecord]()

    def records(self) -> list[FinetuneRecord]:
        """The fine-tunes of this model and weights on this data, to this accuracy, kept so far
        (the list is read again only when one was kept since the last read), and the partial
        records of the others running on it now (not one that is kept already)."""
        try:
            kept, found = store().learned.records_if_new(self.key, self._kept)
            records = self._records if found is None else found
            live = store().learned.live(self.key, exclude={self.record_id, *(r.record_id for r in records)})
        except RedisError as exc:
            logger.warning("the records of %s were not read again: %s", self.key, exc)
            return self._records + self._live
        self._kept, self._records, self._live = kept, records, live
        return self._records + self._live

    def similar(self) -> dict[str, list[FinetuneRecord]]:
        """Fine-tunes of this model and weights under this learning-rate rule on other data of
        the same kind, by data key."""
        try:
            return store().learned.similar(self.kind, exclude=self.key)
        except RedisError as exc:
            logger.warning("the records of similar data were not read: %s", exc)
            return {}

    def trust(self) -> float:
        """How far the proxy's r_b is trusted on this data: from its checks on other data."""
        if self.family is None:
            return trust_width([])
        try:
            return trust_width(store().learned.checks(self.family, exclude=self.key))
        except RedisError as exc:
            logger.warning("the proxy's record on other data was not read: %s", exc)
            return trust_width([])

    def publish(self, record: FinetuneRecord) -> None:
        """Show this run's partial record to the runs on the same data meanwhile."""
        try:
            store().learned.publish(self.key, record)
        except RedisError as exc:
            logger.warning("the partial record of %s was not shown: %s", record.record_id, exc)

    def claim(self, start: FinetuneRecord) -> str | None:
        """Show this run's start unless another run on the same data trains its batch size solo
        now: then the record id of that run (not shown when Redis does not answer)."""
        try:
            return store().learned.claim(self.key, start)
        except RedisError as exc:
            logger.warning("the start of %s was not shown: %s", start.record_id, exc)
            return None

    def withdraw(self) -> None:
        """Take this run's partial record down: it ended (its record, if complete, is kept)."""
        try:
            store().learned.unpublish(self.key, self.record_id)
        except RedisError as exc:
            logger.warning("the partial record of %s was not taken down: %s", self.record_id, exc)

    def keep(self, record: FinetuneRecord) -> None:
        """Keep what a completed fine-tune measured, and how far the proxy was from it on this
        data. Its part is completed already: whatever fails here is a warning."""
        try:
            store().learned.put_record(self.key, self.kind, record)
            if self.prior is not None and self.family is not None:
                check = proxy_check(store().learned.records(self.key), self.prior, self.key)
                if check is not None:
                    store().learned.put_check(self.family, check)
        except Exception as exc:  # a completed part's task must not fail for the records of later jobs
            logger.warning("the record of %s was not kept: %s", record.record_id, describe(exc))


class _Writer:
    """What an attempt writes, through the store's fence on its token (common/finetune/recipe.py);
    its progress is also `shown` and the configuration it starts at `said` (Flower)."""

    def __init__(self, job_id: str, device_id: str, attempt: str, shown: Callable[[FinetuneProgress], None],
                 said: Callable[[str], None]):  # fmt: skip
        self.job_id, self.device_id, self.attempt, self.shown, self.said = job_id, device_id, attempt, shown, said

    def write(self, progress: FinetuneProgress | None = None, checkpoint: CheckpointRef | None = None,
              event: tuple[EventKind, str] | None = None) -> Written:  # fmt: skip
        written = store().jobs.attempt_write(self.job_id, self.device_id, self.attempt, progress, checkpoint, event)
        if progress is not None and written in (Written.ok, Written.cancel):
            self.shown(progress)
        return written

    def notice(self, notice: str | None) -> Written:
        return Written.ok if self._apply(AttemptNoticed(attempt=self.attempt, notice=notice)) else Written.stale

    def started(self, started: Started) -> Written:
        applied = self._apply(AttemptSelected(attempt=self.attempt, started=started))
        if applied is None:
            return Written.stale
        if applied.change.message:
            logger.info("finetune %s/%s %s", self.job_id, self.device_id, applied.change.message)
            self.said(applied.change.message)
        return Written.ok

    def _apply(self, event: PartEvent) -> Applied | None:
        try:
            return store().jobs.apply(self.job_id, self.device_id, event)
        except (Refused, JobNotFoundError):
            return None


_terminated = threading.Event()  # this pool process was sent SIGTERM while it fine-tunes


@contextlib.contextmanager
def _stopping_on_sigterm() -> Iterator[None]:
    """While a fine-tune runs, a SIGTERM to its process (systemd stops every process of a unit;
    Flower's Terminate) stops it at its next step, checkpointed, instead of killing it."""
    _terminated.clear()
    previous = signal.signal(signal.SIGTERM, lambda *_: _terminated.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_flag(worker: str, every_s: float = 1.0) -> Callable[[], str | None]:
    """Why the fine-tune must stop: this process was sent SIGTERM, or the worker instance
    `worker` is shutting down (asked of the store at most every `every_s` s); None: go on."""
    asked_at, shutting_down = 0.0, False

    def stopping() -> str | None:
        nonlocal asked_at, shutting_down
        if time.monotonic() - asked_at >= every_s:
            asked_at, shutting_down = time.monotonic(), store().liveness.stop_requested(worker)
        if shutting_down or _terminated.is_set():
            return "its worker is shutting down: checkpointed and stopped"
        return None

    return stopping


def _lost_work(s: Store, job_id: str, device_id: str, checkpoint: CheckpointRef | None) -> dict[str, Any]:
    """What the previous attempt trained after its last checkpoint (device s and J): lost with it."""
    progress = s.jobs.progress(job_id, device_id)
    if progress is None:
        return {"lost_device_time_s": 0.0, "lost_energy_j": 0.0}
    kept_s, kept_j = (checkpoint.device_time_s, checkpoint.energy_j) if checkpoint else (0.0, 0.0)
    return {"lost_device_time_s": max(0.0, progress.device_time_s - kept_s), "lost_energy_j": max(0.0, progress.energy_j - kept_j),
            "lost_at": progress.updated_at}  # fmt: skip


def _end(job_id: str, device_id: str, event: PartEvent, advance: bool = True) -> Applied | None:
    """Report how an attempt ended and advance the job; a report that does not match the
    dispatched fine-tune fails the part with the reason. None when the attempt no longer holds it."""
    try:
        applied = store().jobs.apply(job_id, device_id, event)
    except ReportMismatch as exc:
        assert isinstance(event, AttemptFinished)
        applied = store().jobs.apply(job_id, device_id, AttemptFailed(attempt=event.attempt, reason=str(exc)))
    except Refused as exc:
        logger.warning("finetune %s/%s: %s refused: %s", job_id, device_id, event.kind, exc)
        return None
    if advance:
        advance_device(job_id, device_id)
    return applied
