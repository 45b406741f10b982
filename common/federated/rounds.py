"""One federated round's work, the same on the workers and in the in-process simulation: a
device's local training from the global model (`train_round`), the aggregation of the updates
that arrived (`aggregate`: FedAvg or FedNova's normalized averaging), the drift correction's
control variates (`drift_correction`, `next_control`) and the round's record;
common/federated/fairness.py scores the global model.

Drift correction (`aggregation.drift: scaffold`, after SCAFFOLD, Karimireddy et al., ICML
2020): a device's local steps on its own labels pull the model toward them, the more the more
steps it takes, so time-balanced rounds on a skewed split converge to a model of the fast
devices' data. Each device's control variate c_i is the mean gradient of its own loss over its
last local work (collected from the steps it takes anyway: no extra pass); the server's c is
the mean of the devices' c_i; every local step adds c - c_i to its gradient before the
optimizer's step, so it follows the fleet's gradient rather than its own data's. With Adam the
corrected gradient is then normalized as any other. A device without a c_i yet trains
uncorrected."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..devices.base import Device
from ..schemas import LearningRatePolicy
from ..training import Trainer, make_optimizer
from .plan import Assignment
from .records import DeviceRound, RoundRecord, Work
from .spec import FederatedSpec

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalResult:
    """A device's update: its weights after `steps` local steps of `samples` samples, the
    device time (s), energy (J) and peak power (W) they took (None without a device) and,
    for drift correction, its control variate."""

    state: State
    steps: int
    samples: int
    device_time_s: float | None
    energy_j: float | None
    peak_power_w: float | None
    simulated: bool
    gradient: State | None = None  # drift correction: the mean gradient of its own loss over the steps (its new c_i)


def round_seed(seed: int, round_number: int, device_id: str) -> int:
    """The seed of one device's mini-batch order in one round."""
    return zlib.crc32(f"{seed}:{round_number}:{device_id}".encode())


def local_train(
    model: nn.Module, global_state: State, data: TensorDataset, assignment: Assignment, lr: LearningRatePolicy,
    mu: float, seed: int, device: Device | None = None, drift: bool = False, correction: State | None = None,
) -> LocalResult:  # fmt: skip
    """Train `model` from `global_state` on `data` for the assignment's steps at its batch size
    (a fresh optimizer, lr scaled for the batch) and, with `device`, at its frequency, measured;
    `mu` > 0 adds FedProx's proximal term (its gradient mu * (w - w_global) before each step).
    `drift`: also return the mean gradient of the loss over the steps (the device's control
    variate), and add `correction` (c - c_i, by parameter name) to every step's gradient."""
    model.load_state_dict(global_state)
    b = min(assignment.batch_size, len(data))
    optimizer = make_optimizer(model, lr, b)
    summed = _gradient_hooks(model, optimizer, mu, drift, correction)
    trainer = Trainer(model, optimizer, b, data, None, seed)
    if device is None:
        for _ in range(assignment.local_steps):
            trainer.step()
        measured = None
    else:
        device.set_frequency(assignment.frequency_hz)
        measured = device.run_steps(trainer.step, b, assignment.local_steps)
    state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
    gradient = {name: (g / max(1, trainer.steps)).cpu() for name, g in summed.items()} if drift else None
    return LocalResult(
        state=state, steps=trainer.steps, samples=trainer.samples,
        device_time_s=measured.elapsed_s if measured else None, energy_j=measured.energy_j if measured else None,
        peak_power_w=measured.peak_power_w if measured else None, simulated=bool(measured and measured.simulated),
        gradient=gradient,
    )  # fmt: skip


def _gradient_hooks(model: nn.Module, optimizer: torch.optim.Optimizer, mu: float, drift: bool, correction: State | None) -> State:
    """Register what runs on each parameter's gradient before every optimizer step, in order:
    with `drift`, summing the loss's own gradient (the sums are returned, by parameter name;
    empty without drift); FedProx's proximal gradient mu * (w - w_global) when `mu` > 0; with
    drift, adding `correction`."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    summed = {name: torch.zeros_like(p) for name, p in named} if drift else {}
    anchor = {name: p.detach().clone() for name, p in named} if mu > 0 else {}
    shift = {name: correction[name].to(p.device) for name, p in named} if drift and correction is not None else {}

    def before_step(*_: object) -> None:
        for name, p in named:
            if p.grad is None:
                continue
            if summed:
                summed[name].add_(p.grad)
            if anchor:
                p.grad.add_(p.detach() - anchor[name], alpha=mu)
            if shift:
                p.grad.add_(shift[name])

    if summed or anchor or shift:
        optimizer.register_step_pre_hook(before_step)
    return summed


def train_round(
    spec: FederatedSpec, model: nn.Module, global_state: State, data: TensorDataset, assignment: Assignment, round_number: int,
    device: Device, correction: State | None = None,
) -> tuple[LocalResult, DeviceRound]:  # fmt: skip
    """A device's local work of round `round_number` as `assignment` says, from the global
    weights, seeded by the job, the round and the device, measured on `device`; with drift
    correction, corrected by `correction` (`drift_correction`) and returning its control variate."""
    seed = round_seed(spec.seed, round_number, assignment.device_id)
    drift = spec.aggregation.drift == "scaffold"
    result = local_train(model, global_state, data, assignment, spec.lr, spec.aggregation.mu, seed, device, drift, correction)
    assert result.device_time_s is not None and result.energy_j is not None, "a device measures its steps"
    trained = DeviceRound(assignment=assignment, device_time_s=result.device_time_s, energy_j=result.energy_j, samples=result.samples,
                          simulated=result.simulated)  # fmt: skip
    return result, trained


def round_record(round_number: int, accuracy: float, trained: Sequence[DeviceRound], elapsed_before_s: float,
                 assigned: Sequence[str] = (), device_accuracy: dict[str, float] | None = None) -> RoundRecord:  # fmt: skip
    """The record of an aggregated round: devices train side by side, so the round lasts as
    long as its slowest update; `assigned` devices without an update are `missing`;
    `device_accuracy`: the global model on each device's held-out data (common/federated/fairness.py)."""
    round_s = max((d.device_time_s for d in trained), default=0.0)
    return RoundRecord(
        round=round_number, accuracy=accuracy, device_time_s=round_s, elapsed_s=elapsed_before_s + round_s,
        energy_j=sum(d.energy_j for d in trained), devices=list(trained),
        missing=sorted(set(assigned) - {d.assignment.device_id for d in trained}), device_accuracy=device_accuracy or {},
    )  # fmt: skip


@dataclass(frozen=True)
class Update:
    """A device's update as the server aggregates it: its weights, the samples its device holds
    (its weight in the average) and the work it was assigned."""

    state: State
    held_samples: int
    assignment: Assignment


def local_work(lr: LearningRatePolicy, assignment: Assignment, held_samples: int) -> float:
    """A device's local work in a round, FedNova's normalizer a_i, in reference steps: its local
    steps times the learning rate of its batch size (as `local_train` uses it) over `lr_ref`.
    With Adam every step moves each weight by about the learning rate whatever the gradient's
    scale, so an update's size grows with steps x lr; with plain SGD a_i would be the steps."""
    return assignment.local_steps * lr.lr_for(min(assignment.batch_size, held_samples)) / lr.lr_ref


def aggregate(spec: FederatedSpec, global_state: State, updates: Sequence[Update]) -> State:
    """The next global weights from a round's updates by the job's `aggregation.rule`: `fedavg`
    or `fednova` (normalized averaging with each device's `local_work`)."""
    weighted = [(u.state, float(u.held_samples)) for u in updates]
    if spec.aggregation.rule == "fedavg":
        return fedavg(weighted)
    return fednova(global_state, weighted, [local_work(spec.lr, u.assignment, u.held_samples) for u in updates])


def fednova(global_state: State, updates: Sequence[tuple[State, float]], work: Sequence[float]) -> State:
    """FedNova's normalized averaging (Wang et al., 2020): with p_i the updates' weights over
    their sum and a_i > 0 each device's local work, w = w_g - tau_eff * sum_i p_i (w_g - w_i) / a_i
    where tau_eff = sum_i p_i a_i: each update's change per unit of work, averaged, then taken
    for the fleet's effective work. Equal work gives FedAvg; integer buffers as in `fedavg`."""
    if len(work) != len(updates) or any(a <= 0 for a in work):
        raise ValueError(f"every update needs a local work above 0, got {list(work)} for {len(updates)} updates")
    merged = fedavg(updates)  # checks the weights; integer buffers from the most heavily weighted update
    total = sum(w for _, w in updates)
    tau_eff = sum(w / total * a for (_, w), a in zip(updates, work))
    for key, value in global_state.items():
        if value.is_floating_point():
            start = value.double()
            step = sum(((start - state[key].double()) * (w / total / a) for (state, w), a in zip(updates, work)), torch.zeros_like(start))
            merged[key] = (start - tau_eff * step).to(value.dtype)
    return merged


def fedavg(updates: Sequence[tuple[State, float]]) -> State:
    """FedAvg: the average of the updates' tensors weighted by their weights (samples held);
    integer buffers (counters) are taken from the most heavily weighted update."""
    if not updates:
        raise ValueError("no update to aggregate")
    total = sum(w for _, w in updates)
    if total <= 0:
        raise ValueError(f"update weights must sum above 0, got {[w for _, w in updates]}")
    heaviest = max(updates, key=lambda u: u[1])[0]
    merged: State = {}
    for key, value in heaviest.items():
        if value.is_floating_point():
            weighted = (state[key].double() * (w / total) for state, w in updates)
            merged[key] = sum(weighted, torch.zeros_like(value, dtype=torch.float64)).to(value.dtype)
        else:
            merged[key] = value.clone()
    return merged


def drift_correction(control: State | None, own: State | None) -> State | None:
    """What a device adds to each local step's gradient: the server's control variate minus its
    own (c - c_i), by parameter name; None (no correction) until both are known."""
    if control is None or own is None:
        return None
    return {name: control[name] - own[name] for name in own}


def next_control(control: State | None, changed: Sequence[tuple[State | None, State]], devices: int) -> State:
    """The server's control variate c, the mean of every device's c_i, after the devices of a
    round replaced theirs (`changed`: (c_i before, or None the first time; c_i now)), the job
    having `devices` devices (a device not heard from yet counts as 0)."""
    if not changed:
        raise ValueError("no control variate to take in")
    out = {name: v.clone().double() for name, v in control.items()} if control is not None else None
    for before, now in changed:
        if out is None:
            out = {name: torch.zeros_like(v, dtype=torch.float64) for name, v in now.items()}
        for name, value in now.items():
            moved = value.double() - (before[name].double() if before is not None else 0.0)
            out[name] += moved / devices
    assert out is not None
    return {name: v.float() for name, v in out.items()}


def delta(trained: State, start: State) -> State:
    """A buffered update as it travels: each floating-point tensor's change from the weights its
    work started from; integer buffers (counters) as trained."""
    return {k: v - start[k] if v.is_floating_point() else v.clone() for k, v in trained.items()}


def apply_buffer(global_state: State, deltas: Sequence[tuple[State, float]]) -> State:
    """FedBuff's server step: w = w_g + sum_i p_i * c_i * delta_i, with p_i each update's samples
    held over the buffer's and c_i its staleness weight (`deltas`: (delta_i, p_i * c_i) with the
    p_i summing to 1), so a buffer of fresh updates gives FedAvg; integer buffers from the update
    of the largest weight."""
    if not deltas:
        raise ValueError("no update to aggregate")
    heaviest = max(deltas, key=lambda u: u[1])[0]
    merged: State = {}
    for key, value in global_state.items():
        if value.is_floating_point():
            moved = sum((d[key].double() * w for d, w in deltas), torch.zeros_like(value, dtype=torch.float64))
            merged[key] = (value.double() + moved).to(value.dtype)
        else:
            merged[key] = heaviest[key].clone()
    return merged


def buffer_weights(spec: FederatedSpec, held: Sequence[int], staleness: Sequence[int]) -> list[float]:
    """Each buffered update's weight p_i * c_i: its samples held over the buffer's, times its
    staleness weight (`aggregation.staleness`)."""
    total = sum(held)
    return [n / total * spec.aggregation.staleness_weight(s) for n, s in zip(held, staleness)]


@dataclass(frozen=True)
class Buffered:
    """A buffered update as its aggregation records it: what its device did, the work's number,
    the device time at which its device finished it (s since the job started) and its staleness
    (aggregations since its work started)."""

    trained: DeviceRound
    work: int
    finished_s: float
    staleness: int


def buffer_record(number: int, accuracy: float, updates: Sequence[Buffered], elapsed_before_s: float,
                  device_accuracy: dict[str, float] | None = None, dropped: Sequence[Work] = ()) -> RoundRecord:  # fmt: skip
    """The record of buffered aggregation `number`: it happens when the last of its updates is
    in, so the job's device time is the latest finish so far; its energy is its updates' and
    that of the works `dropped` since the aggregation before (past their deadline), each at the
    energy its table expects (J; none where the table holds no energy), since what its device
    spent on it is not known."""
    elapsed = max([elapsed_before_s, *(u.finished_s for u in updates)])
    lost_j = sum(w.assignment.expected_energy_j or 0.0 for w in dropped)
    return RoundRecord(
        round=number, accuracy=accuracy, device_time_s=elapsed - elapsed_before_s, elapsed_s=elapsed,
        energy_j=sum(u.trained.energy_j for u in updates) + lost_j, devices=[u.trained for u in updates],
        staleness=[u.staleness for u in updates], works=[u.work for u in updates], device_accuracy=device_accuracy or {},
        dropped=[w.work for w in dropped], missing=sorted({w.device_id for w in dropped}),
    )  # fmt: skip
