"""The Python client: submit jobs, follow their progress, read reports and the fleet."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, TypeVar

from pydantic import ValidationError

from edgetrain.common.datasets import dataset_names
from edgetrain.common.models import get_model
from edgetrain.common.estimation import vector_key
from edgetrain.common.schemas import TERMINAL, DeviceInfo, EstimationRequest, JobSpec, JobStatus, RelationVector
from edgetrain.common.store import Store

from .app import CONTROL_QUEUE, SERVER_QUEUE, create_app


class JobSpecError(ValueError):
    """A job spec was rejected before anything was enqueued; the message names the field."""


class JobNotFoundError(KeyError):
    pass


def validate_job(spec: JobSpec | dict[str, Any]) -> JobSpec:
    """Validate a job spec; raises JobSpecError naming every bad field."""
    try:
        job = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(job)'}: {e['msg']}" for e in exc.errors()]
        raise JobSpecError("invalid job spec:\n  " + "\n  ".join(lines)) from None
    try:
        get_model(job.model)
    except ValueError as exc:
        raise JobSpecError(f"invalid job spec:\n  {exc}") from None
    known = set(dataset_names())
    refs = {"dataset": job.dataset, "proxy_dataset": job.proxy_dataset}
    refs.update({f"devices.{i}.dataset": d.dataset for i, d in enumerate(job.devices) if d.dataset})
    unknown = [f"{field}.name: unknown dataset {ref.name!r}; available: {sorted(known)}" for field, ref in refs.items() if ref.name not in known]
    if unknown:
        raise JobSpecError("invalid job spec:\n  " + "\n  ".join(unknown))
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
    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.store = Store.from_url(redis_url)
        self.app = create_app(redis_url)

    def submit(self, job_spec: JobSpec | dict[str, Any]) -> str:
        """Validate and enqueue a job; returns its id."""
        job = validate_job(job_spec)
        job_id = uuid.uuid4().hex[:12]
        self.store.create_job(job_id, job)
        self.app.send_task("edgetrain.advance_job", args=[job_id], queue=CONTROL_QUEUE)
        return job_id

    def status(self, job_id: str) -> JobStatus:
        status = self.store.status(job_id)
        if status is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return status

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
            return status if all(p.state in TERMINAL for p in status.parts.values()) else None

        return poll_until(finished, timeout_s, poll_s, f"job {job_id}")

    def report(self, job_id: str) -> dict[str, Any]:
        """The job's result per device, as JSON-able data."""
        return job_report(self.status(job_id))

    def fleet(self) -> list[DeviceInfo]:
        return self.store.fleet()

    def estimate(self, request: EstimationRequest | dict[str, Any], timeout_s: float | None = None) -> RelationVector:
        """Estimate (or fetch the cached) relation vector on the server pool and wait for it."""
        req = request if isinstance(request, EstimationRequest) else EstimationRequest.model_validate(request)
        key = vector_key(req)
        self.app.send_task("edgetrain.estimate_relation_vector", args=[req.model_dump(mode="json")], queue=SERVER_QUEUE)

        def ready() -> RelationVector | None:
            if reason := self.store.failure(f"vector:{key}"):
                raise RuntimeError(reason)
            return self.store.vector(key)

        return poll_until(ready, timeout_s, 0.5, f"relation vector {key}")

    def pretrain(self, model: str, dataset: dict[str, Any], samples: int, timeout_s: float | None = None, **options: Any) -> dict:
        """Pre-train on a server worker; returns {"weights": URL, "test_accuracy": ...}."""
        result = self.app.send_task("edgetrain.pretrain", args=[model, dataset, samples], kwargs=options, queue=SERVER_QUEUE)
        return result.get(timeout=timeout_s)


def job_report(status: JobStatus) -> dict[str, Any]:
    devices = []
    for part in status.parts.values():
        entry: dict[str, Any] = {
            "device_id": part.device_id,
            "device_type": part.device_type,
            "simulated": part.simulated,
            "power_cap_w": part.power_cap_w,
            "state": part.state.value,
            "reason": part.reason,
            "selection": part.selection.model_dump() if part.selection else None,
            "estimated_time_to_accuracy_s": part.estimated_time_to_accuracy_s,
            "baseline1": part.baseline1.model_dump() if part.baseline1 else None,
            "baseline1_estimated_time_to_accuracy_s": part.baseline1_estimated_time_to_accuracy_s,
            "achieved": part.report.model_dump() if part.report else None,
        }
        ours, base = part.estimated_time_to_accuracy_s, part.baseline1_estimated_time_to_accuracy_s
        entry["estimated_speedup_vs_baseline1"] = base / ours if ours and base else None
        devices.append(entry)
    return {
        "job_id": status.job_id,
        "state": status.state.value,
        "spec": status.spec.model_dump(mode="json"),
        "devices": devices,
        "events": status.events,
    }
