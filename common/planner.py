"""The job planner: what one device's part of a job needs next, as a pure function.

`plan(view) -> Decision`, with no Redis and no Celery: tasks/workflow.py reads the store into
a `PartView`, calls `plan` and applies the decision (claims, dispatches, part updates, events).

A part's states and their transitions:

    pending    -> profiling | estimating | finetuning | failed
    profiling  -> estimating | finetuning | failed   the table is ready (or failed)
    estimating -> profiling | finetuning | failed    the vector is ready (or failed); a table
                                                     that went stale is profiled again
    finetuning -> completed | failed                 set by the `finetune` task
    completed, failed                                final

The decisions:
- `Wait`: nothing to do now (the part is final, or a task owns it).
- `Fail`: the part cannot go on, with the reason (unknown device, a table or vector that
  failed, a cap no configuration meets, nothing to select).
- `Prepare`: the table (`profile`) and/or the relation vector (`estimate`) are missing; the
  part waits in `state` until they are produced.
- `FineTune`: both exist: the selection of equation (4), Baseline 1 for comparison, and the
  fine-tuning request for the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .jobs import TERMINAL, DevicePart, PartState
from .keys import table_id, vector_key
from .models import get_model
from .payloads import FinetuneRequest, ProfileRequest, finetune_request, job_profile_request
from .schemas import DeviceInfo, DeviceTarget, EstimationRequest, JobSpec, ProfileTable, RelationVector, Selection
from .selection import Baseline1, Equation4, SelectionError, estimated_time_to_accuracy_s
from .tables import reuse_problem


@dataclass(frozen=True)
class PartView:
    """What the planner sees of one device's part of a job, read from the store.

    `device` is None when the device has no live heartbeat in the fleet (`registered` then
    lists the devices that do); `table` and `vector` are None when not stored, and their
    `*_failure` say why producing them failed; `not_before` is set when the job forces a new
    profile (tables older than it are not reused)."""

    job_id: str
    spec: JobSpec
    target: DeviceTarget
    part: DevicePart
    device: DeviceInfo | None
    table: ProfileTable | None = None
    vector: RelationVector | None = None
    table_failure: str | None = None
    vector_failure: str | None = None
    not_before: datetime | None = None
    registered: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wait:
    """Nothing to do now."""

    reason: str


@dataclass(frozen=True)
class Fail:
    """The part fails with `reason`."""

    reason: str


@dataclass(frozen=True)
class Prepare:
    """Produce what is missing; the part waits in `state` (profiling or estimating)."""

    state: PartState
    device: DeviceInfo
    table_id: str
    vector_key: str
    profile: ProfileRequest | None = None
    estimate: EstimationRequest | None = None
    stale: str | None = None  # why the stored table is not reused


@dataclass(frozen=True)
class FineTune:
    """Both table and vector exist: fine-tune with `selection`."""

    device: DeviceInfo
    selection: Selection
    request: FinetuneRequest
    estimated_time_to_accuracy_s: float | None
    baseline1: Selection | None = None
    baseline1_estimated_time_to_accuracy_s: float | None = None
    baseline1_problem: str | None = None  # why Baseline 1 has no configuration


Decision = Wait | Fail | Prepare | FineTune


def resource_ids(spec: JobSpec, device_type: str) -> tuple[str, str]:
    """(table id, vector key) that a part of `spec` on a device of `device_type` needs."""
    return table_id(device_type, spec.model, get_model(spec.model).input_shape), vector_key(spec.estimation_request())


def plan(view: PartView) -> Decision:
    """The next step of one device's part of a job (see the module docstring)."""
    part, target, spec = view.part, view.target, view.spec
    if part.state in TERMINAL or part.state == PartState.finetuning:
        return Wait(f"part is {part.state.value}")
    device = view.device
    if device is None:
        return Fail(f"unknown device {target.device_id!r}: not registered in the fleet (registered: {list(view.registered)})")
    tid, vkey = resource_ids(spec, device.device_type)
    table, stale = view.table, None
    if table is not None:
        stale = reuse_problem(table, device, target.power_cap_w, view.not_before)
        table = None if stale else table
    if table is None and view.table_failure:
        return Fail(view.table_failure)
    if view.vector is None and view.vector_failure:
        return Fail(view.vector_failure)
    if table is None or view.vector is None:
        return Prepare(
            state=PartState.profiling if table is None else PartState.estimating,
            device=device,
            table_id=tid,
            vector_key=vkey,
            profile=job_profile_request(spec, target) if table is None else None,
            estimate=spec.estimation_request() if view.vector is None else None,
            stale=stale,
        )
    return _fine_tune(view, device, table, view.vector)


def _fine_tune(view: PartView, device: DeviceInfo, table: ProfileTable, vector: RelationVector) -> Decision:
    cap = view.target.power_cap_w
    try:
        choice = Equation4(vector).choose(table, cap)
    except SelectionError as exc:
        return Fail(str(exc))
    base, problem = None, None
    try:
        base = Baseline1(vector, device.power_envelope_w).choose(table, cap)
    except SelectionError as exc:
        problem = str(exc)
    return FineTune(
        device=device,
        selection=choice,
        request=finetune_request(view.job_id, view.spec, view.target, choice),
        estimated_time_to_accuracy_s=estimated_time_to_accuracy_s(table, vector, choice),
        baseline1=base,
        baseline1_estimated_time_to_accuracy_s=None if base is None else estimated_time_to_accuracy_s(table, vector, base),
        baseline1_problem=problem,
    )
