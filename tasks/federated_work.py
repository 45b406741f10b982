"""The training side of a federated round: a device's local training (`federated_train`, on
the device's queue) and the aggregation of a closed round (`federated_aggregate`, on the
server queue). Model states travel as hashed artifacts of the store folder, never as task
arguments; each task checks what it was sent against the job's state, so a stale, late or
forged task changes nothing."""

from __future__ import annotations

from celery import Task
from celery.utils.log import get_task_logger
from torch import nn

from edgetrain.common.artifacts import get_state, initial_model, put_state
from edgetrain.common.devices.base import Device
from edgetrain.common.federated.data import device_data, num_classes, test_set
from edgetrain.common.federated.plan import Assignment
from edgetrain.common.federated.records import (
    AggregateRequest,
    DeviceRound,
    FederatedRecord,
    FederatedState,
    LocalUpdate,
    RoundRecord,
    TrainRequest,
)
from edgetrain.common.federated.rounds import LocalResult, State, fedavg, global_accuracy, local_train, round_seed
from edgetrain.common.jobs import EventKind, JobEvent
from edgetrain.common.models import get_model
from edgetrain.common.security import artifact_path
from edgetrain.common.store.federated import Accepted, Refused
from edgetrain.common.workload import measure_workload

from .app import app
from .context import bound_device, settings, store
from .contract import TaskFailed, TaskName, describe, send
from .federated import fail

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
    and hand it in; returns what became of it (common/store/federated.py: Accepted), or why
    nothing ran ("late": the round closed before it started)."""
    device = bound_device(request.device_id)
    s, job_id = store(), request.job_id
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None:
        return "unknown job"
    if state.round != request.round or state.phase != "training":
        logger.info("federated %s round %d on %s: the round is closed", job_id, request.round, request.device_id)
        return Accepted.late.value
    a = state.assigned(request.device_id)
    if a is None or (a.batch_size, a.frequency_hz, a.local_steps) != (request.batch_size, request.frequency_hz, request.local_steps):
        reason = (f"refused: round {request.round} does not assign {request.device_id} b={request.batch_size} "
                  f"f={request.frequency_hz} x{request.local_steps}")  # fmt: skip
        s.federated.event(job_id, EventKind.federated_update, reason, request.device_id)
        return Accepted.not_assigned.value
    try:
        update, result = _train(record, state, request, a, device)
    except Exception as exc:  # its data, the model or the device: say why in the job's events; the round goes on without it
        reason = f"round {request.round}: local training failed: {describe(exc)}"
        s.federated.event(job_id, EventKind.federated_update, reason, request.device_id)
        raise TaskFailed(reason) from exc
    outcome = s.federated.submit(update)
    sim = " (SIMULATED)" if result.simulated else ""
    if outcome == Accepted.accepted:
        message = f"round {request.round}: update in, {result.samples} samples, {result.device_time_s:.2f} s, {result.energy_j:.1f} J{sim}"
    else:
        _remove(update.weights)
        message = f"round {request.round}: update discarded ({outcome.value})"
    s.federated.event(job_id, EventKind.federated_update, message, request.device_id)
    send(app, TaskName.federated_advance, job_id)
    return outcome.value


def _train(
    record: FederatedRecord, state: FederatedState, request: TrainRequest, a: Assignment, device: Device
) -> tuple[LocalUpdate, LocalResult]:
    """Train the assignment's local steps from the global weights and store the update's weights."""
    spec = record.spec
    model, start = _global(record, state)
    data = device_data(spec, request.device_id)
    device.bind_workload(measure_workload(spec.model, model, get_model(spec.model).example_input(num_classes(spec))))
    try:
        seed = round_seed(spec.seed, request.round, request.device_id)
        result = local_train(model, start, data, a, spec.lr, spec.aggregation.mu, seed, device)
    finally:
        device.restore()
    assert result.device_time_s is not None and result.energy_j is not None
    weights = put_state(result.state, f"fed-{record.job_id}-r{request.round}-{request.device_id}", settings().artifact_dir)
    trained = DeviceRound(assignment=a, device_time_s=result.device_time_s, energy_j=result.energy_j, samples=result.samples,
                          simulated=result.simulated)  # fmt: skip
    update = LocalUpdate(job_id=record.job_id, device_id=request.device_id, round=request.round, weights=weights,
                         held_samples=len(data), trained=trained)  # fmt: skip
    return update, result


@app.task(name=TaskName.federated_aggregate.value, pydantic=True)
def federated_aggregate(request: AggregateRequest) -> float | None:
    """FedAvg over the updates a closed round fixed (weighted by the samples each device holds),
    the new global model's accuracy on the server's test set, and the round recorded; a round
    already aggregated is left as it is (None). Returns the global accuracy."""
    s, job_id, r = store(), request.job_id, request.round
    record, state = s.federated.record(job_id), s.federated.state(job_id)
    if record is None or state is None or state.phase != "aggregating" or state.round != r:
        return None
    updates = s.federated.updates(job_id, r)
    used = [updates[d] for d in state.closed_with if d in updates]
    try:
        model, current = _global(record, state)
        merged = fedavg([(get_state(u.weights, settings().artifact_dir), float(u.held_samples)) for u in used]) if used else current
        weights = put_state(merged, f"fed-{job_id}-r{r}-global", settings().artifact_dir) if used else state.global_weights
        accuracy = global_accuracy(model, merged, test_set(record.spec))
    except Exception as exc:  # the server cannot aggregate or evaluate (the test set, the weights): the job fails, saying why
        reason = f"round {r}: aggregation failed: {describe(exc)}"
        fail(job_id, reason)
        raise TaskFailed(reason) from exc
    round_s = max((u.trained.device_time_s for u in used), default=0.0)
    done = RoundRecord(
        round=r, accuracy=accuracy, device_time_s=round_s, elapsed_s=state.elapsed_s + round_s,
        energy_j=sum(u.trained.energy_j for u in used), devices=[u.trained for u in used],
        missing=sorted({a.device_id for a in state.assignments} - {u.device_id for u in used}),
    )  # fmt: skip
    event = JobEvent(kind=EventKind.federated_round, message=f"round {r} aggregated {len(used)} updates: global accuracy {accuracy:.4f}")
    try:
        s.federated.aggregated(job_id, done, weights, event)
    except Refused:
        return None
    for u in updates.values():
        _remove(u.weights)
    if state.global_weights != record.spec.weights and state.global_weights != weights:
        _remove(state.global_weights)
    s.federated.drop_round(job_id, r)
    send(app, TaskName.federated_advance, job_id)
    return accuracy


def _remove(weights: str) -> None:
    """Delete an artifact no round needs any more."""
    artifact_path(weights, settings().artifact_dir)[0].unlink(missing_ok=True)
