"""The control worker's side of a federated job: `federated_advance` runs on every event of a job
(submitted, an update arrived, a round aggregated, a table profiled, the reaper seeing a deadline
pass or a cancel asked for). It reads the job into a `RoundView`, asks the round planner
(common/federated/planner.py) for the next step, applies the step's event through the store's
one writer and, only when it applied, carries out the step's effects; while a step changes the
state, it asks for the next one (a few at most). It never waits in a task;
a lock per job serialises advances, and an event that no longer applies changes nothing. The
event that ends a job sends the deletion of the models it leaves (`federated_cleanup`, on the
server, which holds the artifact store), written in the ledger of sent tasks with it."""

from __future__ import annotations

from celery.utils.log import get_task_logger

from edgetrain.common.federated.events import Cancelled, FederatedEvent, Finished, Refused, Waiting
from edgetrain.common.federated.planner import RoundView, Step, plan_round
from edgetrain.common.federated.records import FederatedRecord, FederatedState, Phase
from edgetrain.common.jobs.effects import Aggregate, ClaimAndProfile, SendTrain
from edgetrain.common.jobs.state import EventKind
from edgetrain.common.keys import table_id, table_resource
from edgetrain.common.models import get_model
from edgetrain.common.schemas import utc_now
from edgetrain.common.store.ledger import SentTask
from edgetrain.common.tables import TableNeed, table_need

from .app import app
from .context import store
from .contract import TaskName, device_queue, send, send_again, to_track
from .effects import claim_and_profile
from .held_messages import CONTROL_TASK_OPTIONS

logger = get_task_logger(__name__)
LOCK_TIMEOUT_S = 30  # an advance takes milliseconds; a killed worker's lock frees itself after this (s)
MAX_STEPS = 4  # steps one advance takes while each changes the state (a round planner's step, then the next)


@app.task(name=TaskName.federated_advance.value, **CONTROL_TASK_OPTIONS)
def federated_advance(job_id: str) -> str:
    """Take the federated job `job_id` one step further; returns its phase."""
    s = store()
    record = s.federated.record(job_id)
    if record is None:
        logger.warning("federated_advance: no federated job %s", job_id)
        return "unknown job"
    with s.lock(s.keys.federated_lock(job_id), LOCK_TIMEOUT_S):
        state = s.federated.state(job_id) or s.federated.start(record)
        for _ in range(MAX_STEPS):  # a buffered job may close its buffer, then start a device's next work
            try:
                step = plan_round(read_view(record, state))
            except Exception as exc:  # a bug, or a record this worker cannot plan: fail the job, saying why
                logger.exception("advancing federated job %s failed", job_id)
                step = Step(Finished(phase=Phase.failed, reason=f"planning failed: {type(exc).__name__}: {exc}"))
            carry_out(record, step)
            after = s.federated.state(job_id)
            assert after is not None, "the job started"
            if after == state or isinstance(step.event, Waiting):
                break
            state = after
        return state.phase.value


def read_view(record: FederatedRecord, state: FederatedState) -> RoundView:
    """What the planner needs of the job now: its live devices, their types' tables and caps."""
    s, spec = store(), record.spec
    live = s.fleet.devices_by_id([d.device_id for d in spec.devices])
    tables: dict[str, TableNeed] = {}
    for device in sorted(live.values(), key=lambda d: d.device_id):
        if device.device_type not in tables:
            tid = table_id(device.device_type, spec.model, get_model(spec.model).input_shape)
            failure = s.coordination.failure(table_resource(tid))
            reason = failure.for_job(record.job_id) if failure else None
            tables[device.device_type] = table_need(s.resources.table(tid), device, spec.batch_sizes, None, reason)
    caps = {d: cap for d in live if (cap := s.fleet.power_cap(d)) is not None}
    return RoundView(record, state, utc_now(), live, tables, caps, s.federated.cancel_requested_at(record.job_id))


def carry_out(record: FederatedRecord, step: Step) -> None:
    """Apply the step's event and, when it applied, carry out its effects."""
    s, job_id = store(), record.job_id
    tracked = [to_track(TaskName.federated_aggregate, e.request, job_id=job_id) for e in step.effects if isinstance(e, Aggregate)]
    if step.event is not None:
        tracked += cleanup(job_id, step.event)
        try:
            s.federated.apply(job_id, step.event, tracked)
        except Refused as exc:
            logger.info("federated job %s: %s refused: %s", job_id, step.event.kind, exc)
            return
    for sent in tracked:
        send_again(app, sent)
    for effect in step.effects:
        if isinstance(effect, SendTrain):
            send(app, TaskName.federated_train, effect.request, device_queue(effect.request.device_id), setting=effect.setting)
        elif isinstance(effect, ClaimAndProfile):
            claim_and_profile(job_id, effect, lambda message, device, _: s.federated.note(job_id, EventKind.profiling, message, device))


def fail_aggregation(job_id: str, reason: str, round_number: int) -> None:
    """End the federated job as failed with `reason` if round `round_number` is still being
    aggregated (another run of the aggregation may have done it meanwhile)."""
    failed = Finished(phase=Phase.failed, reason=reason, aggregating=round_number)
    tracked = cleanup(job_id, failed)
    try:
        store().federated.apply(job_id, failed, tracked)
    except Refused as exc:
        logger.info("federated job %s: not failed (%s): %s", job_id, reason, exc)
        return
    for sent in tracked:
        send_again(app, sent)


def cleanup(job_id: str, event: FederatedEvent) -> list[SentTask]:
    """The deletion of the models the job leaves (on the server, which holds the artifact store),
    written in the ledger of sent tasks with an event that ends the job; none with another event."""
    return [to_track(TaskName.federated_cleanup, job_id, job_id=job_id)] if isinstance(event, (Finished, Cancelled)) else []
