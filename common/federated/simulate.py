"""A federated fleet of SIMULATED twins in one process: real training of every device's local
steps on its own share of real data, device time and energy from each twin's model of its
board. One process holds the data once and one model, whatever the fleet's size, so a fleet of
many twins needs no process per twin (`edgetrain evaluate`'s federated preset)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from ..artifacts import initial_model
from ..devices.simulated import SimulatedDevice, load_twin
from ..models import get_model
from ..profiling import profile
from ..schemas import LearningRatePolicy, ProfileTable, ProfilingOptions, RelationVector, Strict
from ..workload import measure_workload
from .data import device_data, num_classes, shares
from .fairness import score
from .plan import DeviceInRound, assign, participants
from .records import RoundRecord
from .rounds import Update, aggregate, round_record, round_seed, train_round
from .spec import FederatedDevice, FederatedSpec

VECTOR = "+vector"  # a run's method with this suffix chose every (b, f) with a relation vector
FEDNOVA = "+fednova"  # a run's method with this suffix aggregated with FedNova's normalized averaging


class FederatedRun(Strict):
    """A federated job run to the target (or `max_rounds`) with one method and seed; figures
    from twins are SIMULATED."""

    method: str = Field(description="the job's local.method; with `+vector` when a relation vector chose (b, f), `+fednova` "
                                     "when FedNova aggregated")  # fmt: skip
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


def simulate(
    spec: FederatedSpec, twins: dict[str, str], tables: dict[str, ProfileTable], vector: RelationVector | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> FederatedRun:  # fmt: skip
    """Run `spec` on twins (`twins`: device id -> twin name; `tables`: twin name -> table)
    round by round until the global accuracy reaches the target or `max_rounds` rounds ran."""
    entry, classes = get_model(spec.model), num_classes(spec)
    model = initial_model(spec.model, spec.weights, classes)
    held = shares(spec)
    data = {d.device_id: device_data(spec, d.device_id, held.get(d.device_id)) for d in spec.devices}
    devices = {}
    for i, d in enumerate(spec.devices):
        board = SimulatedDevice(load_twin(twins[d.device_id]), seed=round_seed(spec.seed, 0, d.device_id) + i)
        board.bind_workload(measure_workload(spec.model, model, entry.example_input(classes)))
        devices[d.device_id] = board
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    first, _ = score(spec, model, state)
    rounds: list[RoundRecord] = []
    elapsed = energy = 0.0
    accuracy = first
    for r in range(1, spec.max_rounds + 1):
        if accuracy >= spec.target_accuracy:
            break
        taking_part = participants([d.device_id for d in spec.devices], spec.participation.fraction, spec.seed, r)
        plan = assign([_in_round(d, r, twins[d.device_id], tables, devices) for d in spec.devices if d.device_id in taking_part],
                      spec.local, vector)  # fmt: skip
        trained, updates = [], []
        for a in plan:
            result, done = train_round(spec, model, state, data[a.device_id], a, r, devices[a.device_id])
            trained.append(done)
            updates.append(Update(result.state, len(data[a.device_id]), a))
        state = aggregate(spec, state, updates)
        accuracy, held_out = score(spec, model, state)
        record = round_record(r, accuracy, trained, elapsed, device_accuracy=held_out)
        elapsed, energy = record.elapsed_s, energy + record.energy_j
        rounds.append(record)
        if on_round:
            on_round(record)
    reached = accuracy >= spec.target_accuracy
    return FederatedRun(
        method=spec.local.method + (VECTOR if vector else "") + (FEDNOVA if spec.aggregation.rule == "fednova" else ""),
        seed=spec.seed, initial_accuracy=first, rounds=rounds, reached=reached,
        time_to_target_s=elapsed if reached else None, energy_to_target_j=energy if reached else None,
    )  # fmt: skip
