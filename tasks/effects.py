"""Carrying out a planner's effects that claim a shared resource (common/jobs/effects.py): a lookup
table or a relation vector is produced once for every job that needs it; a job that does not
win the claim waits for the one that did, and is advanced when it is ready or failed."""

from __future__ import annotations

from collections.abc import Callable

from edgetrain.common.jobs.effects import ClaimAndEstimate, ClaimAndProfile
from edgetrain.common.jobs.state import EventField
from edgetrain.common.keys import table_resource, vector_resource
from edgetrain.common.store import claim_token

from .app import app
from .context import store
from .contract import TaskName, device_queue, send, send_again, to_track

Log = Callable[[str, str | None, dict[str, EventField]], None]  # (message, device id, fields): a line of the job's log


def claim_and_profile(job_id: str, effect: ClaimAndProfile, log: Log) -> None:
    """Wait for table `effect.table_id` and, when this job wins its claim, send its profile
    (written in the ledger of sent tasks with the claim); a table stored since the planner
    looked advances the job at once instead."""
    s = store()
    resource = table_resource(effect.table_id)
    s.coordination.add_waiter(resource, job_id)
    fresh = s.resources.table(effect.table_id)
    if fresh is not None and fresh.created_at != effect.stored_at:  # produced since the planner looked
        send(app, TaskName.advance_job, job_id)
        return
    token = claim_token(job_id)
    request = effect.request.model_copy(update={"owner": token})
    profile = to_track(TaskName.profile_device, request, device_queue(request.device_id), job_id)
    if s.coordination.claim(resource, token, [profile]):
        rows = f"rows {request.batch_sizes} " if request.merge else ""
        log(
            f"profiling {rows}{effect.table_id} on {request.device_id} ({request.options.mode})",
            request.device_id,
            {"table": effect.table_id, "rows": ",".join(map(str, request.batch_sizes)), "mode": request.options.mode},
        )
        send_again(app, profile)


def claim_and_estimate(job_id: str, effect: ClaimAndEstimate, log: Log) -> None:
    """Wait for vector `effect.vector_key` and, when this job wins its claim, send its estimation
    to the server pool (written in the ledger of sent tasks with the claim); a vector stored
    since the planner looked advances the job at once."""
    s = store()
    resource = vector_resource(effect.vector_key)
    s.coordination.add_waiter(resource, job_id)
    if s.resources.vector(effect.vector_key) is not None:  # produced since the planner looked
        send(app, TaskName.advance_job, job_id)
        return
    estimation = to_track(TaskName.estimate_relation_vector, effect.request, job_id=job_id)
    if s.coordination.claim(resource, job_id, [estimation]):
        log(f"estimating relation vector {effect.vector_key} on the server queue", None, {"vector": effect.vector_key})
        send_again(app, estimation)
