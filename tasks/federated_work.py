"""The training side of a federated round: a device's local training (`federated_train`, on the
device's queue), the aggregation of a closed round (`federated_aggregate`, on the server
queue) and the deletion of the models a job that ended leaves (`federated_cleanup`, on the
server queue). Model states travel as hashed artifacts of the store folder, never as task arguments.
What a task hands in is an event the job's state accepts or refuses (common/federated/events.py),
so a stale, late, repeated or forged task changes nothing; an update's artifact is named for
the one run that made it, so discarding a refused update never touches an accepted one."""

from __future__ import annotations

import uuid

from celery import Task
from celery.utils.log import get_task_logger
from torch import nn

from edgetrain.common.artifacts import get_state, initial_model, put_state
from edgetrain.common.devices.base import Device
from edgetrain.common.federated.data import device_data, num_classes
from edgetrain.common.federated.events import Accepted, Refused, RoundAggregated, UpdateAccepted, UpdateRefused, being_aggregated
from edgetrain.common.federated.fairness import score
from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import (
    AggregateRequest,
    FederatedRecord,
    FederatedState,
    LocalUpdate,
    Phase,
    TrainRequest,
    Work,
    work_key,
)
from edgetrain.common.federated.rounds import (
    Buffered,
    State,
    Update,
    aggregate,
    apply_buffer,
    buffer_record,
    buffer_weights,
    delta,
    drift_correction,
    next_control,
    round_record,
    train_round,
)
from edgetrain.common.jobs.state import EventKind
from edgetrain.common.models import get_model
from edgetrain.common.security import artifact_path
from edgetrain.common.workload import measure_workload

from .app import app
from .context import bound_device, settings, store
from .contract import TaskFailed, TaskName, describe, send
from .federated import fail_aggregation

logger = get_task_logger(__name__)


def _global(record: FederatedRecord, weights: str) -> tuple[nn.Module, State]:
    """The model and the global weights `weights` (the spec's own before the first aggregation)."""
    spec = record.spec
    model = initial_model(spec.model, spec.weights, num_classes(spec), settings().artifact_dir)
    if weights == spec.weights:
        return model, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, get_state(weights, settings().artifact_dir)


@app.task(name=TaskName.federated_train.value, bind=True, pydantic=True, reject_on_worker_lost=False)
def federated_train(self: Task, request: TrainRequest) -> str:
    """Train this device's local steps of an open round (buffered: of its work in flight) from
    the global model, store the update and hand it in; returns what became of it
    (common/federated/events.py: Accepted). Nothing trains for a round that closed (a work no
    longer in flight), a task the round does not assign, or a second delivery of a task whose
    update is in."""
    device = bound_device(request.device_id)
    s, job_id, r = store(), request.job_id, request.round
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None:
        return "unknown job"
    found = _work(state, request)
    if isinstance(found, Accepted):
        return found.value
    what = f"work {request.work}" if request.work is not None else f"round {r}"
    try:
        update = _train(record, state, request, device, *found)
    except Exception as exc:  # its data, the model or the device: say why in the job's events; the job goes on without it
        if (after := s.federated.state(job_id)) is None or _late(after, request):  # closed meanwhile: its starting weights may be gone
            logger.info("federated %s %s on %s: no longer in flight, its training stopped: %s", job_id, what, request.device_id, exc)
            return Accepted.late.value
        reason = f"{what}: local training failed: {describe(exc)}"
        s.federated.note(job_id, EventKind.federated_update, reason, request.device_id)
        raise TaskFailed(reason) from exc
    try:
        s.federated.apply(job_id, UpdateAccepted(update=update))
        outcome = Accepted.accepted
    except UpdateRefused as exc:
        for artifact in update.artifacts():  # this run's own artifacts: an accepted update names others
            _remove(artifact)
        outcome = exc.outcome
        s.federated.note(job_id, EventKind.federated_update, f"{what}: update discarded ({outcome.value}: {exc})", request.device_id)
    send(app, TaskName.federated_advance, job_id)
    return outcome.value


def _work(state: FederatedState, request: TrainRequest) -> tuple[Assignment, str, Work | None] | Accepted:
    """What the request trains: its assignment, the global weights it starts from and (buffered)
    its work in flight; or why it trains nothing, noted in the job's events unless it is late."""
    s, job_id, device_id = store(), request.job_id, request.device_id
    work = state.work(request.work) if request.work is not None and state.phase == Phase.training else None
    if request.work is not None:
        what = f"work {request.work}"
        a, weights = (work.assignment, work.weights) if work is not None else (None, None)
    else:
        what, a, weights = f"round {request.round}", state.assigned(device_id), state.global_weights
    if _late(state, request):
        logger.info("federated %s %s on %s: no longer in flight", job_id, what, device_id)
        return Accepted.late
    duplicate = work is None if request.work is not None else device_id in state.received
    asked = (device_id, request.batch_size, request.frequency_hz, request.local_steps)
    if (a is None or weights is None or (a.device_id, a.batch_size, a.frequency_hz, a.local_steps) != asked) and not (
        duplicate and request.work is not None
    ):
        work_asked = f"b={request.batch_size} f={request.frequency_hz} x{request.local_steps}"
        s.federated.note(job_id, EventKind.federated_update, f"refused: {what} does not assign {device_id} {work_asked}", device_id)
        return Accepted.not_assigned
    if duplicate or a is None or weights is None:
        again = f"{what}: its training was delivered again; the update is in already"
        s.federated.note(job_id, EventKind.federated_update, again, device_id)
        return Accepted.duplicate
    return a, weights, work


def _late(state: FederatedState, request: TrainRequest) -> bool:
    """Whether the request's round is closed (buffered: its work neither in flight nor handed in:
    aggregated or dropped), so that nothing it trains would be taken."""
    if request.work is not None:
        in_flight = state.work(request.work) if state.phase == Phase.training else None
        return in_flight is None and work_key(request.device_id, request.work) not in {**state.received, **state.aggregating}
    return state.round != request.round or state.phase != Phase.training


def _train(record: FederatedRecord, state: FederatedState, request: TrainRequest, device: Device, a: Assignment, start_weights: str,
           work: Work | None) -> LocalUpdate:  # fmt: skip
    """Train the assignment's local steps from the global weights `start_weights` (with drift
    correction, corrected by the state's control variates) and store the update's weights
    (buffered: their change from the start) and its control variate under names of this run's own."""
    spec = record.spec
    model, start = _global(record, start_weights)
    data = device_data(spec, request.device_id)
    fix = drift_correction(_variate(state.control), _variate(state.drift.get(request.device_id)))
    device.bind_workload(measure_workload(spec.model, model, get_model(spec.model).example_input(num_classes(spec))))
    try:
        result, trained = train_round(spec, model, start, data, a, request.work or request.round, device, fix)
    finally:
        device.restore()
    name = f"fed-{record.job_id}-r{request.round}-{request.device_id}-{uuid.uuid4().hex[:8]}"
    weights = put_state(result.state if work is None else delta(result.state, start), name, settings().artifact_dir)
    gradient = None if result.gradient is None else put_state(result.gradient, f"{name}-drift", settings().artifact_dir)
    return LocalUpdate(job_id=record.job_id, device_id=request.device_id, round=request.round, weights=weights, held_samples=len(data),
                       trained=trained, work=request.work, started_s=work.started_s if work is not None else 0.0,
                       gradient=gradient)  # fmt: skip


def _variate(reference: str | None) -> State | None:
    """A control variate of drift correction, from its artifact (None: none yet)."""
    return None if reference is None else get_state(reference, settings().artifact_dir)


@app.task(name=TaskName.federated_aggregate.value, pydantic=True)
def federated_aggregate(request: AggregateRequest) -> float | None:
    """The job's aggregation of the updates the closed round accepted (FedAvg or FedNova; buffered:
    the buffer's changes weighted by samples and staleness), the new global model's accuracy on
    the server's test set and on each device's held-out data, and the round recorded; a round
    aggregated already is left as it is (None). Returns the global accuracy."""
    s, job_id, r = store(), request.job_id, request.round
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None or being_aggregated(state) != r:
        return None
    updates, ignored = s.federated.updates(job_id, state)
    if ignored:
        s.federated.note(job_id, EventKind.federated_update, f"round {r}: ignored entries the round never accepted: {', '.join(ignored)}")
    used = [updates[k] for k in (sorted(state.aggregating) if state.buffered else state.closed_with) if k in updates]
    stale = [r - u.round for u in used]
    try:
        model, current = _global(record, state.global_weights)
        merged = _merged(record, state, current, used, stale) if used else current  # no update: the global model stays
        weights = put_state(merged, f"fed-{job_id}-r{r}-global", settings().artifact_dir) if used else state.global_weights
        control, drift = _next_control(record, state, used, r)
        accuracy, held_out = score(record.spec, model, merged)
    except Exception as exc:  # the server cannot aggregate or evaluate (the test set, the weights): the job fails, saying why
        reason = f"round {r}: aggregation failed: {describe(exc)}"
        fail_aggregation(job_id, reason, r)
        raise TaskFailed(reason) from exc
    if state.buffered:
        buffered = [Buffered(u.trained, u.work or 0, u.finished_s, st) for u, st in zip(used, stale)]
        done = buffer_record(r, accuracy, buffered, state.elapsed_s, held_out, state.dropped)
    else:
        done = round_record(r, accuracy, [u.trained for u in used], state.elapsed_s, [a.device_id for a in state.assignments], held_out)
    try:
        s.federated.apply(job_id, RoundAggregated(record=done, weights=weights, control=control, drift=drift))
    except Refused:  # aggregated by another run, or the job ended meanwhile: this run's own new models, unless the job reads them
        now = s.federated.state(job_id)
        for own in [weights, control] if used else []:
            if own is not None and (now is None or own not in now.models_needed()):
                _remove(own)
        return None
    for u in updates.values():
        for artifact in u.artifacts():
            if artifact not in drift.values():  # a control variate taken in stays until the device's next one replaces it
                _remove(artifact)
    _delete_models(job_id)
    send(app, TaskName.federated_advance, job_id)
    return accuracy


def _next_control(record: FederatedRecord, state: FederatedState, used: list[LocalUpdate], r: int) -> tuple[str | None, dict[str, str]]:
    """Drift correction: the server's new control variate (stored) and each device's new one,
    from the updates `used` that bring one; (None, {}) when none does."""
    taken = {u.device_id: u.gradient for u in used if u.gradient}
    if not taken:
        return None, {}
    changed = [(_variate(state.drift.get(d)), get_state(g, settings().artifact_dir)) for d, g in taken.items()]
    control = next_control(_variate(state.control), changed, len(record.spec.devices))
    return put_state(control, f"fed-{record.job_id}-r{r}-control", settings().artifact_dir), taken


def _merged(record: FederatedRecord, state: FederatedState, current: State, used: list[LocalUpdate], stale: list[int]) -> State:
    """The next global weights from the updates `used` (FedAvg or FedNova; buffered: the changes
    weighted by samples and `stale`ness)."""
    states = [get_state(u.weights, settings().artifact_dir) for u in used]
    if state.buffered:
        return apply_buffer(current, list(zip(states, buffer_weights(record.spec, [u.held_samples for u in used], stale))))
    return aggregate(record.spec, current, [Update(w, u.held_samples, u.trained.assignment) for w, u in zip(states, used)])


@app.task(name=TaskName.federated_cleanup.value)
def federated_cleanup(job_id: str) -> int:
    """Delete the models a federated job that ended leaves: the updates it did not aggregate and
    its global models but the last (its result). Returns how many were deleted."""
    return _delete_models(job_id)


def _delete_models(job_id: str) -> int:
    """Delete the job's models that nothing reads any more (FederatedStore.models_to_delete):
    superseded global models once no work in flight starts from them and, once it ended, what
    it left; returns how many."""
    s = store()
    gone = s.federated.models_to_delete(job_id)
    for weights in gone:
        _remove(weights)
    s.federated.models_deleted(job_id, gone)
    return len(gone)


def _remove(weights: str) -> None:
    """Delete an artifact no round needs any more."""
    artifact_path(weights, settings().artifact_dir)[0].unlink(missing_ok=True)
