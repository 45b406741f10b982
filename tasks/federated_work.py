"""The training side of a federated round: a device's local training (`federated_train`, on the
device's queue) and the aggregation of a closed round (`federated_aggregate`, on the server
queue). Model states travel as hashed artifacts of the store folder, never as task arguments.
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
from edgetrain.common.federated.events import Accepted, Refused, RoundAggregated, UpdateAccepted, UpdateRefused
from edgetrain.common.federated.fairness import score
from edgetrain.common.federated.records import AggregateRequest, FederatedRecord, FederatedState, LocalUpdate, Phase, TrainRequest
from edgetrain.common.federated.rounds import State, Update, aggregate, round_record, train_round
from edgetrain.common.jobs.state import EventKind
from edgetrain.common.models import get_model
from edgetrain.common.security import artifact_path
from edgetrain.common.workload import measure_workload

from .app import app
from .context import bound_device, settings, store
from .contract import TaskFailed, TaskName, describe, send
from .federated import fail_aggregation

logger = get_task_logger(__name__)


def _global(record: FederatedRecord, state: FederatedState) -> tuple[nn.Module, State]:
    """The model and the global weights of the round now (the spec's before round 1)."""
    spec = record.spec
    model = initial_model(spec.model, spec.weights, num_classes(spec), settings().artifact_dir)
    if state.global_weights == spec.weights:
        return model, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, get_state(state.global_weights, settings().artifact_dir)


@app.task(name=TaskName.federated_train.value, bind=True, pydantic=True, reject_on_worker_lost=False)
def federated_train(self: Task, request: TrainRequest) -> str:
    """Train this device's local steps of an open round from the global model, store the update
    and hand it in; returns what became of it (common/federated/events.py: Accepted). Nothing
    trains for a round that closed, a task the round does not assign, or a second delivery of
    a task whose update is in."""
    device = bound_device(request.device_id)
    s, job_id, r = store(), request.job_id, request.round
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None:
        return "unknown job"
    if state.round != r or state.phase != Phase.training:
        logger.info("federated %s round %d on %s: the round is closed", job_id, r, request.device_id)
        return Accepted.late.value
    a = state.assigned(request.device_id)
    if a is None or (a.batch_size, a.frequency_hz, a.local_steps) != (request.batch_size, request.frequency_hz, request.local_steps):
        work = f"b={request.batch_size} f={request.frequency_hz} x{request.local_steps}"
        reason = f"refused: round {r} does not assign {request.device_id} {work}"
        s.federated.note(job_id, EventKind.federated_update, reason, request.device_id)
        return Accepted.not_assigned.value
    if request.device_id in state.received:
        s.federated.note(job_id, EventKind.federated_update, f"round {r}: its training was delivered again; the update is in already",
                         request.device_id)  # fmt: skip
        return Accepted.duplicate.value
    try:
        update = _train(record, state, request, device)
    except Exception as exc:  # its data, the model or the device: say why in the job's events; the round goes on without it
        reason = f"round {r}: local training failed: {describe(exc)}"
        s.federated.note(job_id, EventKind.federated_update, reason, request.device_id)
        raise TaskFailed(reason) from exc
    try:
        s.federated.apply(job_id, UpdateAccepted(update=update))
        outcome = Accepted.accepted
    except UpdateRefused as exc:
        _remove(update.weights)  # this run's own artifact: an accepted update names another
        outcome = exc.outcome
        s.federated.note(job_id, EventKind.federated_update, f"round {r}: update discarded ({outcome.value}: {exc})", request.device_id)
    send(app, TaskName.federated_advance, job_id)
    return outcome.value


def _train(record: FederatedRecord, state: FederatedState, request: TrainRequest, device: Device) -> LocalUpdate:
    """Train the assignment's local steps from the global weights and store the update's weights
    under a name of this run's own."""
    spec, a = record.spec, state.assigned(request.device_id)
    assert a is not None, "the round assigns the device"
    model, start = _global(record, state)
    data = device_data(spec, request.device_id)
    device.bind_workload(measure_workload(spec.model, model, get_model(spec.model).example_input(num_classes(spec))))
    try:
        result, trained = train_round(spec, model, start, data, a, request.round, device)
    finally:
        device.restore()
    name = f"fed-{record.job_id}-r{request.round}-{request.device_id}-{uuid.uuid4().hex[:8]}"
    weights = put_state(result.state, name, settings().artifact_dir)
    return LocalUpdate(job_id=record.job_id, device_id=request.device_id, round=request.round, weights=weights, held_samples=len(data),
                       trained=trained)  # fmt: skip


@app.task(name=TaskName.federated_aggregate.value, pydantic=True)
def federated_aggregate(request: AggregateRequest) -> float | None:
    """The job's aggregation (FedAvg or FedNova) of the updates the closed round accepted, the
    new global model's accuracy on the server's test set and on each device's held-out data,
    and the round recorded; a round aggregated already is left as it is (None). Returns the
    global accuracy."""
    s, job_id, r = store(), request.job_id, request.round
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None or state.phase != Phase.aggregating or state.round != r:
        return None
    updates, ignored = s.federated.updates(job_id, state)
    if ignored:
        s.federated.note(job_id, EventKind.federated_update, f"round {r}: ignored entries the round never accepted: {', '.join(ignored)}")
    used = [updates[d] for d in state.closed_with if d in updates]
    try:
        model, current = _global(record, state)
        to_merge = [Update(get_state(u.weights, settings().artifact_dir), u.held_samples, u.trained.assignment) for u in used]
        merged = aggregate(record.spec, current, to_merge) if used else current
        weights = put_state(merged, f"fed-{job_id}-r{r}-global", settings().artifact_dir) if used else state.global_weights
        accuracy, held_out = score(record.spec, model, merged)
    except Exception as exc:  # the server cannot aggregate or evaluate (the test set, the weights): the job fails, saying why
        reason = f"round {r}: aggregation failed: {describe(exc)}"
        fail_aggregation(job_id, reason, r)
        raise TaskFailed(reason) from exc
    done = round_record(r, accuracy, [u.trained for u in used], state.elapsed_s, [a.device_id for a in state.assignments], held_out)
    try:
        s.federated.apply(job_id, RoundAggregated(record=done, weights=weights))
    except Refused:
        return None
    for u in updates.values():
        _remove(u.weights)
    if state.global_weights != record.spec.weights and state.global_weights != weights:
        _remove(state.global_weights)
    send(app, TaskName.federated_advance, job_id)
    return accuracy


def _remove(weights: str) -> None:
    """Delete an artifact no round needs any more."""
    artifact_path(weights, settings().artifact_dir)[0].unlink(missing_ok=True)
