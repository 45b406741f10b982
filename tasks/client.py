"""The Python client: submit jobs, follow their progress, read reports and the fleet.

It only sends tasks by name and reads Redis, so it imports no PyTorch."""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
from pydantic import ValidationError

from edgetrain.common.datasets import USER_DATA, DatasetMissingError, locate
from edgetrain.common.documents import nesting_problem
from edgetrain.common.federated.partition import spec_share_problem
from edgetrain.common.federated.records import FederatedRecord, FederatedState, FederatedStatus
from edgetrain.common.federated.spec import FederatedSpec
from edgetrain.common.finetune.belief import Belief, belief
from edgetrain.common.finetune.learned import DataIdentity
from edgetrain.common.finetune.trust import proxy_family, trust_width
from edgetrain.common.ids import checked_id
from edgetrain.common.jobs.admission import dataset_refs, spec_problems
from edgetrain.common.jobs.events import Refused, Requeued
from edgetrain.common.jobs.reports import JobReport
from edgetrain.common.jobs.state import TERMINAL, DevicePart, JobState, JobStatus, JobSummary, PartState
from edgetrain.common.keys import (
    DEFAULT_PREFIX,
    learned_key,
    table_id,
    table_resource,
    vector_key,
    vector_resource,
)
from edgetrain.common.limits import STATUS_PARTS
from edgetrain.common.models import get_model
from edgetrain.common.payloads import PretrainRequest, PretrainResult, profile_request
from edgetrain.common.polling import poll_until
from edgetrain.common.progress import EstimationProgress, Preparation, ProfilingProgress, estimation_progress
from edgetrain.common.redis_health import RedisFull, RedisUnsafe, full_message, refuse_unsafe
from edgetrain.common.schemas import (
    DatasetRef,
    DeviceCap,
    DeviceInfo,
    EstimationRequest,
    JobSpec,
    ProfileTable,
    ProfilingOptions,
    RelationVector,
)
from edgetrain.common.settings import Settings, get_data_settings
from edgetrain.common.store import JobFinished, JobNotFoundError, LiveWorker, Store, claim_token
from edgetrain.common.store.jobs import PLAN_EARLY_AT
from edgetrain.common.store.resources import OnSetAside

from .app import producer_app
from .contract import TaskName, device_queue, send
from .diagnosis import stalled

__all__ = [
    "EdgeTrainClient", "JobNotFoundError", "JobSpecError", "Pending", "RedisFull", "RedisUnsafe", "ResourceFailed",
    "poll_until", "validate_job",
]  # fmt: skip


class JobSpecError(ValueError):
    """A job spec was rejected before anything was enqueued; the message names the field."""


def validate_job(spec: JobSpec | dict[str, Any]) -> JobSpec:
    """Validate a job spec without importing or reading anything it names; raises
    JobSpecError naming every bad field at once (its form, then what it names). A user
    model's module is checked against EDGETRAIN_ALLOWED_MODEL_MODULES when this process has
    it (the workers always do)."""
    return _validated(JobSpec, spec, "job spec")


def validate_federated(spec: FederatedSpec | dict[str, Any]) -> FederatedSpec:
    """Validate a federated job spec (`kind: federated`) as `validate_job` does a job's, and
    its split of the dataset over the devices where the dataset's size is known (the workers
    would refuse it only once the job runs)."""
    job = _validated(FederatedSpec, spec, "federated job spec")
    if problem := spec_share_problem(job):
        raise JobSpecError(f"invalid federated job spec:\n  {problem}")
    return job


SpecT = TypeVar("SpecT", JobSpec, FederatedSpec)


def _validated(kind: type[SpecT], spec: SpecT | dict[str, Any], what: str) -> SpecT:
    raw = spec.model_dump(mode="json") if isinstance(spec, kind) else spec
    if problem := nesting_problem(raw):
        raise JobSpecError(f"invalid {what}:\n  (job): {problem}")
    lines = []
    try:
        job = spec if isinstance(spec, kind) else kind.model_validate(spec)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(job)'}: {e['msg']}" for e in exc.errors()]
    if isinstance(raw, dict):
        named = {line.split(":")[0] for line in lines}
        lines += [p for p in spec_problems(raw, get_data_settings().allowed_model_modules or None) if p.split(":")[0] not in named]
    if lines:
        raise JobSpecError(f"invalid {what}:\n  " + "\n  ".join(lines))
    return job


def is_federated(raw: object) -> bool:
    """Whether a spec document asks for a federated job (`kind: federated`)."""
    return isinstance(raw, dict) and raw.get("kind") == "federated"


def datasets_missing_here(spec: JobSpec) -> list[str]:
    """Notes on the datasets of `spec` that this machine does not have: not an error (the
    devices and the server workers read their own copies), but they will need them."""
    notes = []
    for field, ref in dataset_refs(spec.model_dump(mode="json")).items():
        if ref.name in USER_DATA:
            continue
        try:
            locate(ref.name)
        except DatasetMissingError as exc:
            who = "the server workers" if field == "proxy_dataset" else "the devices"
            notes.append(f"{field}: {exc}; {who} will need it")
    return notes


T = TypeVar("T")
SAFE_FOR_S = 10.0  # how long a Redis found safe to submit to is not asked again (s)
CANCEL_WAIT_S = 10.0  # how long cancelling a federated job waits for the control worker to stop it (s)


class ResourceFailed(RuntimeError):
    """Producing a lookup table or relation vector failed; the message is the worker's reason."""


@dataclass(frozen=True)
class Pending(Generic[T]):
    """A lookup table or relation vector on its way. `dispatched`: this client claimed its
    production and sent the task; otherwise it was stored already or another job or command
    holds the claim (`holder`) and produces it. `ready()` returns it once stored, None before,
    and raises ResourceFailed when its production failed."""

    resource: str
    dispatched: bool
    holder: str | None
    ready: Callable[[], T | None]

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.5) -> T:
        """Poll until it is stored; TimeoutError after `timeout_s`, ResourceFailed on a failure."""
        return poll_until(self.ready, timeout_s, poll_s, self.resource)


class EdgeTrainClient:
    """Submits jobs and reads their state from the cluster whose Redis is at `redis_url`."""

    def __init__(self, redis_url: str, key_prefix: str = DEFAULT_PREFIX, password_file: bool = True):
        """`redis_url` as given (not EDGETRAIN_REDIS_URL_FILE); EDGETRAIN_REDIS_PASSWORD_FILE,
        when set, gives its user's password, unless `password_file` is False (a Redis of this
        process's own, such as the demo's)."""
        own = {} if password_file else {"redis_password_file": None}
        settings = Settings(redis_url=redis_url, key_prefix=key_prefix, redis_url_file=None, **own)
        self.redis_url = settings.redis_url
        self.settings = settings
        self.store = Store.connect(settings.redis_url, key_prefix)
        self.app = producer_app(settings)
        self.owner = f"client:{socket.gethostname()}:{os.getpid()}"  # who claims what this client produces
        self._safe_until = 0.0  # time.monotonic() until which Redis counts as checked safe to submit to

    def _refuse_unsafe_redis(self) -> None:
        """RedisUnsafe or RedisFull before a submission to a Redis that evicts keys or is full;
        once found safe, not asked again for SAFE_FOR_S (a client submitting hundreds of jobs a
        second would otherwise read Redis's INFO as often; a write Redis has no room for is
        refused by Redis itself)."""
        if time.monotonic() < self._safe_until:
            return
        try:
            refuse_unsafe(self.store.redis_facts(), "to submit")
        except redis.ResponseError:  # INFO not allowed to this user: Redis itself refuses a job it has no room for
            pass
        self._safe_until = time.monotonic() + SAFE_FOR_S

    def submit(self, job_spec: JobSpec | FederatedSpec | dict[str, Any]) -> str:
        """Validate and enqueue a job, or start a federated job (`kind: federated`:
        docs/federated.md); returns its id. RedisUnsafe when Redis evicts keys (it would lose
        the job without a word), RedisFull when it has no room for it."""
        if isinstance(job_spec, FederatedSpec) or (isinstance(job_spec, dict) and is_federated(job_spec)):
            return self._submit_federated(validate_federated(job_spec))
        job = validate_job(job_spec)
        self._refuse_unsafe_redis()
        job_id = uuid.uuid4().hex[:12]
        try:
            waiting = self.store.jobs.create(job_id, job, ring_for_s=self.settings.lease_ttl_s)
        except redis.exceptions.OutOfMemoryError:
            raise RedisFull(full_message(self.store.redis_facts())) from None
        try:  # the first job since the last planning step sends the next, which takes up those after it too
            if waiting == 1:
                send(self.app, TaskName.plan_submitted, job_id)
            elif waiting == PLAN_EARLY_AT:
                self.store.jobs.plan_now()
        except redis.exceptions.OutOfMemoryError:
            raise RedisFull(f"{full_message(self.store.redis_facts())}; job {job_id} was recorded but not queued: "
                            "submit it again once Redis has room") from None  # fmt: skip
        return job_id

    def _submit_federated(self, job: FederatedSpec) -> str:
        self._refuse_unsafe_redis()
        job_id = uuid.uuid4().hex[:12]
        try:
            self.store.federated.create(FederatedRecord(job_id=job_id, spec=job))
            send(self.app, TaskName.federated_advance, job_id)
        except redis.exceptions.OutOfMemoryError:
            raise RedisFull(full_message(self.store.redis_facts())) from None
        return job_id

    def federated_status(self, job_id: str, events: int = 20, rounds_from: int | None = 0) -> FederatedStatus | None:
        """A federated job's record, state, rounds (from the `rounds_from`-th; None: none) and
        newest `events` events; None when no federated job has this id."""
        f = self.store.federated
        record = f.record(checked_id(job_id, "job_id"))
        if record is None:
            return None
        state = f.state(job_id) or FederatedState(global_weights=record.spec.weights, notice="waiting for a control worker to start it")
        rounds = f.rounds(job_id, rounds_from) if rounds_from is not None else []
        return FederatedStatus(record=record, state=state, rounds=rounds, events=f.events(job_id)[-events:] if events else [])

    def federated_jobs(self, limit: int = 100) -> list[FederatedStatus]:
        """The newest federated jobs first, without their rounds and events."""
        return [s for job_id in self.store.federated.job_ids(limit) if (s := self.federated_status(job_id, events=0, rounds_from=None))]

    def wait_federated(self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.5,
                       on_update: Callable[[FederatedStatus], None] | None = None) -> FederatedStatus:  # fmt: skip
        """Poll until the federated job finishes (TimeoutError after `timeout_s`)."""

        def finished() -> FederatedStatus | None:
            status = self.federated_status(job_id)  # every round: on_update shows them
            if status is None:
                raise JobNotFoundError(f"no federated job {job_id}")
            if on_update:
                on_update(status)
            return status if status.finished else None

        return poll_until(finished, timeout_s, poll_s, f"federated job {job_id}")

    def cancel_federated(self, job_id: str, timeout_s: float = CANCEL_WAIT_S) -> FederatedStatus:
        """Stop a federated job: no round opens or aggregates after this; updates on their way
        are discarded. The control worker applies it; this waits up to `timeout_s` (s) for it
        and returns the job as it is then. JobFinished when it has finished already."""
        status = self.federated_status(job_id, events=0, rounds_from=None)
        if status is None:
            raise JobNotFoundError(f"no federated job {job_id}")
        if status.finished:
            raise JobFinished(f"federated job {job_id} has finished ({status.state.phase.value}): nothing to cancel")
        self.store.federated.request_cancel(job_id)
        send(self.app, TaskName.federated_advance, job_id)

        def settled() -> FederatedStatus | None:
            now = self.federated_status(job_id)
            return now if now is not None and now.finished else None

        try:
            return poll_until(settled, timeout_s, 0.1, f"federated job {job_id} to stop")
        except TimeoutError:
            current = self.federated_status(job_id)
            assert current is not None
            return current

    def status(self, job_id: str, devices: list[str] | None = None, state: PartState | None = None, page: int | None = None) -> JobStatus:
        """The job's state, counts of parts per state, parts, progress and events, with notes on
        what it waits for that no live worker will do, how far the tables and vector it waits
        for are, and what runs on the devices of its queued parts; a part that failed before its device's type was recorded shows the type
        it is registered with. Parts: those of `devices`, else those in `state`, else every
        part of a job of up to STATUS_PARTS devices, else a summary (the failed parts, then the
        first devices, STATUS_PARTS in all, and the newest events; `shown` says which), so
        that status costs the same for any job's size. `page` (from 0) pages through the parts
        in `state` or through the job's devices, STATUS_PARTS at a time. JobNotFoundError for an
        unknown id (saying so when the store was reset since: Redis restarted without
        persistence) or device, InvalidIdError for one that is not an id."""
        jobs = self.store.jobs
        try:
            record = jobs.record(checked_id(job_id, "job_id"))
            shown, ids = self._shown(job_id, [d.device_id for d in record.spec.devices] if record else [], devices, state, page)
            status = jobs.status(job_id, ids, None if shown is None else STATUS_PARTS)
        except JobNotFoundError as exc:
            identity = self.store.identity.current()
            note = identity.reset_note() if identity else None
            raise JobNotFoundError(f"{exc.args[0]}; {note}" if note else exc.args[0]) from None
        queued = [d for d, p in status.parts.items() if p.state == PartState.queued]
        return status.model_copy(update={
            "notes": stalled(status, self.workers()), "preparation": self._preparation(status), "parts": self._identified(status),
            "shown": shown, "running_there": self.store.jobs.running_on(queued) if queued else {},
        })  # fmt: skip

    def _shown(
        self, job_id: str, every: list[str], devices: list[str] | None, state: PartState | None, page: int | None
    ) -> tuple[str | None, list[str] | None]:
        """(what is shown, when not every part; the devices to read, None for every one), of a
        job whose devices are `every`."""
        first, total = (page or 0) * STATUS_PARTS, len(every)
        if devices is not None:
            return f"{len(devices)} of {total} parts: those asked for", [checked_id(d, "device_id") for d in devices]
        if state is not None:
            members = self.store.jobs.devices_in(job_id, state)
            return _page_line(len(members), f"{state.value} ", first, total), members[first : first + STATUS_PARTS]
        if page is None and total <= STATUS_PARTS:
            return None, None
        if page is not None:
            return _page_line(total, "", first, total), every[first : first + STATUS_PARTS]
        failed = self.store.jobs.devices_in(job_id, PartState.failed)[:STATUS_PARTS]
        more = [d for d in every[:STATUS_PARTS] if d not in failed][: STATUS_PARTS - len(failed)]
        line = (f"{len(failed) + len(more)} of {total} parts: the failed ones first, then the first devices, and the newest "
                f"{STATUS_PARTS} events; --page N, --state S or --device D show others")  # fmt: skip
        return line, failed + more

    def _preparation(self, status: JobStatus) -> Preparation:
        """The vector and tables that unfinished parts wait for, while they are made."""
        waiting = [p for p in status.parts.values() if p.state in (PartState.profiling, PartState.estimating)]
        if not waiting:
            return Preparation()
        types = sorted({p.device_type for p in waiting if p.state == PartState.profiling and p.device_type})
        profiling = {t: progress for t in types if (progress := self.profiling_progress(t, status.spec.model)) and not progress.done}
        return Preparation(estimation=self.estimation_progress(status.spec.estimation_request()), profiling=profiling)

    def _identified(self, status: JobStatus) -> dict[str, DevicePart]:
        """The parts, those without a device type given the one their device is registered with."""
        unknown = [d for d, p in status.parts.items() if p.device_type is None]
        devices = self.store.fleet.devices_by_id(unknown)
        return status.parts | {
            d: status.parts[d].model_copy(update={"device_type": info.device_type, "simulated": info.simulated})
            for d, info in devices.items()
        }

    def estimation_progress(self, request: EstimationRequest) -> EstimationProgress | None:
        """How far the estimation of `request`'s relation vector is (each batch size and seed
        waiting, running or done); None once the vector is stored."""
        key = vector_key(request)
        if self.store.resources.vector(key) is not None:
            return None
        return estimation_progress(key, request, self.store.resources.vector_parts(key), self.store.progress.proxy_runs(key))

    def profiling_progress(self, device_type: str, model: str) -> ProfilingProgress | None:
        """How far the latest profile of `model` on `device_type` got (`done` once measured), if one reported."""
        return self.store.progress.profiling(device_type, model)

    def wait(
        self,
        job_id: str,
        timeout_s: float | None = None,
        on_update: Callable[[JobStatus], None] | None = None,
        poll_s: float = 0.5,
    ) -> JobStatus:
        """Poll until every device part is completed, failed or cancelled; `on_update` sees
        each status that differs from the one before (states, progress, notes, events, the
        tables and vector being made). TimeoutError after `timeout_s` (s); the job goes on."""
        checked_id(job_id, "job_id")
        seen: list[str] = []

        def finished() -> JobStatus | None:
            status = self.status(job_id)
            if on_update and (digest := status.digest()) not in seen[-1:]:
                seen.append(digest)
                on_update(status)
            return status if status.finished else None

        return poll_until(finished, timeout_s, poll_s, f"job {job_id}")

    def report(self, job_id: str) -> JobReport:
        """The job's result on every device (however many)."""
        record = self.store.jobs.record(checked_id(job_id, "job_id"))
        return JobReport.from_status(self.status(job_id, [d.device_id for d in record.spec.devices] if record else None))

    def set_power_cap(self, device_id: str, power_cap_w: float | None) -> DeviceCap:
        """Set the board power cap of `device_id` (W; None = no cap): a fine-tune running there
        re-selects (b, f) for it at its next step, and pauses at idle clocks while no
        configuration meets it. ValueError for a cap that is not a positive number of watts
        (InvalidIdError, a ValueError, for a device id that is not an id)."""
        checked_id(device_id, "device_id")
        if power_cap_w is not None and not (math.isfinite(power_cap_w) and power_cap_w > 0):
            raise ValueError(f"power_cap_w: {power_cap_w!r} is not allowed: a finite number of watts above 0, or None for no cap")
        return self.store.fleet.set_power_cap(device_id, power_cap_w)

    def unregistered_notes(self, spec: JobSpec) -> list[str]:
        """A note on the devices of `spec` not registered in the fleet now: their parts wait
        for them up to the job's `device_grace_s`, then fail."""
        ids = [d.device_id for d in spec.devices]
        live = self.store.fleet.devices_by_id(ids)
        missing = [d for d in ids if d not in live]
        if not missing:
            return []
        named = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        waits, fails = ("its part waits", "fails") if len(missing) == 1 else ("their parts wait", "fail")
        return [f"not registered in the fleet (yet): {named}; {waits} up to the job's device_grace_s ({spec.device_grace_s:g} s) "
                f"for `edgetrain worker device --device-id ...` to start on the board, then {fails}"]  # fmt: skip

    def fleet(self) -> list[DeviceInfo]:
        """Devices with a live heartbeat."""
        return self.store.fleet.devices()

    def workers(self) -> list[LiveWorker]:
        """Workers with a live heartbeat: role, node, queues, host and last heartbeat."""
        return self.store.liveness.workers(self.settings.heartbeat_ttl_s)

    def jobs(self, state: JobState | None = None, limit: int = 100) -> list[JobSummary]:
        """The newest jobs (at most `limit`), newest first, or those in `state`."""
        return [j for j in self.store.jobs.summaries(limit) if state is None or j.state == state]

    def cancel(self, job_id: str, settle_s: float = 5.0) -> JobStatus:
        """Stop a job: nothing more of it is dispatched, parts that no attempt runs are cancelled
        at once, running fine-tunes checkpoint, stop at their next step and restore their device.
        Returns its status once the control worker has done so (every part final or asked to
        stop), or after `settle_s` s as it is then. JobNotFoundError for an unknown id,
        JobFinished (nothing changed) when every part has finished already."""
        self.store.jobs.cancel(checked_id(job_id, "job_id"))
        send(self.app, TaskName.advance_job, job_id)

        def settled() -> JobStatus | None:
            status = self.status(job_id)
            return status if all(p.state in TERMINAL or p.cancel_requested_at for p in status.parts.values()) else None

        try:
            return poll_until(settled, settle_s, 0.2, f"cancelling job {job_id}")
        except TimeoutError:
            return self.status(job_id)

    def requeue(self, job_id: str, device_id: str) -> None:
        """Plan a part of a job again: a failed or cancelled one (also of a cancelled job), or a
        fine-tune that no attempt runs; a checkpoint it left is continued from. ValueError
        saying what to do otherwise."""
        try:
            self.store.jobs.apply(checked_id(job_id, "job_id"), checked_id(device_id, "device_id"), Requeued())
        except Refused as exc:
            raise ValueError(f"{device_id} of job {job_id} is not re-queued: {exc}") from None
        send(self.app, TaskName.advance_job, job_id)

    def job_vector(self, job_id: str, on_set_aside: OnSetAside | None = None) -> RelationVector | None:
        """The relation vector a job selects with, once estimated (and loadable: see
        `ResourceStore.vector` for `on_set_aside`)."""
        record = self.store.jobs.record(checked_id(job_id, "job_id"))
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return self.store.resources.vector(vector_key(record.spec.estimation_request()), on_set_aside)

    def beliefs(self, job_id: str, vector: RelationVector) -> dict[str, Belief]:
        """What the fleet believes now about the N_b of each data of a job (common/finetune/belief.py), by
        data label, from the records of runs on it and `vector` (the job's proxy vector) trusted
        as far as it earned on other data; data read from a path on the devices is left out."""
        record = self.store.jobs.record(checked_id(job_id, "job_id"))
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        spec, family = record.spec, proxy_family(vector.request)
        found: dict[str, Belief] = {}
        for ref in {(t.dataset or spec.dataset).model_dump_json(): t.dataset or spec.dataset for t in spec.devices}.values():
            if ref.path is not None:
                continue
            data = DataIdentity(name=ref.name, fraction=ref.fraction)
            key = learned_key(spec.model, spec.weights, data, spec.target_accuracy, spec.lr)
            trust = trust_width(self.store.learned.checks(family, exclude=key) if family else [])
            label = ref.name if ref.fraction == 1 else f"{ref.name} ({ref.fraction:g})"
            kept = self.store.learned.records(key)
            found[label] = belief(kept + self.store.learned.live(key, exclude={r.record_id for r in kept}), vector, trust)
        return found

    def estimate(self, request: EstimationRequest | dict[str, Any], timeout_s: float | None = None) -> RelationVector:
        """Estimate (or fetch the cached) relation vector on the server pool and wait for it."""
        req = request if isinstance(request, EstimationRequest) else EstimationRequest.model_validate(request)
        key = vector_key(req)
        send(self.app, TaskName.estimate_relation_vector, req)
        return poll_until(lambda: self._vector(key), timeout_s, 0.5, f"relation vector {key}")

    def _vector(self, key: str) -> RelationVector | None:
        if failure := self.store.coordination.failure(vector_resource(key)):
            raise ResourceFailed(failure.reason)
        return self.store.resources.vector(key)

    def _claim_and_send(self, resource: str, send_as: Callable[[str], object]) -> tuple[bool, str | None]:
        """Claim `resource` and call `send_as(claim token)`; (dispatched, holder of the claim)."""
        token = claim_token(self.owner)
        if not self.store.coordination.claim(resource, token):
            return False, self.store.coordination.holder(resource)
        try:
            send_as(token)
        except BaseException:
            self.store.coordination.release(resource)
            raise
        return True, token

    def request_vector(self, request: EstimationRequest) -> Pending[RelationVector]:
        """The relation vector of `request`: stored already, being estimated for another job
        (its claim is held), or claimed here and sent to the server pool, which fans out one
        proxy run per (batch size, seed). Returns at once; wait on the Pending."""
        key = vector_key(request)
        resource = vector_resource(key)
        dispatched, holder = False, None
        if self.store.resources.vector(key) is None:
            dispatched, holder = self._claim_and_send(resource, lambda _: send(self.app, TaskName.estimate_relation_vector, request))
        return Pending(resource, dispatched, holder, lambda: self._vector(key))

    def profile(
        self, device: DeviceInfo, model: str, batch_sizes: list[int] | None = None, options: ProfilingOptions | None = None,
        power_cap_w: float | None = None, merge: bool = False,
    ) -> Pending[ProfileTable]:  # fmt: skip
        """Profile `model` on `device` for its device type: claim the table and send
        `profile_device` to the device's queue (the task releases the claim), or, when another
        job or command holds the claim, wait for its profile instead of starting another.
        `merge` adds the rows to the stored table. Returns at once; the Pending is ready when
        a table newer than the one stored now is stored."""
        tid = table_id(device.device_type, model, get_model(model).input_shape)
        current = self.store.resources.table(tid)
        before = current.created_at if current else None
        chosen = options or ProfilingOptions()

        def send_as(token: str) -> None:
            request = profile_request(device, token, model, batch_sizes, chosen, power_cap_w)
            send(self.app, TaskName.profile_device, request.model_copy(update={"merge": merge}), device_queue(device.device_id))

        def ready() -> ProfileTable | None:
            table = self.store.resources.table(tid)
            if table is not None and table.created_at != before:
                return table
            if failure := self.store.coordination.failure(table_resource(tid)):
                raise ResourceFailed(failure.reason)
            return None

        dispatched, holder = self._claim_and_send(table_resource(tid), send_as)
        return Pending(table_resource(tid), dispatched, holder, ready)

    def pretrain(
        self, model: str, dataset: DatasetRef | dict[str, Any], samples: int, timeout_s: float | None = None, **options: Any
    ) -> PretrainResult:
        """Pre-train on a server worker and wait; returns the weights' URL and test accuracy.
        Weights pre-trained for an identical request before are returned without training."""
        ref = dataset if isinstance(dataset, DatasetRef) else DatasetRef.model_validate(dataset)
        request = PretrainRequest(model=model, dataset=ref, samples=samples, **options)
        if (stored := self.store.resources.pretrained(request)) is not None:
            return stored
        pending = send(self.app, TaskName.pretrain, request, awaited=True)
        try:
            result = pending.get(timeout=timeout_s)
        finally:
            pending.forget()  # unsubscribe now: after a Ctrl-C, a local cluster's Redis is gone by the time it is collected
        return PretrainResult.model_validate(result)


def _page_line(count: int, kind: str, first: int, total: int) -> str:
    """What a page of `status` shows: the page from part `first` of `count` `kind`parts (of
    `total` in the job)."""
    pages = max(1, math.ceil(count / STATUS_PARTS))
    return f"page {first // STATUS_PARTS + 1} of {pages} of the {count} {kind}parts ({total} in the job), {STATUS_PARTS} per page"
