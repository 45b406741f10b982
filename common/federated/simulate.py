"""A federated fleet of SIMULATED twins in one process: real training of every device's local
steps on its own share of real data, device time and energy from each twin's model of its
board. One process holds the data once and one model, whatever the fleet's size, so a fleet of
many twins needs no process per twin (`edgetrain evaluate`'s federated preset)."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from pydantic import Field
from torch import nn
from torch.utils.data import TensorDataset

from ..artifacts import initial_model
from ..devices.simulated import SimulatedDevice, load_twin
from ..models import get_model
from ..profiling import profile
from ..schemas import LearningRatePolicy, ProfileTable, ProfilingOptions, RelationVector, Strict
from ..workload import measure_workload
from .data import device_data, num_classes, shares
from .fairness import score
from .plan import DeviceInRound, assign, participants
from .records import DeviceRound, RoundRecord
from .rounds import (
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
    round_seed,
    train_round,
)
from .spec import FederatedDevice, FederatedSpec

VECTOR = "+vector"  # a run's method with this suffix chose every (b, f) with a relation vector
FEDNOVA = "+fednova"  # a run's method with this suffix aggregated with FedNova's normalized averaging
SCAFFOLD = "+scaffold"  # a run's method with this suffix corrected its local steps for drift (aggregation.drift)
ASYNC = "+async"  # a run's method with this suffix ran buffered (asynchronous) aggregation
BUDGET = "+budget"  # a run's method with this suffix planned its rounds within the job's fleet power budget


class FederatedRun(Strict):
    """A federated job run to the target (or `max_rounds`) with one method and seed; figures
    from twins are SIMULATED."""

    method: str = Field(description="the job's local.method; with `+vector` when a relation vector chose (b, f), `+budget` when "
                                     "a fleet power budget held, `+fednova` when FedNova aggregated, `+scaffold` with drift "
                                     "correction")  # fmt: skip
    seed: int
    initial_accuracy: float
    rounds: list[RoundRecord]
    reached: bool
    time_to_target_s: float | None = Field(description="device time until the global model reached the target (s)")
    energy_to_target_j: float | None = Field(description="energy of every device's local steps until then (J)")
    simulated: bool = True


def twin_table(twin: str, spec: FederatedSpec, options: ProfilingOptions | None = None) -> ProfileTable:
    """The lookup table of `spec.model` on the twin `twin`, profiled over the spec's batch sizes."""
    return profile(SimulatedDevice(load_twin(twin)), get_model(spec.model), spec.batch_sizes, options or ProfilingOptions(),
                   LearningRatePolicy(optimizer=get_model(spec.model).optimizer))  # fmt: skip


def _in_round(d: FederatedDevice, r: int, twin: str, tables: dict[str, ProfileTable], boards: dict[str, SimulatedDevice]) -> DeviceInRound:
    return DeviceInRound(d.device_id, twin, d.cap_in(r), tables[twin], boards[d.device_id].power_envelope_w)


def _fleet(spec: FederatedSpec, twins: dict[str, str]) -> tuple[nn.Module, dict[str, TensorDataset], dict[str, SimulatedDevice], State]:
    """The job's model, each device's data and twin (bound to the model's workload) and the
    starting weights."""
    entry, classes = get_model(spec.model), num_classes(spec)
    model = initial_model(spec.model, spec.weights, classes)
    held = shares(spec)
    data = {d.device_id: device_data(spec, d.device_id, held.get(d.device_id)) for d in spec.devices}
    devices = {}
    for i, d in enumerate(spec.devices):
        board = SimulatedDevice(load_twin(twins[d.device_id]), seed=round_seed(spec.seed, 0, d.device_id) + i)
        board.bind_workload(measure_workload(spec.model, model, entry.example_input(classes)))
        devices[d.device_id] = board
    return model, data, devices, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _method(spec: FederatedSpec, vector: RelationVector | None) -> str:
    suffix = ASYNC if spec.aggregation.mode == "buffered" else FEDNOVA if spec.aggregation.rule == "fednova" else ""
    drift = SCAFFOLD if spec.aggregation.drift == "scaffold" else ""
    return spec.local.method + (VECTOR if vector else "") + (BUDGET if spec.local.fleet_power_w is not None else "") + suffix + drift


def simulate(
    spec: FederatedSpec, twins: dict[str, str], tables: dict[str, ProfileTable], vector: RelationVector | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> FederatedRun:  # fmt: skip
    """Run `spec` on twins (`twins`: device id -> twin name; `tables`: twin name -> table)
    round by round (or buffered: `simulate_buffered`) until the global accuracy reaches the
    target or `max_rounds` rounds ran."""
    if spec.aggregation.mode == "buffered":
        return simulate_buffered(spec, twins, tables, vector, on_round)
    model, data, devices, state = _fleet(spec, twins)
    first, _ = score(spec, model, state)
    rounds: list[RoundRecord] = []
    elapsed = energy = 0.0
    accuracy = first
    control: State | None = None  # drift correction: the server's control variate and each device's
    own: dict[str, State] = {}
    for r in range(1, spec.max_rounds + 1):
        if accuracy >= spec.target_accuracy:
            break
        taking_part = participants([d.device_id for d in spec.devices], spec.participation.fraction, spec.seed, r)
        plan = assign([_in_round(d, r, twins[d.device_id], tables, devices) for d in spec.devices if d.device_id in taking_part],
                      spec.local, vector)  # fmt: skip
        trained, updates, changed = [], [], []
        for a in plan:
            fix = drift_correction(control, own.get(a.device_id))
            result, done = train_round(spec, model, state, data[a.device_id], a, r, devices[a.device_id], fix)
            trained.append(done)
            updates.append(Update(result.state, len(data[a.device_id]), a))
            if result.gradient is not None:
                changed.append((a.device_id, result.gradient))
        state = aggregate(spec, state, updates)
        if changed:
            control = next_control(control, [(own.get(d), g) for d, g in changed], len(spec.devices))
            own.update(changed)
        accuracy, held_out = score(spec, model, state)
        record = round_record(r, accuracy, trained, elapsed, device_accuracy=held_out)
        elapsed, energy = record.elapsed_s, energy + record.energy_j
        rounds.append(record)
        if on_round:
            on_round(record)
    reached = accuracy >= spec.target_accuracy
    return FederatedRun(
        method=_method(spec, vector),
        seed=spec.seed, initial_accuracy=first, rounds=rounds, reached=reached,
        time_to_target_s=elapsed if reached else None, energy_to_target_j=energy if reached else None,
    )  # fmt: skip


def simulate_buffered(
    spec: FederatedSpec, twins: dict[str, str], tables: dict[str, ProfileTable], vector: RelationVector | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> FederatedRun:  # fmt: skip
    """Run `spec` buffered on twins, events in SIMULATED device time: every device trains from
    the newest global model as soon as its last work is in, its work chosen as the workers
    choose it (with every device's cap at the next aggregation), and the server aggregates
    every `buffer_size` updates at once, weighted by staleness, until the target or
    `max_rounds` aggregations."""
    model, data, devices, state = _fleet(spec, twins)
    first, _ = score(spec, model, state)
    order = {d.device_id: i for i, d in enumerate(spec.devices)}
    running: list[tuple[float, int, int, int, State, DeviceRound]] = []  # (finish s, device order, work, started round, delta, done)
    works = 0

    def start(device_id: str, at_s: float, version: int) -> None:
        nonlocal works
        r = version + 1
        plan = assign([_in_round(d, r, twins[d.device_id], tables, devices) for d in spec.devices], spec.local, vector)
        a = next(p for p in plan if p.device_id == device_id)
        works += 1
        result, done = train_round(spec, model, state, data[device_id], a, works, devices[device_id])
        heapq.heappush(running, (at_s + done.device_time_s, order[device_id], works, r, delta(result.state, state), done))

    for d in spec.devices:
        start(d.device_id, 0.0, 0)
    rounds: list[RoundRecord] = []
    buffer: list[tuple[float, int, int, int, State, DeviceRound]] = []
    elapsed = energy = 0.0
    accuracy, k = first, spec.aggregation.buffer_size or len(spec.devices)
    while accuracy < spec.target_accuracy and len(rounds) < spec.max_rounds:
        buffer.append(heapq.heappop(running))
        finish_s, _, _, _, _, done = buffer[-1]
        if len(buffer) >= k:
            number = len(rounds) + 1
            stale = [number - started for _, _, _, started, _, _ in buffer]
            weights = buffer_weights(spec, [len(data[d.assignment.device_id]) for *_, d in buffer], stale)
            state = apply_buffer(state, [(change, w) for (*_, change, _), w in zip(buffer, weights)])
            accuracy, held_out = score(spec, model, state)
            record = buffer_record(number, accuracy, [Buffered(d, n, f, s) for (f, _, n, _, _, d), s in zip(buffer, stale)], elapsed,
                                   held_out)  # fmt: skip
            elapsed, energy, buffer = record.elapsed_s, energy + record.energy_j, []
            rounds.append(record)
            if on_round:
                on_round(record)
        start(done.assignment.device_id, finish_s, len(rounds))
    reached = accuracy >= spec.target_accuracy
    return FederatedRun(method=_method(spec, vector), seed=spec.seed, initial_accuracy=first, rounds=rounds, reached=reached,
                        time_to_target_s=elapsed if reached else None, energy_to_target_j=energy if reached else None)  # fmt: skip
