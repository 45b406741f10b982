"""Drive a job's part to a state through the events that lead there, as the workers would
report them (for tests of what users see in each state)."""

from __future__ import annotations

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import (
    AttemptFinished,
    AttemptStarted,
    Cancelled,
    Dispatched,
    Failed,
    Identified,
    Prepared,
    request_digest,
)
from edgetrain.common.jobs.state import DevicePart, PartState
from edgetrain.common.payloads import finetune_request
from edgetrain.common.schemas import RunReport, Selection
from edgetrain.common.store import Store


def drive_part(store: Store, job_id: str, device_id: str, state: PartState, selection: Selection | None = None,
               report: RunReport | None = None, reason: str = "failed on purpose", attempt: str = "a1",
               device_type: str = "jetson-nano") -> DevicePart:  # fmt: skip
    """Move the part from pending to `state`: profiling, estimating, queued (dispatched with
    `selection`), fine-tuning (and run by attempt `attempt`), completed (with `report`), failed
    or cancelled (with `reason`). Returns the part as stored."""
    identity = Identified(device_type=device_type, simulated=True, control=ControlAxis.GPU_CLOCK_HZ)
    if state in (PartState.profiling, PartState.estimating):
        store.jobs.apply(job_id, device_id, Prepared(state=state, device=identity))
    if state in (PartState.queued, PartState.finetuning, PartState.completed):
        record = store.jobs.record(job_id)
        assert record is not None and selection is not None, "a fine-tune needs its job and a selection"
        target = next(t for t in record.spec.devices if t.device_id == device_id)
        request = finetune_request(job_id, record.spec, target, selection, "table", "vector")
        store.jobs.apply(job_id, device_id, Dispatched(device=identity, token=f"task-{job_id}", request=request, selection=selection,
                                                       estimated_time_to_accuracy_s=None))  # fmt: skip
    if state in (PartState.finetuning, PartState.completed):
        store.jobs.apply(job_id, device_id, AttemptStarted(dispatch=f"task-{job_id}", digest=request_digest(request), attempt=attempt,
                                                           node=f"device-{device_id}@host"))  # fmt: skip
    if state == PartState.completed:
        assert report is not None, "a completed part has a report"
        store.jobs.apply(job_id, device_id, AttemptFinished(attempt=attempt, report=report))
    if state == PartState.failed:
        store.jobs.apply(job_id, device_id, Failed(reason=reason))
    if state == PartState.cancelled:
        store.jobs.apply(job_id, device_id, Cancelled(reason=reason))
    return store.jobs.part(job_id, device_id)
