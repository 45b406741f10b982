"""Federated fine-tuning's pure parts: the seeded splits, each device's configuration and local
work per round, who takes part, FedAvg, FedProx's local training and the job spec."""

import itertools
import random

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.data import TensorDataset

from edgetrain.common.federated.budget import options
from edgetrain.common.federated.data import device_data, labels_of, shares
from edgetrain.common.federated.data import test_set as server_test_set
from edgetrain.common.federated.evaluation import PRESET, FederatedEvaluationSpec, preset, summarize
from edgetrain.common.federated.fairness import score
from edgetrain.common.federated.partition import MIN_SAMPLES, split
from edgetrain.common.federated.plan import Assignment, DeviceInRound, assign, balanced_steps, participants, round_time_s
from edgetrain.common.federated.records import DeviceRound, Fairness, RoundRecord
from edgetrain.common.federated.rounds import Update, aggregate, drift_correction, fedavg, fednova, local_train, local_work, next_control
from edgetrain.common.federated.simulate import FederatedRun
from edgetrain.common.federated.spec import MAX_ROUNDS, Aggregation, FederatedSpec, LocalWork, Partition
from edgetrain.common.schemas import LearningRatePolicy, ProfileTable, RelationVector
from edgetrain.common.selection import SelectionError

LABELS = np.repeat(np.arange(10), 100)  # 10 labels, 100 samples each


def test_iid_and_shards_splits_are_disjoint_cover_every_sample_and_are_seeded() -> None:
    for partition in (Partition(scheme="iid", seed=3), Partition(scheme="shards", shards_per_device=2, seed=3)):
        parts = split(LABELS, 7, partition)
        together = np.concatenate(parts)
        assert len(parts) == 7 and all(len(p) >= MIN_SAMPLES for p in parts)
        assert len(together) == len(LABELS) and set(together.tolist()) == set(range(len(LABELS)))  # disjoint, all of them
        again = split(LABELS, 7, partition)
        assert all(np.array_equal(a, b) for a, b in zip(parts, again))
        other = split(LABELS, 7, partition.model_copy(update={"seed": 4}))
        assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_shards_give_each_device_few_labels() -> None:
    parts = split(LABELS, 10, Partition(scheme="shards", shards_per_device=2))
    assert max(len(np.unique(LABELS[p])) for p in parts) <= 2 * 2  # a shard of a sorted split spans at most two labels


def test_dirichlet_split_is_disjoint_seeded_and_more_skewed_with_a_smaller_alpha() -> None:
    def max_label_share(alpha: float) -> float:
        parts = split(LABELS, 8, Partition(scheme="dirichlet", alpha=alpha, seed=1))
        together = np.concatenate(parts)
        assert len(set(together.tolist())) == len(together)  # disjoint
        assert all(np.array_equal(a, b) for a, b in zip(parts, split(LABELS, 8, Partition(scheme="dirichlet", alpha=alpha, seed=1))))
        return float(np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]))

    skewed, even = max_label_share(0.1), max_label_share(100.0)
    assert even < 0.2  # about 1/10 with near-equal proportions
    assert skewed > 0.5 > even


@pytest.mark.parametrize(
    "labels, devices, partition, field",
    [
        (LABELS[:50], 7, Partition(scheme="iid"), "dataset: 50 training samples cannot give 7 devices"),
        (LABELS[:100], 12, Partition(scheme="shards", shards_per_device=3), "partition.shards_per_device: 3 shards per device"),
        (np.repeat(np.arange(10), 10), 12, Partition(scheme="dirichlet", alpha=0.01), "partition.alpha: Dir(0.01) over 12 devices"),
        (LABELS, 0, Partition(), "devices: at least one device"),
    ],
)
def test_a_split_that_cannot_give_every_device_enough_samples_names_the_field(labels, devices, partition, field) -> None:
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        split(labels, devices, partition)


# T for N_s = 64 samples (s), peak P (W) and E (J) at batch sizes 8 and 32, frequencies 100..300 Hz
TABLE = ProfileTable(
    batch_sizes=[8, 32], frequencies_hz=[100, 200, 300], samples=64,
    time_s=[[6.0, 3.0, 1.2], [3.0, 1.5, 1.0]],
    peak_power_w=[[2.0, 3.0, 4.0], [3.0, 5.0, 7.0]],
    energy_j=[[12.0, 9.0, 4.8], [9.0, 7.5, 7.0]],
)  # fmt: skip


def _scaled(table: ProfileTable, factor: float) -> ProfileTable:
    """The table of a device `factor` times slower at every point."""
    return table.model_copy(update={"time_s": [[v * factor for v in row] for row in table.time_s]})


def test_equation4_and_baseline1_choose_under_the_cap_and_train_equal_steps() -> None:
    device = [DeviceInRound("nano-1", "jetson-nano", 5.5, TABLE)]
    (eq4,) = assign(device, LocalWork(method="equation4", local_steps=5))
    # eq. (4), r_b = 1: b=8 may run at 300 Hz (4 W): T = 1.2 s; b=32 at 200 Hz (5 W): 1.5 s
    assert (eq4.batch_size, eq4.frequency_hz, eq4.local_steps) == (8, 300, 5)
    assert eq4.expected_time_s == pytest.approx(5 * 1.2 * 8 / 64)
    assert eq4.expected_energy_j == pytest.approx(5 * 4.8 * 8 / 64)
    (b1,) = assign(device, LocalWork(method="baseline1", local_steps=5))
    # Baseline 1: the largest batch, at the highest frequency whose worst-row power (3, 5, 7 W) is under 5.5 W
    assert (b1.batch_size, b1.frequency_hz, b1.local_steps) == (32, 200, 5)
    assert b1.expected_time_s == pytest.approx(5 * 1.5 * 32 / 64)
    assert b1.strategy == "baseline1" and eq4.strategy == "equation4"


def test_equal_steps_methods_give_every_device_local_steps() -> None:
    fleet = [
        DeviceInRound(f"d{k}", "t", cap, _scaled(TABLE, factor)) for k, (cap, factor) in enumerate([(None, 1.0), (4.0, 3.0), (6.0, 0.5)])
    ]
    for method in ("equation4", "baseline1"):
        assert [a.local_steps for a in assign(fleet, LocalWork(method=method, local_steps=7))] == [7, 7, 7]


def test_time_balanced_steps_give_every_device_about_the_median_devices_time() -> None:
    fleet = [DeviceInRound(f"d{k}", "t", 5.5, _scaled(TABLE, factor)) for k, factor in enumerate([1.0, 5.0, 0.25, 2.0, 0.6])]
    plan = assign(fleet, LocalWork(method="edgetrain", local_steps=10))
    assert plan[0].local_steps == 10  # the median device (factor 1.0): 8 samples at 300 Hz, 0.15 s a step
    budget = plan[0].expected_time_s
    for a in plan:
        step_s = a.expected_time_s / a.local_steps
        assert abs(a.expected_time_s - budget) <= step_s / 2 + 1e-9, a
    assert [a.local_steps for a in plan] == [10, 2, 40, 5, 17]


def test_partial_work_to_a_deadline_keeps_baseline1s_configuration_and_balances_its_time() -> None:
    fleet = [DeviceInRound(f"d{k}", "t", 5.5, _scaled(TABLE, factor)) for k, factor in enumerate([1.0, 5.0, 0.25])]
    plan = assign(fleet, LocalWork(method="baseline1-deadline", local_steps=10))
    fixed = assign(fleet, LocalWork(method="baseline1", local_steps=10))
    assert [(a.batch_size, a.frequency_hz, a.strategy) for a in plan] == [(a.batch_size, a.frequency_hz, a.strategy) for a in fixed]
    # Baseline 1's b=32 at 200 Hz: 0.75 s a step on d0 (the median), 3.75 s on d1, 0.1875 s on d2; a 7.5 s budget
    assert [a.local_steps for a in plan] == [10, 2, 40]


def test_balanced_steps_keep_at_least_min_steps() -> None:
    assert balanced_steps([1.0, 2.0, 100.0], LocalWork(method="edgetrain", local_steps=4, min_steps=3)) == [8, 4, 3]


def test_a_cap_no_configuration_meets_names_the_device() -> None:
    fleet = [DeviceInRound("nano-1", "jetson-nano", None, TABLE), DeviceInRound("nano-2", "jetson-nano", 1.5, TABLE)]
    for method in ("edgetrain", "equation4", "baseline1", "baseline1-deadline"):
        with pytest.raises(SelectionError, match=r"^device nano-2: power cap 1.50 W is below what any configuration needs"):
            assign(fleet, LocalWork(method=method))


def _fleet(seed: int, n: int = 3) -> list[DeviceInRound]:
    """`n` devices of seeded caps and speeds (TABLE scaled)."""
    rng = random.Random(seed)
    return [DeviceInRound(f"d{k}", "t", rng.choice([None, 5.5, 4.5]), _scaled(TABLE, rng.choice([0.25, 0.5, 1, 2, 4]))) for k in range(n)]


def _watts(plan: list[Assignment], round_s: float) -> float:
    return sum(a.expected_energy_j or 0.0 for a in plan) / round_s


def test_a_fleet_power_budget_the_time_balanced_plan_fits_leaves_it_as_it_is() -> None:
    fleet = [DeviceInRound(f"d{k}", "t", 5.5, _scaled(TABLE, factor)) for k, factor in enumerate([1.0, 5.0, 0.25])]
    work = LocalWork(method="edgetrain", local_steps=10)
    plan = assign(fleet, work)
    round_s = plan[0].expected_time_s  # the median device's 10 steps
    assert assign(fleet, work.model_copy(update={"fleet_power_w": _watts(plan, round_s) * 1.001})) == plan


def test_under_a_tighter_fleet_power_budget_devices_trade_steps_and_clock_for_progress_per_joule() -> None:
    fleet = [DeviceInRound(f"d{k}", "t", None, _scaled(TABLE, factor)) for k, factor in enumerate([1.0, 2.0, 0.25])]
    work = LocalWork(method="edgetrain", local_steps=10)
    plan = assign(fleet, work)
    round_s = plan[0].expected_time_s
    progress = [sum(a.batch_size * a.local_steps for a in plan)]
    for share in (0.8, 0.6, 0.4, 0.2):
        budget_w = share * _watts(plan, round_s)
        within = assign(fleet, work.model_copy(update={"fleet_power_w": budget_w}))
        assert _watts(within, round_s) <= budget_w * (1 + 1e-9)
        for a in within:  # no device trains past the round's time budget by more than a step
            assert a.expected_time_s <= round_s + a.expected_time_s / a.local_steps / 2 + 1e-9, a
        assert {a.strategy for a in within} == {"fleet_power"}
        progress.append(sum(a.batch_size * a.local_steps for a in within))
    assert progress == sorted(progress, reverse=True) and progress[-1] < progress[0]
    # at 20 % every device trains b=8 at 300 Hz, the most samples per joule of TABLE (0.6 J a step)
    assert {(a.batch_size, a.frequency_hz) for a in within} == {(8, 300)}


def test_a_fleet_power_budget_plan_is_within_5_percent_of_the_best_plan() -> None:
    """Against every plan of seeded three-device fleets (each device one (b, f) of TABLE under its
    cap and 1 to as many steps as fit the round): the most progress within the budget."""
    work = LocalWork(method="edgetrain", local_steps=6)
    ratios = []
    for seed in range(60):
        fleet = _fleet(seed)
        plan = assign(fleet, work)
        round_s = round_time_s([a.expected_time_s / a.local_steps for a in plan], work)
        budget_w = random.Random(seed).uniform(0.3, 1.0) * _watts(plan, round_s)
        within = assign(fleet, work.model_copy(update={"fleet_power_w": budget_w}))
        every = [options(d.table, d.power_cap_w, RelationVector.uniform(TABLE.batch_sizes), round_s, 1) for d in fleet]
        best = max(
            sum(o.progress * k for o, k in combo)
            for combo in itertools.product(*[[(o, k) for o in opts for k in range(1, o.steps + 1)] for opts in every])
            if sum(o.step_j * k for o, k in combo) <= budget_w * round_s * (1 + 1e-9)
        )
        ratios.append(sum(a.batch_size * a.local_steps for a in within) / best)
    assert min(ratios) >= 0.95, min(ratios)


def test_a_fleet_power_budget_no_plan_meets_names_the_field_and_the_least_it_needs() -> None:
    fleet = [DeviceInRound(f"d{k}", "t", None, _scaled(TABLE, factor)) for k, factor in enumerate([1.0, 2.0, 0.25])]
    with pytest.raises(
        SelectionError, match=r"^local\.fleet_power_w: 0\.01 W over the round's time budget .* need at least [0-9.]+ W \(1 step"
    ):
        assign(fleet, LocalWork(method="edgetrain", local_steps=10, fleet_power_w=0.01))
    without_energy = [DeviceInRound("d0", "t", None, TABLE), DeviceInRound("d1", "t", None, TABLE.model_copy(update={"energy_j": None}))]
    for budget_w in (0.01, 1e6):  # a generous budget too: a table without energy cannot show that the plan fits
        with pytest.raises(SelectionError, match=r"^device d1: objective 'fleet_power' needs the energy E\[b\]\[f\] of the lookup table"):
            assign(without_energy, LocalWork(method="edgetrain", local_steps=10, fleet_power_w=budget_w))
    with pytest.raises(ValidationError, match=r"local\.fleet_power_w: applies only with method edgetrain .*, not baseline1-deadline"):
        LocalWork(method="baseline1-deadline", fleet_power_w=20.0)


def test_participants_are_a_seeded_fraction_different_per_round() -> None:
    fleet = [f"d{k}" for k in range(10)]
    picked = [participants(fleet, 0.3, seed=5, round_number=r) for r in range(1, 9)]
    assert all(len(p) == 3 and p == sorted(p, key=fleet.index) for p in picked)
    assert picked == [participants(fleet, 0.3, seed=5, round_number=r) for r in range(1, 9)]
    assert len({tuple(p) for p in picked}) > 1
    assert picked != [participants(fleet, 0.3, seed=6, round_number=r) for r in range(1, 9)]
    assert participants(fleet, 1.0, 5, 1) == fleet
    assert participants(fleet, 0.01, 5, 1) != [] and participants([], 0.5, 5, 1) == []


def test_fedavg_weights_the_updates_by_their_samples_and_keeps_integer_buffers() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([5.0, -2.0]), "n": torch.tensor(7)}
    merged = fedavg([(a, 1.0), (b, 3.0)])
    assert torch.equal(merged["w"], torch.tensor([4.0, -1.0]))  # 1/4 * a + 3/4 * b
    assert merged["w"].dtype == torch.float32
    assert merged["n"].item() == 7 and merged["n"].dtype == torch.int64  # the heaviest update's counter
    half = fedavg([({"w": torch.tensor([1.0], dtype=torch.float16)}, 2.0), ({"w": torch.tensor([2.0], dtype=torch.float16)}, 2.0)])
    assert half["w"].dtype == torch.float16 and half["w"].item() == 1.5


def test_fedavg_refuses_no_updates_and_weights_that_sum_to_zero() -> None:
    with pytest.raises(ValueError, match="no update to aggregate"):
        fedavg([])
    with pytest.raises(ValueError, match=r"update weights must sum above 0, got \[0.0, 0.0\]"):
        fedavg([({"w": torch.ones(1)}, 0.0), ({"w": torch.zeros(1)}, 0.0)])


def _work(steps: int, batch_size: int = 16) -> Assignment:
    return Assignment(device_id="d", device_type="t", power_cap_w=None, batch_size=batch_size, frequency_hz=1, local_steps=steps,
                      expected_time_s=1.0, expected_energy_j=None, strategy="equation4")  # fmt: skip


def test_fednova_divides_each_change_by_its_local_work_and_rescales_by_the_effective_work() -> None:
    start = {"w": torch.tensor([0.0, 1.0]), "n": torch.tensor(1)}
    fast = {"w": torch.tensor([2.0, 3.0]), "n": torch.tensor(4)}  # change (2, 2) in 1 unit of work
    slow = {"w": torch.tensor([10.0, -9.0]), "n": torch.tensor(9)}  # change (10, -10) in 10 units
    merged = fednova(start, [(fast, 1.0), (slow, 1.0)], [1.0, 10.0])
    # per unit of work (2, 2) and (1, -1), averaged (1.5, 0.5), times tau_eff = (1 + 10) / 2 = 5.5, from the start
    assert torch.allclose(merged["w"], torch.tensor([8.25, 1.0 + 2.75]))
    assert torch.allclose(fedavg([(fast, 1.0), (slow, 1.0)])["w"], torch.tensor([6.0, -3.0]))  # FedAvg differs
    assert merged["n"].item() == 4  # integer buffers as FedAvg takes them (the first of equal weights)
    weighted = fednova(start, [(fast, 3.0), (slow, 1.0)], [1.0, 10.0])
    # p = (3/4, 1/4): tau_eff = 0.75 + 2.5 = 3.25; per unit (0.75 * 2 + 0.25 * 1, 0.75 * 2 - 0.25) = (1.75, 1.25)
    assert torch.allclose(weighted["w"], torch.tensor([3.25 * 1.75, 1.0 + 3.25 * 1.25]))
    same = fednova(start, [(fast, 3.0), (slow, 1.0)], [4.0, 4.0])  # equal work: FedAvg
    assert torch.allclose(same["w"], fedavg([(fast, 3.0), (slow, 1.0)])["w"])
    with pytest.raises(ValueError, match=r"every update needs a local work above 0, got \[1.0, 0.0\]"):
        fednova(start, [(fast, 1.0), (slow, 1.0)], [1.0, 0.0])


def test_local_work_counts_steps_and_the_batch_sizes_learning_rate_and_the_job_chooses_the_rule() -> None:
    lr = LearningRatePolicy(lr_ref=1e-3, b_ref=64, rule="sqrt")
    assert local_work(lr, _work(10, 64), 500) == pytest.approx(10.0)
    assert local_work(lr, _work(10, 16), 500) == pytest.approx(5.0)  # lr_16 = lr_ref * sqrt(16 / 64)
    assert local_work(lr, _work(10, 64), 16) == pytest.approx(5.0)  # a device holding 16 samples trains batches of 16
    start = {"w": torch.zeros(1)}
    updates = [Update({"w": torch.tensor([1.0])}, 100, _work(1, 64)), Update({"w": torch.tensor([8.0])}, 100, _work(4, 64))]
    spec = FederatedSpec.model_validate(SPEC | {"lr": {"lr_ref": 1e-3, "b_ref": 64}})
    assert aggregate(spec, start, updates)["w"].item() == pytest.approx(4.5)  # FedAvg by default
    nova = spec.model_copy(update={"aggregation": Aggregation(rule="fednova")})
    assert aggregate(nova, start, updates)["w"].item() == pytest.approx(2.5 * 1.5)  # per step (1, 2), tau_eff 2.5


def _linear_task(samples: int, batch_size: int, local_steps: int) -> tuple:
    """Seeded random data of 3 classes, a linear model, its weights, one device's work at
    `batch_size` for `local_steps` steps, and a learning rate of 0.05 at that batch size."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(samples, 8), torch.randint(0, 3, (samples,)))
    model = nn.Linear(8, 3)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    work = Assignment(device_id="d", device_type="t", power_cap_w=None, batch_size=batch_size, frequency_hz=1,
                      local_steps=local_steps, expected_time_s=1.0, expected_energy_j=None, strategy="equation4")  # fmt: skip
    return data, model, start, work, LearningRatePolicy(lr_ref=0.05, b_ref=batch_size)


def test_fedprox_keeps_the_local_model_closer_to_the_global_weights() -> None:
    data, model, start, work, lr = _linear_task(256, 16, 40)

    def drift(mu: float) -> float:
        result = local_train(model, start, data, work, lr, mu, seed=1)
        assert result.steps == 40 and result.samples == 40 * 16 and result.device_time_s is None
        return sum(float((result.state[k] - start[k]).norm() ** 2) for k in start) ** 0.5

    plain, prox = drift(0.0), drift(1.0)
    assert drift(0.0) == pytest.approx(plain)  # seeded: the same mini-batches
    assert 0 < prox < 0.5 * plain


def test_drift_correction_collects_the_loss_s_own_mean_gradient_and_corrects_every_step_by_it() -> None:
    data, model, start, one, lr = _linear_task(64, 64, 1)
    model.load_state_dict(start)
    nn.functional.cross_entropy(model(data.tensors[0]), data.tensors[1]).backward()
    at_start = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    shift = {name: torch.full_like(g, 0.5) for name, g in at_start.items()}
    plain = local_train(model, start, data, one, lr, 0.0, seed=1)
    collected = local_train(model, start, data, one, lr, 0.0, seed=1, drift=True)
    corrected = local_train(model, start, data, one, lr, 1.0, seed=1, drift=True, correction=shift)
    assert plain.gradient is None and all(torch.equal(plain.state[k], collected.state[k]) for k in start)  # collecting changes nothing
    assert all(torch.allclose(collected.gradient[k], at_start[k], atol=1e-6) for k in at_start)  # one full batch: the gradient at w_g
    assert all(torch.allclose(corrected.gradient[k], at_start[k], atol=1e-6) for k in at_start)  # its own, not the corrected one
    assert not torch.allclose(corrected.state["weight"], collected.state["weight"])
    many = local_train(model, start, data, one.model_copy(update={"local_steps": 3, "batch_size": 16}), lr, 0.0, seed=1, drift=True)
    assert many.steps == 3 and not torch.allclose(many.gradient["weight"], at_start["weight"])  # the mean over its mini-batches


def test_the_server_s_control_variate_is_the_mean_of_every_device_s_and_a_device_corrects_by_the_difference() -> None:
    a, b, a2 = {"w": torch.tensor([2.0])}, {"w": torch.tensor([4.0])}, {"w": torch.tensor([8.0])}
    assert drift_correction(None, a) is None and drift_correction(a, None) is None  # nothing to correct by yet
    control = next_control(None, [(None, a)], devices=4)
    assert control["w"].item() == pytest.approx(0.5)  # the devices not heard from count as 0
    control = next_control(control, [(None, b), (a, a2)], devices=4)
    assert control["w"].item() == pytest.approx((8 + 4) / 4)
    assert drift_correction(control, a2)["w"].item() == pytest.approx(3 - 8)
    with pytest.raises(ValueError, match="no control variate"):
        next_control(control, [], devices=4)


SPEC = {
    "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
    "target_accuracy": 0.8, "devices": [{"device_id": "a"}, {"device_id": "b", "power_cap_w": 5.0}],
}  # fmt: skip


def _problems(spec: dict) -> str:
    with pytest.raises(ValidationError) as err:
        FederatedSpec.model_validate(spec)
    return "\n".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.value.errors())


def test_the_spec_refuses_a_wrong_kind_repeated_devices_and_missing_data_naming_the_fields() -> None:
    assert "kind: Input should be 'federated'" in _problems(SPEC | {"kind": "finetune"})
    repeated = _problems(SPEC | {"devices": [{"device_id": "a"}, {"device_id": "b"}, {"device_id": "a"}]})
    assert "devices: each device may appear once; repeated ['a']" in repeated
    missing = _problems({k: v for k, v in SPEC.items() if k != "dataset"})
    assert "dataset: required when a device names no dataset of its own" in missing
    assert "devices.1.power_cap_w: Input should be greater than 0" in _problems(
        SPEC | {"devices": [{"device_id": "a"}, {"device_id": "b", "power_cap_w": 0}]}
    )
    assert "partition.scheme: Input should be 'iid', 'shards' or 'dirichlet'" in _problems(SPEC | {"partition": {"scheme": "zipf"}})
    assert "local.method: Input should be 'edgetrain', 'equation4', 'baseline1' or 'baseline1-deadline'" in _problems(
        SPEC | {"local": {"method": "fastest"}}
    )
    assert "aggregation.rule: Input should be 'fedavg' or 'fednova'" in _problems(SPEC | {"aggregation": {"rule": "fedprox"}})


def test_devices_with_their_own_data_need_no_job_dataset_and_the_others_share_it() -> None:
    own = FederatedSpec.model_validate(
        {k: v for k, v in SPEC.items() if k != "dataset"} | {"devices": [{"device_id": "a", "dataset": {"name": "digits"}}]}
    )
    assert own.partitioned() == [] and shares(own) == {}
    spec = FederatedSpec.model_validate(
        SPEC | {"devices": [{"device_id": "a"}, {"device_id": "b"}, {"device_id": "c", "dataset": {"name": "digits"}}]}
    )
    assert spec.partitioned() == ["a", "b"]
    held = shares(spec)
    assert set(held) == {"a", "b"} and not set(held["a"]) & set(held["b"])
    assert len(device_data(spec, "a")) == len(held["a"])
    assert len(device_data(spec, "c")) == len(held["a"]) + len(held["b"])  # its own dataset: the whole training split


class _Always(nn.Module):
    """Predicts from its bias alone, whatever the input."""

    def __init__(self, classes: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(len(x), -1)


def test_each_device_is_scored_on_held_out_data_like_its_own() -> None:
    spec = FederatedSpec.model_validate(
        SPEC
        | {
            "partition": {"scheme": "shards", "shards_per_device": 1},
            "devices": [{"device_id": "a"}, {"device_id": "b"}],
        }
    )
    always_zero = {"bias": torch.eye(10)[0]}
    accuracy, devices = score(spec, _Always(10), always_zero)
    test_labels = server_test_set(spec).tensors[1]
    assert accuracy == pytest.approx(float((test_labels == 0).float().mean()))
    for device_id, held in shares(spec).items():  # per-class accuracy (1 for class 0, else 0) weighted by its share's labels
        assert devices[device_id] == pytest.approx(float((labels_of(spec)[held] == 0).mean()))
    assert max(devices.values()) > 0.15 > min(devices.values()) == 0.0  # sorted shards: one device holds the zeros
    own = FederatedSpec.model_validate(SPEC | {"devices": [{"device_id": "a"}, {"device_id": "c", "dataset": {"name": "digits"}}]})
    _, with_own = score(own, _Always(10), always_zero)
    assert with_own["c"] == pytest.approx(accuracy)  # its own dataset's test split: here the same digits


def test_fairness_is_the_mean_the_worst_device_and_the_spread() -> None:
    fair = Fairness.of({"a": 0.9, "b": 0.5, "c": 0.7})
    assert (fair.mean, fair.worst, fair.worst_device) == (pytest.approx(0.7), 0.5, "b")
    assert fair.spread == pytest.approx((0.08 / 3) ** 0.5)
    assert fair.line() == "mean 0.7000, worst 0.5000 (b), spread (std) 0.1633"
    assert Fairness.of({}) is None


def _run(method: str, seed: int, round_times_s: list[float], reached: bool, worst: float = 0.5) -> FederatedRun:
    """A run whose rounds each took `round_times_s` (device s) and 2 J, one device taking part;
    the global model scores `worst` and 0.9 on the devices' held-out data."""
    work = Assignment(device_id="d", device_type="t", power_cap_w=None, batch_size=8, frequency_hz=1, local_steps=1,
                      expected_time_s=1.0, expected_energy_j=None, strategy=method)  # fmt: skip
    elapsed = [sum(round_times_s[: k + 1]) for k in range(len(round_times_s))]
    rounds = [RoundRecord(round=k + 1, accuracy=0.5, device_time_s=t, elapsed_s=e, energy_j=2.0,
                          devices=[DeviceRound(assignment=work, device_time_s=t, energy_j=2.0, samples=8)],
                          device_accuracy={"d": 0.9, "e": worst})
              for k, (t, e) in enumerate(zip(round_times_s, elapsed))]  # fmt: skip
    return FederatedRun(method=method, seed=seed, initial_accuracy=0.1, rounds=rounds, reached=reached,
                        time_to_target_s=elapsed[-1] if reached else None, energy_to_target_j=2.0 * len(rounds) if reached else None)  # fmt: skip


def test_the_summary_is_over_the_seeds_that_reached_and_speeds_up_only_where_every_seed_did() -> None:
    runs = [
        _run("baseline1", 0, [1.0, 1.0, 1.0, 1.0], True), _run("baseline1", 1, [1.0, 1.0], True),
        _run("edgetrain", 0, [0.5, 0.5], True), _run("edgetrain", 1, [0.5], True),
        _run("equation4", 0, [1.0], True, worst=0.3), _run("equation4", 1, [1.0] * 5, False, worst=0.1),
    ]  # fmt: skip
    baseline, balanced, equal = summarize(runs, ["baseline1", "edgetrain", "equation4"])
    assert (baseline.device_worst.mean, baseline.device_mean.mean, baseline.device_spread.mean) == (
        0.5,
        pytest.approx(0.7),
        pytest.approx(0.2),
    )
    assert (equal.device_worst.mean, equal.device_worst.std) == (pytest.approx(0.2), pytest.approx(0.1))  # every seed, reached or not
    assert (baseline.reached, baseline.rounds.mean, baseline.rounds.std) == (2, 3.0, 1.0)
    assert (baseline.time_to_target_s.mean, baseline.energy_to_target_j.mean) == (3.0, 6.0)
    assert balanced.time_to_target_s.mean == 0.75 and balanced.time_to_target_s.std == 0.25
    assert balanced.speedup_vs_baseline1 == pytest.approx(3.0 / 0.75) and baseline.speedup_vs_baseline1 == 1.0
    assert (equal.runs, equal.reached, equal.time_to_target_s.mean, equal.speedup_vs_baseline1) == (2, 1, 1.0, None)
    assert [a.device_id for a in equal.plan] == ["d"]
    (alone,) = summarize(runs, ["edgetrain"])
    assert alone.speedup_vs_baseline1 is None  # no Baseline 1 to compare with


def test_the_preset_fleet_and_an_evaluation_spec_refuse_what_cannot_run() -> None:
    spec = preset()
    assert len(spec.job.devices) >= 6 and len(set(spec.twins.values())) >= 3 and len(spec.seeds) >= 3
    assert len({d.power_cap_w for d in spec.job.devices}) == len(spec.job.devices)
    assert spec.job.partition.scheme == "dirichlet" and spec.job.partition.alpha == 0.5 and spec.job.target_accuracy == 0.9
    one = spec.run_spec("equation4", 7)
    assert (one.seed, one.local.method, one.local.local_steps) == (7, "equation4", spec.job.local.local_steps)
    assert spec.job.local.method == "edgetrain" and spec.job.seed == 0  # the spec itself is left as it was
    with pytest.raises(ValidationError, match=r"methods\n.*each method may appear once"):
        FederatedEvaluationSpec.model_validate(PRESET | {"methods": ["edgetrain", "edgetrain"]})
    with pytest.raises(ValidationError, match=r"twins: \['tx2-9'\] are not devices of job.devices"):
        FederatedEvaluationSpec.model_validate(PRESET | {"twins": PRESET["twins"] | {"tx2-9": "jetson-tx2-nx"}})


def test_an_async_run_is_a_valid_buffered_job_or_its_evaluation_spec_is_refused() -> None:
    """`edgetrain+async` runs the job buffered: a job with a fraction of the devices per round
    cannot be, so its spec is refused with that method (and runs without it), and the run's
    aggregations (`max_rounds` rounds of every device, K at a time) stay within MAX_ROUNDS."""
    partial = PRESET["job"] | {"participation": {"fraction": 0.5}}
    with pytest.raises(ValidationError, match=r"job\.participation\.fraction to 1 or leave \['edgetrain\+async'\] out of methods"):
        FederatedEvaluationSpec.model_validate(PRESET | {"job": partial})
    rounds_only = FederatedEvaluationSpec.model_validate(PRESET | {"job": partial, "methods": ["baseline1", "edgetrain"]})
    assert rounds_only.run_spec("edgetrain", 1).participation.fraction == 0.5
    long = FederatedEvaluationSpec.model_validate(PRESET | {"job": PRESET["job"] | {"max_rounds": MAX_ROUNDS}})
    run = long.run_spec("edgetrain+async", 1)
    assert (run.aggregation.mode, run.aggregation.buffer_size, run.max_rounds, run.local.method) == ("buffered", 3, MAX_ROUNDS, "edgetrain")
    assert FederatedSpec.model_validate(run.model_dump()) == run
    assert preset().run_spec("edgetrain+async", 1).max_rounds == 60 * 6 // 3


def test_a_budget_run_keeps_the_jobs_fleet_power_budget_and_every_other_run_drops_it() -> None:
    budgeted = PRESET["job"] | {"local": {"local_steps": 10, "fleet_power_w": 40.0}}
    spec = FederatedEvaluationSpec.model_validate(PRESET | {"job": budgeted, "methods": ["baseline1", "edgetrain", "edgetrain+budget"]})
    assert spec.run_spec("edgetrain+budget", 1).local.fleet_power_w == 40.0
    assert spec.run_spec("edgetrain", 1).local.fleet_power_w is None and spec.run_spec("baseline1", 1).local.fleet_power_w is None
    assert "edgetrain+budget" not in preset().methods  # the ready-made fleet has no budget
    with pytest.raises(
        ValidationError, match=r"methods: \['edgetrain\+budget'\] need a fleet power budget: give job\.local\.fleet_power_w"
    ):
        FederatedEvaluationSpec.model_validate(PRESET | {"methods": ["edgetrain", "edgetrain+budget"]})
    with pytest.raises(ValidationError, match=r"job\.local\.fleet_power_w: no method uses it; add edgetrain\+budget to methods"):
        FederatedEvaluationSpec.model_validate(PRESET | {"job": budgeted})


def test_a_scaffold_method_runs_its_job_with_drift_correction_and_the_others_without() -> None:
    evaluation = preset()
    assert "edgetrain+scaffold" in evaluation.methods
    corrected = evaluation.run_spec("edgetrain+scaffold", 1)
    assert (corrected.local.method, corrected.aggregation.drift, corrected.aggregation.rule) == ("edgetrain", "scaffold", "fedavg")
    assert {evaluation.run_spec(m, 1).aggregation.drift for m in evaluation.methods if m != "edgetrain+scaffold"} == {"none"}
