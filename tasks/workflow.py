"""The job workflow: advances on events and never waits on a result inside a task.

`plan_submitted` takes up the jobs submitted since the last planning step, read together, and
does each one's first step as `advance_job` does.

`advance_job` reads each device's part of a job from the store, asks the planner
(common/jobs/planner.py) for its next step, applies the step's event to the part and, when it
applied, carries out the step's effects: it claims and dispatches profiling and estimation,
and sends `finetune` once a selection is recorded. Tasks that produce a table or a vector
advance every job waiting on it. Repeated or concurrent advances of a page are harmless
without a lock: a part's change is written only if the part is still as read
(common/store/jobs.py), and claims and once-only markers in Redis keep the rest to one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable

from celery.exceptions import SoftTimeLimitExceeded
from celery.utils.log import get_task_logger

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.ids import checked_id
from edgetrain.common.jobs.admission import job_refusal
from edgetrain.common.jobs.effects import AwaitDevice, ClaimAndEstimate, ClaimAndProfile, Note, ReleaseTableClaim, SendFineTune
from edgetrain.common.jobs.events import Failed, PartEvent, Refused
from edgetrain.common.jobs.planner import PartView, Step, plan, resource_ids
from edgetrain.common.jobs.state import (
    TERMINAL,
    DevicePart,
    EventField,
    EventKind,
    JobRecord,
    JobState,
)
from edgetrain.common.keys import table_resource, vector_resource
from edgetrain.common.limits import RECORDS_KEPT
from edgetrain.common.payloads import FinetuneRequest, JobPage, device_page
from edgetrain.common.schemas import (
    DeviceInfo,
    DeviceTarget,
    JobSpec,
    utc_now,
)
from edgetrain.common.store import Applied, JobNotFoundError, SetAside, Store
from edgetrain.common.store.coordination import ResourceFailure
from edgetrain.common.store.jobs import PageRead

from .app import app
from .context import settings, store
from .contract import TaskName, device_queue, send, send_again, send_tracked, wake_ups
from .effects import claim_and_estimate, claim_and_profile
from .held_messages import CONTROL_TASK_OPTIONS

logger = get_task_logger(__name__)


def notify_waiters(resource: str, owner: str | None = None) -> bool:
    """A table or vector is ready: release its claim (with an `owner`, only while it holds the
    claim: False otherwise) and advance every job waiting for it; the release and the wake-ups
    are one transaction, and a wake-up is in the ledger of sent tasks until it has run."""
    return _settle(resource, owner=owner)


def fail_resource(resource: str, reason: str, owner: str | None = None) -> None:
    """Producing a table or vector failed: record why for the jobs waiting on this attempt
    (and the one that claimed it), free its claim and wake them, in one transaction (with an
    `owner`, only while it holds the claim). Jobs that come later try again."""
    if _settle(resource, owner, reason):
        logger.warning("%s failed: %s", resource, reason)


def fail_vector(key: str, reason: str) -> None:
    """Estimating relation vector `key` failed: forget its request, so that its runs still
    queued or handed on are skipped (`train_proxy`), then `fail_resource` with `reason`."""
    store().resources.forget_vector_request(key)
    fail_resource(vector_resource(key), reason)


def _settle(resource: str, owner: str | None = None, reason: str | None = None) -> bool:
    """`Coordination.settle` `resource` and send the wake-ups; False when `owner` does not hold it."""
    woken = store().coordination.settle(resource, wake_ups, owner, reason)
    for sent in woken or ():
        send_again(app, sent)
    return woken is not None


def _resource_ids(spec: JobSpec, device_type: str) -> tuple[str, str] | None:
    """The table and vector a device type's parts need, or None where naming them fails (a
    model that cannot be loaded): `view` raises it again for each part, which fails with it."""
    try:
        return resource_ids(spec, device_type)
    except Exception:
        return None


class _Reads:
    """What the planner needs for pages of one or more jobs, read together in three commands:
    their parts and registered devices, the tables and vectors of those devices' types, and the
    tables' failures (a stored table may not serve, so its failure is read in any case)."""

    def __init__(self, s: Store, pages: list[tuple[JobRecord, list[DeviceTarget]]]):
        self.s = s
        self.pages = s.jobs.parts_and_devices([(r.job_id, [t.device_id for t in targets]) for r, targets in pages])
        self._needed_by: dict[str, set[str]] = {}  # the key of a table or vector -> the jobs that need it
        tids, vkeys = set(), set()
        for (record, _), read in zip(pages, self.pages):
            for tid, vkey in filter(None, (_resource_ids(record.spec, t) for t in _open_types(read))):
                tids.add(tid)
                vkeys.add(vkey)
                for key in (s.keys.table(tid), s.keys.vector(vkey)):
                    self._needed_by.setdefault(key, set()).add(record.job_id)
        self.tables, self.vectors = s.resources.tables_and_vectors(sorted(tids), sorted(vkeys), self._set_aside)
        self.failures: dict[str, ResourceFailure | None] = s.coordination.failures([table_resource(t) for t in sorted(tids)])

    def _set_aside(self, record: SetAside) -> None:
        for job_id in sorted(self._needed_by.get(record.key, ())):
            set_aside(self.s, job_id, record)


def _open_types(read: PageRead) -> set[str]:
    """The device types of the page's parts that are not finished (those a step plans): a late
    step of a finished job reads no table or vector."""
    try:
        finished = {p.device_id for p in read.parts() if p.state in TERMINAL}
    except JobNotFoundError:  # the step fails on it
        finished = set()
    return {d.device_type for device_id, d in read.devices.items() if device_id not in finished}


def set_aside(s: Store, job_id: str, record: SetAside) -> None:
    """A table or vector job `job_id` needs no longer loaded and was set aside: say so (it reads
    as not stored, so the planner has it produced again)."""
    logger.warning("job %s: %s", job_id, record.line())
    s.jobs.event(job_id, EventKind.set_aside, record.line())


class _Reader:
    """What the planner sees of each part of one page of a job, from the page's `_Reads`; a
    vector's failure is read only where the vector is missing."""

    def __init__(self, reads: _Reads, record: JobRecord, devices: dict[str, DeviceInfo]):
        self.s, self.job_id, self.spec, self.record, self._devices = reads.s, record.job_id, record.spec, record, devices
        self._tables, self._vectors, self._failures = reads.tables, reads.vectors, reads.failures

    def view(self, target: DeviceTarget, part: DevicePart) -> PartView:
        s = self.s
        device = self._devices.get(target.device_id)
        if device is None:
            registered = tuple(d.device_id for d in s.fleet.devices())
            seen = s.fleet.last_seen(target.device_id)
            return PartView(
                self.job_id, self.spec, target, part, None,
                registered=registered, last_seen=seen, heartbeat_ttl_s=settings().heartbeat_ttl_s, now=utc_now(),
                cancelled_at=self.record.cancelled_at, submitted_at=self.record.created_at,
            )  # fmt: skip
        tid, vkey = resource_ids(self.spec, device.device_type)
        if tid not in self._tables or vkey not in self._vectors:  # its model failed to load for the page's read, not now
            tables, vectors = s.resources.tables_and_vectors([tid], [vkey], self._set_aside)
            self._tables, self._vectors = self._tables | tables, self._vectors | vectors
        return PartView(
            self.job_id, self.spec, target, part, device,
            table=self._tables[tid],
            vector=self._vectors[vkey],
            table_failure=self._failure(table_resource(tid), part),
            vector_failure=self._failure(vector_resource(vkey), part) if self._vectors[vkey] is None else None,
            not_before=self.record.created_at if self.spec.profiling.force else None,
            now=utc_now(),
            cancelled_at=self.record.cancelled_at,
            token=uuid.uuid4().hex,
        )  # fmt: skip

    def _set_aside(self, record: SetAside) -> None:
        set_aside(self.s, self.job_id, record)

    def _failure(self, resource: str, part: DevicePart) -> str | None:
        """Why producing `resource` failed for this job, unless the part was re-queued since."""
        if resource not in self._failures:
            self._failures[resource] = self.s.coordination.failure(resource)
        failure = self._failures[resource]
        if failure is None or (part.requeued_at is not None and failure.at <= part.requeued_at):
            return None
        return failure.for_job(self.job_id)


def advance_device(job_id: str, device_id: str) -> None:
    """Advance the page of job `job_id` that holds `device_id` (its part changed)."""
    position = store().jobs.position(job_id, device_id)
    if position is not None:
        send(app, TaskName.advance_page, device_page(job_id, position, settings().page_size))


PLAN_BATCH = 100  # submitted jobs one planning step takes up, at most


@app.task(name=TaskName.plan_submitted.value, **CONTROL_TASK_OPTIONS)
def plan_submitted(rang_for: str) -> str:
    """Take up the jobs submitted since the last planning step, oldest first, and do the next
    step of each (as `advance_job`). Job `rang_for` rang the doorbell; the step waits
    `plan_window_s`, or until PLAN_EARLY_AT jobs rang, and the jobs submitted meanwhile come
    along: one message, and one read of their records, for them all. A job is struck off the
    jobs not taken up once its step is done, so a step lost midway takes it up again. Returns
    which jobs it took up, each with what its step did (as `advance_job`): what Flower shows as
    its result."""
    checked_id(rang_for, "job_id")  # a payload pushed past the client
    s = store()
    s.jobs.wait_to_plan(settings().plan_window_s)
    job_ids = s.jobs.answer_doorbell(PLAN_BATCH)
    done: dict[str, str] = {}
    try:
        _take_up(s, job_ids, done)
    except SoftTimeLimitExceeded:
        logger.warning("plan_submitted ran out of time after %d of %d jobs; sent again", len(done), len(job_ids))
        send(app, TaskName.plan_submitted, rang_for)
        raise
    finally:
        s.jobs.planned(list(done))
    if len(job_ids) == PLAN_BATCH:  # more may wait: the next step takes them up, not these again
        send(app, TaskName.plan_submitted, rang_for)
    return f"took up {len(done)} job(s): " + ", ".join(f"{job_id} {outcome}" for job_id, outcome in done.items())


def _take_up(s: Store, job_ids: list[str], done: dict[str, str]) -> None:
    """Do the next step of each job, the pages of those of one page read together; note in
    `done` each job whose step was done (or that has no readable record) and what it did (as
    `advance_job` returns)."""
    records = s.jobs.records(job_ids)
    one_page = [(r, _page_targets(r, 0)) for r in records if r is not None and _pages(r) == 1]
    reads, at = _Reads(s, one_page), {r.job_id: (i, targets) for i, (r, targets) in enumerate(one_page)}
    for job_id, record in zip(job_ids, records):
        if record is None:
            logger.warning("plan_submitted: no readable job %s", job_id)
            outcome = "unknown job"
        else:
            try:
                if job_id in at:
                    outcome = _step_page(record, at[job_id][1], reads, at[job_id][0])
                else:
                    outcome = _next_step(record)
            except SoftTimeLimitExceeded:
                raise
            except Exception:  # not struck off: the reaper sends it `advance_job` a lease after its submission
                logger.exception("plan_submitted: the step of job %s failed", job_id)
                continue
        done[job_id] = outcome


@app.task(name=TaskName.advance_job.value, **CONTROL_TASK_OPTIONS)
def advance_job(job_id: str) -> str:
    """Do the next step of every device part of job `job_id`: at once for a job of one page,
    else one `advance_page` task per page (control workers run them side by side, and no read
    grows with the fleet). Returns what it did: "advanced", "paged", or the job's state when
    this step finished it (what Flower shows as its result)."""
    record = store().jobs.take_up(job_id)
    if record is None and store().federated.record(job_id) is not None:  # a table it waited for is stored
        send(app, TaskName.federated_advance, job_id)
        return "federated"
    if record is None:
        logger.warning("advance_job: no job %s", job_id)
        return "unknown job"
    return _again_if_out_of_time(TaskName.advance_job, job_id, lambda: _next_step(record))


def _next_step(record: JobRecord) -> str:
    """The next step of every part of a job: at once for one page, else a task per page."""
    if _pages(record) == 1:
        return _advance_page(record, 0)
    pages_of = [JobPage(job_id=record.job_id, page=page) for page in range(_pages(record))]
    send_tracked(app, store().ledger, TaskName.advance_page, pages_of, job_id=record.job_id)  # a lost page would wait for good
    return "paged"


@app.task(name=TaskName.advance_page.value, pydantic=True, **CONTROL_TASK_OPTIONS)
def advance_page(page: JobPage) -> str:
    """Do the next step of the parts of one page of a job; returns "advanced", or the job's
    state when this step finished it."""
    record = store().jobs.record(page.job_id)
    if record is None:
        logger.warning("advance_page: no job %s", page.job_id)
        return "unknown job"
    return _again_if_out_of_time(TaskName.advance_page, page, lambda: _advance_page(record, page.page))


def _again_if_out_of_time(task: TaskName, payload: str | JobPage, step: Callable[[], str]) -> str:
    """Run a job's step; when it runs out of time (its soft time limit: Redis slow, say), send it
    again, so its parts not planned yet are planned by the next run, and let the limit end this one."""
    try:
        return step()
    except SoftTimeLimitExceeded:
        logger.warning("%s %s ran out of time; sent again", task.value, payload)
        send(app, task, payload)
        raise


def _pages(record: JobRecord) -> int:
    return math.ceil(len(record.spec.devices) / settings().page_size)


def _page_targets(record: JobRecord, page: int) -> list[DeviceTarget]:
    size = settings().page_size
    return record.spec.devices[page * size : (page + 1) * size]


def _advance_page(record: JobRecord, page: int) -> str:
    targets = _page_targets(record, page)
    return _step_page(record, targets, _Reads(store(), [(record, targets)]), 0)


def _step_page(record: JobRecord, targets: list[DeviceTarget], reads: _Reads, at: int) -> str:
    """The step of a page of job `record`: its `targets`, read as `reads.pages[at]`."""
    job_id = record.job_id
    refusal = _refusal(record)  # a spec written past the client
    read = reads.pages[at]
    parts, reader = read.parts(), _Reader(reads, record, read.devices)
    finished: JobState | None = None
    for target, part in zip(targets, parts):
        if part.state in TERMINAL:
            continue
        if refusal:
            finished = _finished(report(job_id, part.device_id, Failed(reason=refusal))) or finished
            continue
        try:
            finished = carry_out(job_id, part, plan(reader.view(target, part))) or finished
        except SoftTimeLimitExceeded:  # the step, not the part, is out of time
            raise
        except Exception as exc:  # a bug or a model this worker cannot load: fail the part, say why
            logger.exception("advancing %s/%s failed", job_id, part.device_id)
            finished = _finished(report(job_id, part.device_id, Failed(reason=f"planning failed: {type(exc).__name__}: {exc}"))) or finished
    return finished.value if finished else "advanced"


def _finished(applied: Applied | None) -> JobState | None:
    """The job's state when the change finished it (what Flower shows as the step's result)."""
    return applied.finished if applied else None


def _refusal(record: JobRecord) -> str | None:
    """Why this worker refuses the job's spec, or None; checked once per job and process (a
    job's spec does not change, and checking one of 10 000 devices takes a page step's time)."""
    if record.job_id not in _refusals:
        while len(_refusals) >= RECORDS_KEPT:
            del _refusals[next(iter(_refusals))]
        _refusals[record.job_id] = job_refusal(record.spec, settings().allowed_model_modules)
    return _refusals[record.job_id]


_refusals: dict[str, str | None] = {}


def report(job_id: str, device_id: str, event: PartEvent, seen: DevicePart | None = None) -> Applied | None:
    """Apply an event to a part (common/jobs/events.py decides; the store writes it only if the
    part is still as decided on: `seen`, as this step read it, else as read again); None when it
    does not apply to the part as it is now (logged)."""
    try:
        return store().jobs.apply(job_id, device_id, event, seen)
    except Refused as exc:
        logger.info("%s/%s: %s refused: %s", job_id, device_id, event.kind, exc)
        return None


def carry_out(job_id: str, part: DevicePart, step: Step) -> JobState | None:
    """Apply the step's event to the part (as the step read it) and, when it applied, carry out
    its effects; returns the job's state when the event finished it. A fine-tune is sent after
    its dispatch is recorded, so a crash in between leaves a dispatched part without a task,
    which the reaper sends again."""
    applied = report(job_id, part.device_id, step.event, part) if step.event is not None else None
    if step.event is not None and applied is None:
        return None
    s = store()

    def log(message: str, device: str | None, fields: dict[str, EventField]) -> None:
        s.jobs.event(job_id, EventKind.profiling if device else EventKind.estimating, message, device, fields)

    for effect in step.effects:
        if isinstance(effect, ClaimAndProfile):
            claim_and_profile(job_id, effect, log)
        elif isinstance(effect, ClaimAndEstimate):
            claim_and_estimate(job_id, effect, log)
        elif isinstance(effect, SendFineTune):
            dispatch_fine_tune(effect.token, effect.request, effect.control)
        elif isinstance(effect, AwaitDevice):  # the reaper advances the job when the device registers, or then
            s.fleet.await_device(effect.device_id, effect.by)
        elif isinstance(effect, ReleaseTableClaim):
            notify_waiters(table_resource(effect.table_id), owner=job_id)
        elif isinstance(effect, Note) and s.coordination.once(effect.once):
            s.jobs.event(job_id, effect.kind, effect.message, effect.device_id)
    return _finished(applied)


def dispatch_fine_tune(token: str, request: FinetuneRequest, control: ControlAxis | None) -> None:
    """Send the fine-tune of a part, as the task `token` on its device's queue (its label gives
    the setting in the unit of the device's `control` axis)."""
    setting = (control or ControlAxis.GPU_CLOCK_HZ).describe(request.frequency_hz)
    send(app, TaskName.finetune, request, device_queue(request.device_id), task_id=token, setting=setting)
