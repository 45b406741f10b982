"""Exploration with bounded regret, judged on settings no rule was tuned on.

Settings come from a seed (`settings(seed)`): a pre-training dataset (or a seeded
initialisation), a proxy dataset and its target accuracy, a target dataset, its fraction and
target accuracy, two device twins with their caps, and a set of batch sizes. "related" settings
pre-train on Fashion-MNIST and fine-tune on handwritten digits with another set of digits as the
proxy; "poor" settings start from a seeded initialisation, with a proxy of another kind (digits
for clothes, clothes for digits). Seeds 0-3, 100-105 and 200-205 were used for tuning; 300-305
are held out (`--held-out`): no rule or number in common/finetune/belief.py,
common/finetune/exploration.py, common/finetune/trust.py or common/finetune/closed_loop.py was
chosen on them.

For each setting, real training (cached by bench/runs.py): the pre-trained weights, the proxy's
N_b (2 seeds: the server pool's vector) and the target's solo runs at every batch size (one per
job seed, with their curves of test accuracy and loss); the twins' lookup tables (the real
profiling code). Every row (twin, cap) then runs a sequence of jobs on the same data (job k
with seed k), the rows of a round one after the other, so a job finds the records of every
earlier job on the data, as a fleet's do.

A job is the product's own fine-tune control on those curves: the closed loop
(common/finetune/closed_loop.py: the belief of common/finetune/belief.py, the exploration policy of
common/finetune/exploration.py, its dwell, hysteresis, switch budget and exploration end) around the cap
control (common/finetune/adaptive.py), stepping through `train_to_accuracy` a trainer that replays the
recorded curves (`CurveTrainer`: at batch size b with seed s it trains along the curve of
(b, s); a switch continues on the new batch size's curve from the sample where it first reaches
the test loss reached so far, as a solo run's progress is its test loss (common/finetune/learned.py),
less one evaluation interval for the switch), on a device that replays the twin's table. The
proxy's trust is learned (common/finetune/trust.py) from the settings run before on the same proxy.
Device time is the table's T[b][f*_b] / N_s per sample to the crossing of the target (SIMULATED
twins), the same for every method.

Compared per job, like for like on the same seed: Baseline 1, the paper's plain equation (4)
on the proxy's vector, and the oracle (equation (4) on the target's N_b over the job seeds).

    python -m bench.exploration [--seeds 0 1 2 3 ... | --held-out] [--jobs 5] [--json OUT] [--verbose]
                                [--processes N] [--prepare-only] [--together shown|hidden|curves]

`--together` runs the rows of a round at the same time, as the devices of one job on the same
data: each job sees the records of earlier rounds and, with "shown", the starts of the rows
before it in the round (what the fleet shows of a run at its start), not their curves; with
"curves", also their curves as far as they had run at its own device time (what the fleet shows
of a running fine-tune at each evaluation), so only the rows after it in the round are unseen.

`--processes N` computes the missing cached runs of every chosen seed first, in N worker
processes of one thread each; `--prepare-only` stops there.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from bench.runs import EVAL_EVERY, MAX_SAMPLES, pretrained, reference_run, table, vector
from edgetrain.common.devices.simulated import load_twin
from edgetrain.common.finetune.adaptive import AdaptiveControl, CapFollower
from edgetrain.common.finetune.closed_loop import ClosedLoop, LoopSettings
from edgetrain.common.finetune.learned import DataIdentity, Envelope, FinetuneRecord, RecordIdentity
from edgetrain.common.finetune.trust import ProxyCheck, proxy_check, trust_width
from edgetrain.common.schemas import DeviceTarget, LearningRatePolicy, ProfileTable, RelationVector, Selection
from edgetrain.common.selection import Baseline1, Equation4, Oracle, SelectionError
from edgetrain.common.tables import rows_of
from edgetrain.common.testing.devices import ReplayDevice
from edgetrain.common.training import DeviceTotals, train_to_accuracy

TUNING_SEEDS = [0, 1, 2, 3, 100, 101, 102, 103, 104, 105, 200, 201, 202, 203, 204, 205]
HELD_OUT_SEEDS = [300, 301, 302, 303, 304, 305]
MODEL = "smallcnn"
CAPS = {"jetson-nano": [3.5, 5.0, None], "jetson-tx2-nx": [5.0, 6.0, None], "jetson-orin-nano": [8.0, 9.5, None]}
BATCH_SETS = [[4, 8, 16, 32, 64, 128], [8, 16, 32, 64, 128], [16, 32, 64, 128], [8, 16, 32, 64]]


@dataclass(frozen=True)
class Goal:
    """A dataset (as a DatasetRef's fields) and the accuracy it is trained to."""

    dataset: dict[str, Any]
    accuracy: float

    @property
    def label(self) -> str:
        fraction = self.dataset.get("fraction", 1.0)
        return f"{self.dataset['name']}{'' if fraction == 1.0 else f'/{fraction:g}'} to {self.accuracy:g}"


@dataclass(frozen=True)
class Setting:
    """One generated setting: weights, proxy, target, the rows (twin, cap) and the batch sizes."""

    seed: int
    kind: str
    weights: tuple[str, int, int] | str  # (pre-training dataset, samples) or init:<seed>
    proxy: Goal
    target: Goal
    rows: tuple[tuple[str, float | None], ...]
    batch_sizes: tuple[int, ...]

    @property
    def name(self) -> str:
        start = self.weights if isinstance(self.weights, str) else f"pre-trained on {self.weights[0]}"
        return f"#{self.seed} {self.kind}: {start}, proxy {self.proxy.label} -> {self.target.label}, b in {list(self.batch_sizes)}"

    def weights_url(self) -> str:
        return self.weights if isinstance(self.weights, str) else pretrained(MODEL, self.weights[0], self.weights[1])


def settings(seed: int) -> Setting:
    """The setting of generator seed `seed` (see the module docstring)."""
    rng = random.Random(seed)
    kind = "related" if seed % 2 == 0 else "poor"
    if kind == "related":
        weights: tuple[str, int, int] | str = ("fashion_mnist", rng.choice([30_000, 60_000]), 0)
        proxy = rng.choice([Goal({"name": "digits"}, rng.choice([0.88, 0.9, 0.92])),
                            Goal({"name": "mnist5k", "fraction": 0.3}, rng.choice([0.88, 0.9]))])  # fmt: skip
        target = Goal({"name": "mnist5k", "fraction": rng.choice([0.5, 0.7, 1.0])}, rng.choice([0.88, 0.9, 0.92]))
    else:
        weights = f"init:{rng.randrange(4)}"
        if (seed // 2) % 2 == 0:
            proxy = Goal({"name": "digits"}, rng.choice([0.85, 0.9]))
            target = Goal({"name": "fashion_mnist", "fraction": rng.choice([0.05, 0.1])}, rng.choice([0.75, 0.78]))
        else:
            proxy = Goal({"name": "fashion_mnist", "fraction": 0.05}, rng.choice([0.75, 0.78]))
            target = Goal({"name": rng.choice(["mnist5k", "digits"])}, rng.choice([0.88, 0.9]))
    twins = rng.sample(sorted(CAPS), 2)
    rows = tuple((twin, cap) for twin in twins for cap in CAPS[twin])
    return Setting(seed, kind, weights, proxy, target, rows, tuple(rng.choice(BATCH_SETS)))


@dataclass
class Curves:
    """The target's recorded solo runs of a setting, by (batch size, seed)."""

    setting: Setting
    weights: str

    def run(self, b: int, seed: int) -> dict[str, Any]:
        return reference_run(MODEL, self.weights, self.setting.target.dataset, self.setting.target.accuracy, b, seed)

    def n(self, b: int, seed: int) -> float | None:
        return self.run(b, seed)["outcome"]["samples_to_accuracy"]


@dataclass
class Job:
    """A replayed fine-tune: what it ran (segments of batch size and samples), its device time
    to the target (s, SIMULATED; inf where it never reached it), its samples to accuracy, the
    start choice's role and note, its exploration's cost bound and report, its switches' notes
    and the record it left."""

    row: tuple[str, float | None]
    seed: int
    index: int
    segments: list[tuple[int, int]]
    time_s: float
    samples: float
    role: str
    note: str
    cost_bound: float
    exploration: str
    decisions: list[str]
    record: FinetuneRecord
    exploit: Selection


def per_sample_s(tbl: ProfileTable, b: int, f: int) -> float:
    """The table's device time per sample at (b, f) (s, SIMULATED)."""
    time_s = tbl.time_s[tbl.batch_sizes.index(b)][tbl.frequencies_hz.index(f)]
    assert time_s is not None
    return time_s / tbl.samples


class CurveTrainer:
    """A trainer that replays the target's recorded solo runs of one seed: at batch size b it
    moves along the curve of (b, seed) (accuracy and test loss interpolated between its
    evaluations); a switch (setting `batch_size`) continues on the new batch size's curve from
    the sample where it first reaches the lowest test loss reached so far, less one evaluation
    interval for the switch."""

    def __init__(self, curves: Curves, seed: int, batch_size: int):
        self.curves, self.seed, self._batch_size = curves, seed, batch_size
        self.samples = self.steps = 0
        self.position = 0.0  # samples along the running batch size's curve
        self.test_loss: float | None = None
        self.lowest: float | None = None
        self.optimizer = SimpleNamespace(param_groups=[{"lr": 0.0}])

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, b: int) -> None:
        if b != self._batch_size and self.lowest is not None:
            curve = self.curves.run(b, self.seed)["curve"]
            reached = Envelope([(n, loss) for n, _, loss in curve]).samples_at(self.lowest)
            self.position = max(0.0, (reached if reached is not None else curve[-1][0]) - EVAL_EVERY)
        self._batch_size = b

    def step(self) -> None:
        self.samples += self._batch_size
        self.position += self._batch_size
        self.steps += 1

    def evaluate(self) -> float:
        curve = self.curves.run(self._batch_size, self.seed)["curve"]
        k = bisect.bisect_right([p[0] for p in curve], self.position)
        if k >= len(curve):
            accuracy, loss = curve[-1][1], curve[-1][2]
        else:
            (n0, a0, l0), (n1, a1, l1) = curve[k - 1], curve[k]
            w = (self.position - n0) / (n1 - n0)
            accuracy, loss = a0 + w * (a1 - a0), l0 + w * (l1 - l0)
        self.test_loss = loss
        self.lowest = loss if self.lowest is None else min(self.lowest, loss)
        return accuracy


def replay(curves: Curves, tbl: ProfileTable, cap: float | None, envelope: list[float], prior: RelationVector,
           records: Callable[[float], list[FinetuneRecord]], trust: float, seed: int, index: int, row: tuple[str, float | None],
           settings: LoopSettings, started: dict[str, FinetuneRecord] | None = None) -> Job:  # fmt: skip
    """One edgetrain job: the product's closed loop (common/finetune/closed_loop.py) around the cap
    control (common/finetune/adaptive.py) on a replayed table (SIMULATED time and power), training a
    CurveTrainer to the target as a fine-tune trains, starting from equation (4)'s choice on the
    prior as a job's devices do. `records` gives the records it sees at a device time of its run
    (s). `started`, when given, gets the partial record the job shows at its start (what the jobs
    that start meanwhile see of it)."""
    st, lr = curves.setting, LearningRatePolicy()
    initial = Equation4(prior).choose(tbl, cap)
    trainer = CurveTrainer(curves, seed, initial.batch_size)
    device = ReplayDevice(tbl)
    device.set_frequency(initial.frequency_hz)
    follower = CapFollower(DeviceTarget(device_id="replayed", power_cap_w=cap), lambda: None, poll_s=0.0)
    adaptive = AdaptiveControl(device, trainer, lr, tbl, Equation4(prior), follower, cap, initial.frequency_hz)  # type: ignore[arg-type]
    data = DataIdentity(name=st.target.dataset["name"], fraction=st.target.dataset.get("fraction", 1.0))
    identity = RecordIdentity(record_id=f"{row}:{index}", model=MODEL, weights=curves.weights, data=data,
                              target_accuracy=st.target.accuracy, lr=lr, eval_every_samples=EVAL_EVERY,
                              device_type=row[0], seed=seed)  # fmt: skip
    shown = (lambda r: started.setdefault(r.record_id, r)) if started is not None else (lambda _: None)
    run = DeviceTotals()
    loop = ClosedLoop(adaptive, prior, lambda: records(run.elapsed_s), identity, settings, trust=trust, power_envelope_w=envelope,
                      publish=shown)  # fmt: skip
    choice = loop.start(run)
    if choice is None:
        raise RuntimeError(f"no configuration of {row} meets its cap")
    outcome, totals = train_to_accuracy(trainer, st.target.accuracy, EVAL_EVERY, 2 * MAX_SAMPLES, seed, device,  # type: ignore[arg-type]
                                        totals=run, control=loop)  # fmt: skip
    record = loop.finish(totals, outcome)
    reached = outcome.samples_to_accuracy
    overshoot = 0 if reached is None else outcome.samples_processed - reached  # trained past the crossing, to the evaluation after it
    # a job that never reached the target (its batch size does not on this data) is a miss in every figure: infinitely slow
    time_s = math.inf if reached is None else totals.elapsed_s - overshoot * per_sample_s(tbl, trainer.batch_size, adaptive.frequency_hz)
    segments = [(s.batch_size, s.end_samples - s.start_samples) for s in record.segments]
    segments[-1] = (segments[-1][0], segments[-1][1] - overshoot)
    moves = [f"at {s.samples} samples: b={s.old_batch_size} -> b={s.new_batch_size} [{s.cause}] {s.note}"
             for s in adaptive.switches if s.samples > 0]  # fmt: skip
    return Job(row, seed, index, [(b, round(n)) for b, n in segments], time_s, math.inf if reached is None else reached, choice.role,
               choice.selection.note or "", choice.cost_bound, loop.exploration.line() if loop.exploration else "", moves, record,
               choice.exploit)  # fmt: skip


def fixed_time(curves: Curves, tbl: ProfileTable, s: Selection, seed: int) -> float | None:
    n = curves.n(s.batch_size, seed)
    return None if n is None else n * per_sample_s(tbl, s.batch_size, s.frequency_hz)


@dataclass
class Outcome:
    """A job and the fixed methods' times on the same seed (s, SIMULATED)."""

    setting: str
    kind: str
    row: str
    index: int
    seed: int
    job: Job
    baseline1_s: float | None
    equation4_s: float | None
    oracle_s: float
    oracle_b: int
    exploit_s: float | None  # the job's start exploit choice, run without exploring (its counterfactual)

    def ratio(self, other: float | None) -> float | None:
        return None if other is None else self.job.time_s / other


def as_of(record: FinetuneRecord, device_s: float) -> FinetuneRecord | None:
    """`record` as the fleet showed it `device_s` (s) into its run: its segments and evaluations
    up to then (the device time within a segment taken as even per sample), running unless it had
    ended by then; None before its first evaluation."""
    if device_s >= sum(x.device_time_s for x in record.segments):
        return record
    kept, spent = [], 0.0
    for segment in record.segments:
        if spent + segment.device_time_s <= device_s:
            kept.append(segment)
            spent += segment.device_time_s
            continue
        per_sample_s = segment.device_time_s / max(1, segment.end_samples - segment.start_samples)
        end = segment.start_samples + int((device_s - spent) / per_sample_s)
        if curve := [p for p in segment.curve if p[0] <= end]:
            kept.append(segment.model_copy(update={"end_samples": curve[-1][0], "device_time_s": device_s - spent, "curve": curve}))
        break
    if not kept:
        return None
    return record.model_copy(update={"segments": kept, "reached": False, "samples_to_accuracy": None, "running": True})


def round_view(earlier: list[FinetuneRecord], this_round: list[FinetuneRecord], started: dict[str, FinetuneRecord],
               together: str) -> Callable[[float], list[FinetuneRecord]]:  # fmt: skip
    """What a row sees at a device time of its run (s): the records of earlier rounds, and of the
    rows before it in its round all (one after the other), their starts (`started`; "shown",
    "curves") or nothing ("hidden"), and with "curves" their curves as far as they had run."""
    if together == "curves":
        return lambda t: [*earlier, *(as_of(r, t) or started[r.record_id] for r in this_round)]
    fixed = [*earlier, *(this_round if not together else started.values() if together == "shown" else [])]
    return lambda _: fixed


def run_setting(st: Setting, jobs: int, history: dict[str, list[ProxyCheck]], loop: LoopSettings, log: Any,
                together: str = "") -> list[Outcome]:  # fmt: skip
    """Every row's sequence of `jobs` jobs on the setting's data (see the module docstring).
    `together` "shown": the rows of a round start at the same time, as the devices of one job:
    each sees the records of earlier rounds and the starts of the rows before it in the round
    (as a fleet shows a run's start at once), not their curves; "hidden": the same, the starts
    not shown (the product before it showed them); "curves": as "shown", and the curves of the
    rows before it as far as they had run at its own device time."""
    weights = st.weights_url()
    b_sizes = list(st.batch_sizes)
    prior = vector(MODEL, weights, st.proxy.dataset, st.proxy.accuracy, [0, 1], b_sizes)
    seeds = list(range(jobs))
    curves = Curves(st, weights)
    target_vector = vector(MODEL, weights, st.target.dataset, st.target.accuracy, seeds, b_sizes)
    family = prior.key or st.proxy.label
    others = [c for key, checks in history.items() if key == family for c in checks]
    records: list[FinetuneRecord] = []
    outcomes = []
    for k in range(jobs):
        started: dict[str, FinetuneRecord] = {}
        earlier = list(records)
        for twin, cap in st.rows:
            tbl = rows_of(table(twin), b_sizes)
            envelope = load_twin(twin).full_load_power_w
            trust = trust_width(others)
            seen = round_view(earlier, records[len(earlier) :], dict(started), together)
            job = replay(curves, tbl, cap, envelope, prior, seen, trust, k, k + 1, (twin, cap), loop,
                         started if together in ("shown", "curves") else None)  # fmt: skip
            records.append(job.record)
            oracle = Oracle(target_vector).choose(tbl, cap)
            plain = Equation4(prior).choose(tbl, cap)
            try:
                b1: Selection | None = Baseline1(RelationVector.uniform(tbl.batch_sizes), envelope).choose(tbl, cap)
            except SelectionError:
                b1 = None
            exploit_s = fixed_time(curves, tbl, job.exploit, k) if job.role == "explore" else None
            out = Outcome(st.name, st.kind, f"{twin} {'no cap' if cap is None else f'{cap:g} W'}", k + 1, k, job,
                          fixed_time(curves, tbl, b1, k) if b1 else None, fixed_time(curves, tbl, plain, k),
                          fixed_time(curves, tbl, oracle, k) or 0.0, oracle.batch_size, exploit_s)  # fmt: skip
            outcomes.append(out)
            log(out)
    if (check := proxy_check(records, prior)) is not None:
        history.setdefault(family, []).append(check)
    return outcomes


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """The issue's targets over `outcomes`."""
    related = [o for o in outcomes if o.kind == "related"]
    poor = [o for o in outcomes if o.kind == "poor"]

    def within(os_: list[Outcome], pct: float) -> float:
        ratios = [o.ratio(o.oracle_s) for o in os_]
        return sum(1 for r in ratios if r is not None and r <= 1 + pct) / max(1, len(ratios))

    behind_eq4 = [r for o in related if (r := o.ratio(o.equation4_s)) is not None]
    over_b1 = [r for o in poor if (r := o.ratio(o.baseline1_s)) is not None]
    kept = [o.oracle_s / o.job.time_s for o in poor if o.baseline1_s and o.baseline1_s / o.oracle_s > 1.0]
    oracle_over_b1 = [o for o in poor if o.baseline1_s and o.oracle_s / o.baseline1_s > 1.02]
    sequences: dict[tuple[str, str], list[Outcome]] = {}
    for o in poor:
        if o.baseline1_s:
            sequences.setdefault((o.setting, o.row), []).append(o)
    summed = [sum(o.job.time_s for o in os_) / sum(o.baseline1_s or 0.0 for o in os_) for os_ in sequences.values()]
    third = [o for o in outcomes if o.index == 3]
    explored = [o for o in outcomes if o.job.role == "explore"]
    return {
        "jobs": len(outcomes), "related_rows": len(related), "poor_rows": len(poor),
        "related_within_3pct": within(related, 0.03),
        "related_worst_over_oracle": max((o.ratio(o.oracle_s) or 0 for o in related), default=None),
        "related_worst_vs_equation4": max(behind_eq4, default=None),
        "related_over_3pct_behind_equation4": sum(1 for r in behind_eq4 if r > 1.03),
        "poor_worst_vs_baseline1": max(over_b1, default=None), "poor_over_1.02x_baseline1": sum(1 for r in over_b1 if r > 1.02),
        # the same seed's draw: jobs where the oracle's own configuration is over 1.02x Baseline 1's run, and of those the job's
        "poor_oracle_over_1.02x_baseline1": len(oracle_over_b1),
        "poor_over_1.02x_baseline1_where_the_oracle_is": sum(1 for o in oracle_over_b1 if (o.ratio(o.baseline1_s) or 0) > 1.02),
        # over a row's sequence of jobs (the seeds' draws summed): its jobs' time over Baseline 1's runs' time
        "poor_sequences": len(summed), "poor_sequences_over_1.02x_baseline1": sum(1 for r in summed if r > 1.02),
        "poor_worst_sequence_vs_baseline1": max(summed, default=None),
        "poor_rows_with_a_speedup": len(kept), "poor_kept_90pct": sum(1 for k in kept if k >= 0.9) / max(1, len(kept)),
        "third_job_within_3pct": within(third, 0.03), "sequences": len(third),
        "by_job": {k: within([o for o in outcomes if o.index == k], 0.03) for k in sorted({o.index for o in outcomes})},
        "explorations": [{"setting": o.setting.split(":")[0], "row": o.row, "job": o.index, "cost_bound": o.job.cost_bound,
                          "cost_vs_exploit_run": None if not o.exploit_s else o.job.time_s / o.exploit_s - 1} for o in explored],
    }  # fmt: skip


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _weights(st: Setting) -> str:
    return st.weights_url()


def _run(args: tuple[str, dict[str, Any], float, int, int]) -> None:
    reference_run(MODEL, *args)


def prepare(seeds: list[int], jobs: int, processes: int) -> None:
    """Compute the cached runs every job of `seeds` needs, in `processes` worker processes of
    one thread each: the pre-trained weights and the twins' tables first, then the proxy's and
    the target's solo runs at every batch size."""
    chosen = [settings(seed) for seed in seeds]
    with ProcessPoolExecutor(processes, initializer=_one_thread) as pool:
        weights = list(pool.map(_weights, chosen))
        list(pool.map(table, sorted({twin for st in chosen for twin, _ in st.rows})))
        runs = {(w, json.dumps(goal.dataset, sort_keys=True), goal.accuracy, b, seed): None
                for st, w in zip(chosen, weights)
                for goal, goal_seeds in ((st.proxy, [0, 1]), (st.target, range(jobs)))
                for seed in goal_seeds for b in st.batch_sizes}  # fmt: skip
        work = [(w, json.loads(dataset), accuracy, b, seed) for w, dataset, accuracy, b, seed in runs]
        for done, _ in enumerate(pool.map(_run, work), 1):
            print(f"prepared {done}/{len(work)} runs", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=TUNING_SEEDS)
    parser.add_argument("--held-out", action="store_true", help=f"the held-out seeds {HELD_OUT_SEEDS}")
    parser.add_argument("--jobs", type=int, default=5, help="jobs per row on the same data")
    parser.add_argument("--json", help="write every job and the summary here")
    parser.add_argument("--verbose", action="store_true", help="every job's line")
    parser.add_argument("--processes", type=int, default=0, help="compute the missing cached runs in N processes first")
    parser.add_argument("--prepare-only", action="store_true", help="compute the cached runs and stop")
    parser.add_argument(
        "--together",
        choices=["shown", "hidden", "curves"],
        default="",
        help="the rows of a round start at once (one job over several devices), their starts shown to each other or not, "
        "or their starts and curves so far",
    )
    args = parser.parse_args(argv)
    seeds = HELD_OUT_SEEDS if args.held_out else args.seeds
    if args.processes or args.prepare_only:
        prepare(seeds, args.jobs, max(1, args.processes))
    if args.prepare_only:
        return 0
    loop = LoopSettings()
    history: dict[str, list[ProxyCheck]] = {}
    outcomes: list[Outcome] = []

    def log(o: Outcome) -> None:
        if args.verbose:
            ran = " ".join(f"b={b}:{n}" for b, n in o.job.segments)
            print(f"  {o.row:<24} job {o.index} {o.job.role:<8} {ran:<28} /oracle(b={o.oracle_b}) {o.ratio(o.oracle_s):.3f} "
                  f"/B1 {o.ratio(o.baseline1_s) or float('nan'):.3f} /eq4 {o.ratio(o.equation4_s) or float('nan'):.3f}"
                  f"  {o.job.note[:90]}", flush=True)  # fmt: skip

    for seed in seeds:
        st = settings(seed)
        print(st.name, flush=True)
        outcomes += run_setting(st, args.jobs, history, loop, log, args.together)
    result = summary(outcomes)
    print(json.dumps(result, indent=2))
    if args.json:
        rows = [{"setting": o.setting, "kind": o.kind, "row": o.row, "job": o.index, "ran": o.job.segments, "time_s": o.job.time_s,
                 "over_oracle": o.ratio(o.oracle_s), "vs_baseline1": o.ratio(o.baseline1_s), "vs_equation4": o.ratio(o.equation4_s),
                 "role": o.job.role, "note": o.job.note, "cost_bound": o.job.cost_bound, "exploration": o.job.exploration,
                 "decisions": o.job.decisions}
                for o in outcomes]  # fmt: skip
        with open(args.json, "w") as out:
            json.dump({"summary": result, "jobs": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
