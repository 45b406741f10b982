"""The Python client: submit jobs, follow their progress, read reports and the fleet.

It only sends tasks by name and reads Redis, so it imports no PyTorch."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from edgetrain.common.admission import job_problems
from edgetrain.common.jobs import JobStatus
from edgetrain.common.keys import DEFAULT_PREFIX, vector_key, vector_resource
from edgetrain.common.payloads import PretrainRequest, PretrainResult
from edgetrain.common.reports import JobReport
from edgetrain.common.schemas import (
    DatasetRef,
    DeviceInfo,
    EstimationRequest,
    JobSpec,
    RelationVector,
)
from edgetrain.common.settings import Settings, get_settings
from edgetrain.common.store import JobNotFoundError, Store

from .app import producer_app
from .contract import TaskName, send

__all__ = ["EdgeTrainClient", "JobNotFoundError", "JobSpecError", "poll_until", "validate_job"]


class JobSpecError(ValueError):
    """A job spec was rejected before anything was enqueued; the message names the field."""


def validate_job(spec: JobSpec | dict[str, Any]) -> JobSpec:
    """Validate a job spec without importing or reading anything it names; raises
    JobSpecError naming every bad field. A user model's module is checked against
    EDGETRAIN_ALLOWED_MODEL_MODULES when this process has it (the workers always do)."""
    try:
        job = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(job)'}: {e['msg']}" for e in exc.errors()]
        raise JobSpecError("invalid job spec:\n  " + "\n  ".join(lines)) from None
    problems = job_problems(job, get_settings().allowed_model_modules or None)
    if problems:
        raise JobSpecError("invalid job spec:\n  " + "\n  ".join(problems))
    return job


T = TypeVar("T")


def poll_until(check: Callable[[], T | None], timeout_s: float | None, poll_s: float, what: str) -> T:
    """Call `check` every `poll_s` seconds until it returns a value; TimeoutError after `timeout_s`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (value := check()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} not finished after {timeout_s} s")
        time.sleep(poll_s)
    return value


class EdgeTrainClient:
    """Submits jobs and reads their state from the cluster whose Redis is at `redis_url`."""

    def __init__(self, redis_url: str, key_prefix: str = DEFAULT_PREFIX):
        """`redis_url` as given (not EDGETRAIN_REDIS_URL_FILE); EDGETRAIN_REDIS_PASSWORD_FILE,
        when set, gives its user's password."""
        settings = Settings(redis_url=redis_url, key_prefix=key_prefix, redis_url_file=None)
        self.redis_url = settings.redis_url
        self.store = Store.connect(settings.redis_url, key_prefix)
        self.app = producer_app(settings)

    def submit(self, job_spec: JobSpec | dict[str, Any]) -> str:
        """Validate and enqueue a job; returns its id."""
        job = validate_job(job_spec)
        job_id = uuid.uuid4().hex[:12]
        self.store.jobs.create(job_id, job)
        send(self.app, TaskName.advance_job, job_id)
        return job_id

    def status(self, job_id: str) -> JobStatus:
        """The job's state, parts, progress and events; JobNotFoundError for an unknown id."""
        return self.store.jobs.status(job_id)

    def wait(
        self,
        job_id: str,
        timeout_s: float | None = None,
        on_update: Callable[[JobStatus], None] | None = None,
        poll_s: float = 0.5,
    ) -> JobStatus:
        """Poll until every device part is completed or failed; `on_update` sees each status."""

        def finished() -> JobStatus | None:
            status = self.status(job_id)
            if on_update:
                on_update(status)
            return status if status.finished else None

        return poll_until(finished, timeout_s, poll_s, f"job {job_id}")

    def report(self, job_id: str) -> JobReport:
        """The job's result per device."""
        return JobReport.from_status(self.status(job_id))

    def fleet(self) -> list[DeviceInfo]:
        """Devices with a live heartbeat."""
        return self.store.fleet.devices()

    def estimate(self, request: EstimationRequest | dict[str, Any], timeout_s: float | None = None) -> RelationVector:
        """Estimate (or fetch the cached) relation vector on the server pool and wait for it."""
        req = request if isinstance(request, EstimationRequest) else EstimationRequest.model_validate(request)
        key = vector_key(req)
        send(self.app, TaskName.estimate_relation_vector, req)

        def ready() -> RelationVector | None:
            if failure := self.store.coordination.failure(vector_resource(key)):
                raise RuntimeError(failure.reason)
            return self.store.resources.vector(key)

        return poll_until(ready, timeout_s, 0.5, f"relation vector {key}")

    def pretrain(
        self, model: str, dataset: DatasetRef | dict[str, Any], samples: int, timeout_s: float | None = None, **options: Any
    ) -> PretrainResult:
        """Pre-train on a server worker and wait; returns the weights' URL and test accuracy."""
        ref = dataset if isinstance(dataset, DatasetRef) else DatasetRef.model_validate(dataset)
        request = PretrainRequest(model=model, dataset=ref, samples=samples, **options)
        result = send(self.app, TaskName.pretrain, request).get(timeout=timeout_s)
        return PretrainResult.model_validate(result)
