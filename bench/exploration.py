"""Exploration with bounded regret, judged on settings no rule was tuned on.

Settings come from a seed (`settings(seed)`): a pre-training dataset (or a seeded
initialisation), a proxy dataset and its target accuracy, a target dataset, its fraction and
target accuracy, two device twins with their caps, and a set of batch sizes. "related" settings
pre-train on Fashion-MNIST and fine-tune on handwritten digits with another set of digits as the
proxy; "poor" settings start from a seeded initialisation, with a proxy of another kind (digits
for clothes, clothes for digits). Seeds 0-3 are for tuning, 100-105 are held out: no rule or
number in common/belief.py, common/exploration.py or common/trust.py was chosen on them.

For each setting, real training (cached by bench/runs.py): the pre-trained weights, the proxy's
N_b (2 seeds: the server pool's vector) and the target's solo runs at every batch size (one per
job seed, with their curves of test accuracy and loss); the twins' lookup tables (the real
profiling code). Every row (twin, cap) then runs a sequence of jobs on the same data (job k
with seed k), the rows of a round one after the other, so a job finds the records of every
earlier job on the data, as a fleet's do.

A job is replayed against those curves: at batch size b with seed s it trains along the
recorded curve of (b, s); a switch at sample n continues on the new batch size's curve from the
sample where it first reaches the test loss reached so far (a solo run's progress is its test
loss: common/learned.py), plus one evaluation interval for the switch. edgetrain's decisions
are the product's own: the belief (common/belief.py), the learned trust in the proxy
(common/trust.py), the exploration policy at the start and the loop's decisions at every
evaluation (common/exploration.py, common/closed_loop.py's settings). Device time is the
table's T[b][f*_b] / N_s per sample (SIMULATED twins), the same for every method.

Compared per job, like for like on the same seed: Baseline 1, the paper's plain equation (4)
on the proxy's vector, and the oracle (equation (4) on the target's N_b over the job seeds).

    python bench/exploration.py [--seeds 0 1 2 3 | --held-out] [--jobs 5] [--json OUT] [--verbose]
                                [--processes N] [--prepare-only]

`--processes N` computes the missing cached runs of every chosen seed first, in N worker
processes of one thread each; `--prepare-only` stops there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.runs import EVAL_EVERY, pretrained, reference_run, table, vector
from edgetrain.common.belief import belief
from edgetrain.common.closed_loop import LoopSettings
from edgetrain.common.devices.simulated import load_twin
from edgetrain.common.exploration import Candidate, ExplorationPolicy, baseline1_per_sample_s, candidates
from edgetrain.common.learned import DataIdentity, Envelope, FinetuneRecord, Segment
from edgetrain.common.schemas import LearningRatePolicy, ProfileTable, RelationVector, Selection
from edgetrain.common.selection import Baseline1, Equation4, Oracle, SelectionError
from edgetrain.common.tables import rows_of
from edgetrain.common.trust import ProxyCheck, proxy_check, trust_width

TUNING_SEEDS = [0, 1, 2, 3]
HELD_OUT_SEEDS = [100, 101, 102, 103, 104, 105]
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
    (s), its samples to accuracy, the start choice's role and note, its exploration's cost bound
    and its notes."""

    row: tuple[str, float | None]
    seed: int
    index: int
    segments: list[tuple[int, int]] = field(default_factory=list)  # (batch size, samples)
    time_s: float = 0.0
    samples: float = 0.0
    role: str = "exploit"
    note: str = ""
    cost_bound: float = 0.0
    decisions: list[str] = field(default_factory=list)
    record: FinetuneRecord | None = None
    exploit: Selection | None = None


def per_sample_s(tbl: ProfileTable, s: Selection) -> float:
    time_s = tbl.time_s[tbl.batch_sizes.index(s.batch_size)][tbl.frequencies_hz.index(s.frequency_hz)]
    assert time_s is not None
    return time_s / tbl.samples


def replay(curves: Curves, tbl: ProfileTable, cap: float | None, envelope: list[float], prior: RelationVector,
           records: list[FinetuneRecord], trust: float, seed: int, index: int, row: tuple[str, float | None],
           policy: ExplorationPolicy, loop: LoopSettings) -> Job:  # fmt: skip
    """One edgetrain job on the recorded curves (see the module docstring)."""
    target = curves.setting.target.accuracy
    start = belief(records, prior, trust)
    found = candidates(tbl, cap, start, "closed_loop")
    b1 = baseline1_per_sample_s(tbl, cap, start, envelope, found)
    choice = policy.choose(found, b1, start, EVAL_EVERY)
    job = Job(row, seed, index, role=choice.role, note=choice.selection.note or "", cost_bound=choice.cost_bound, exploit=choice.exploit)
    running: Candidate = next(c for c in found if c.batch_size == choice.selection.batch_size)
    exploring = choice.role == "explore"
    done, offset, since, switches = 0.0, 0.0, 0, 0
    solo: list[tuple[int, float, float | None]] = []
    envelope_loss: list[tuple[int, float]] = []
    segments: list[Segment] = []
    while True:
        run = curves.run(running.batch_size, seed)
        points = [p for p in run["curve"] if p[0] > offset or (p[0] == offset and not done)]
        n_b = run["outcome"]["samples_to_accuracy"]
        switched = False
        for n, accuracy, loss in points:
            at = done + (n - offset)
            if not segments or segments[-1].batch_size != running.batch_size:
                segments.append(Segment(batch_size=running.batch_size, frequency_hz=running.selection.frequency_hz, start_samples=int(done),
                                        end_samples=int(done), device_time_s=0.0, curve=[]))  # fmt: skip
            segments[-1].curve.append((int(at), accuracy, loss))
            segments[-1].end_samples = int(at)
            if not switches:
                solo.append((int(at), accuracy, loss))
            envelope_loss.append((int(at), loss))
            if accuracy >= target and n_b is not None:
                extra = max(0.0, n_b - offset)
                job.samples = done + extra
                job.time_s += extra * running.per_sample_s
                job.segments.append((running.batch_size, int(extra)))
                job.record = _record(curves, segments, job, prior, row)
                return job
            since += n > offset
            now = belief([*records, _partial(curves, segments, solo, seed, row)], prior, trust)
            found_now = candidates(tbl, cap, now, "closed_loop")
            x = policy.exploit(found_now, b1)
            current = next(c for c in found_now if c.batch_size == running.batch_size)
            if exploring:
                measured = running.batch_size in now.measured
                late = choice.measure_by_samples is not None and at >= 2 * choice.measure_by_samples
                if not (measured or late or choice.measure_by_samples is None):
                    continue
                exploring = False
                threshold = policy.min_gain
            else:
                threshold = loop.hysteresis
                if since < loop.min_dwell_evaluations or switches >= loop.max_switches:
                    continue
            if x.batch_size == running.batch_size or x.expected_s * (1 + threshold) >= current.expected_s:
                continue
            job.decisions.append(f"at {int(at)} samples: b={running.batch_size} -> b={x.batch_size} "
                                 f"(predicted {current.expected_s / x.expected_s - 1:.0%} faster)")  # fmt: skip
            job.time_s += (n - offset) * running.per_sample_s
            job.segments.append((running.batch_size, int(n - offset)))
            done = at
            level = min(loss_ for _, loss_ in envelope_loss)
            next_curve = curves.run(x.batch_size, seed)["curve"]
            reached = Envelope([(m, l_) for m, _, l_ in next_curve]).samples_at(level)
            offset = max(0.0, (reached if reached is not None else next_curve[-1][0]) - EVAL_EVERY)  # one interval for the switch
            running, since, switches, switched = x, 0, switches + 1, True
            break
        if not switched:
            raise RuntimeError(f"the curve of b={running.batch_size} seed {seed} ends below the target")


def _partial(curves: Curves, segments: list[Segment], solo: list[tuple[int, float, float | None]], seed: int,
             row: tuple[str, float | None]) -> FinetuneRecord:  # fmt: skip
    first = segments[0]
    segment = first.model_copy(update={"curve": list(solo), "end_samples": solo[-1][0] if solo else 0})
    return _base(curves, [segment], seed, row, reached=False, samples=None, record_id="running")


def _record(curves: Curves, segments: list[Segment], job: Job, prior: RelationVector, row: tuple[str, float | None]) -> FinetuneRecord:
    record = _base(curves, segments, job.seed, row, reached=True, samples=int(job.samples), record_id=f"{row}:{job.index}")
    return record.model_copy(update={"prior_key": prior.key})


def _base(curves: Curves, segments: list[Segment], seed: int, row: tuple[str, float | None], reached: bool, samples: int | None,
          record_id: str) -> FinetuneRecord:  # fmt: skip
    st = curves.setting
    return FinetuneRecord(
        record_id=record_id, model=MODEL, weights=curves.weights, data=DataIdentity(name=st.target.dataset["name"],
        fraction=st.target.dataset.get("fraction", 1.0)), target_accuracy=st.target.accuracy, lr=LearningRatePolicy(),
        eval_every_samples=EVAL_EVERY, device_type=row[0], power_cap_w=row[1], seed=seed, segments=segments, reached=reached,
        samples_to_accuracy=samples,
    )  # fmt: skip


def fixed_time(curves: Curves, tbl: ProfileTable, s: Selection, seed: int) -> float | None:
    n = curves.n(s.batch_size, seed)
    return None if n is None else n * per_sample_s(tbl, s)


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


def run_setting(st: Setting, jobs: int, history: dict[str, list[ProxyCheck]], policy: ExplorationPolicy, log: Any) -> list[Outcome]:
    """Every row's sequence of `jobs` jobs on the setting's data (see the module docstring)."""
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
    loop = LoopSettings()
    for k in range(jobs):
        for twin, cap in st.rows:
            tbl = rows_of(table(twin), b_sizes)
            envelope = load_twin(twin).full_load_power_w
            trust = trust_width(others)
            job = replay(curves, tbl, cap, envelope, prior, records, trust, k, k + 1, (twin, cap), policy, loop)
            assert job.record is not None
            records.append(job.record)
            oracle = Oracle(target_vector).choose(tbl, cap)
            plain = Equation4(prior).choose(tbl, cap)
            try:
                b1: Selection | None = Baseline1(RelationVector.uniform(tbl.batch_sizes), envelope).choose(tbl, cap)
            except SelectionError:
                b1 = None
            exploit_s = fixed_time(curves, tbl, job.exploit, k) if job.role == "explore" and job.exploit else None
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
    third = [o for o in outcomes if o.index == 3]
    costs = [o.job.cost_bound for o in outcomes if o.job.role == "explore"]
    actual = [o.job.time_s / o.exploit_s - 1 for o in outcomes if o.job.role == "explore" and o.exploit_s]
    return {
        "jobs": len(outcomes),
        "related_within_3pct": within(related, 0.03),
        "related_worst_over_oracle": max((o.ratio(o.oracle_s) or 0 for o in related), default=None),
        "related_worst_vs_equation4": max(behind_eq4, default=None),
        "poor_worst_vs_baseline1": max(over_b1, default=None), "poor_kept_90pct": sum(1 for k in kept if k >= 0.9) / max(1, len(kept)),
        "third_job_within_3pct": within(third, 0.03),
        "by_job": {k: within([o for o in outcomes if o.index == k], 0.03) for k in sorted({o.index for o in outcomes})},
        "explorations": len(costs), "exploration_cost_bound_max": max(costs, default=None),
        "exploration_cost_actual_max": max(actual, default=None),
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
    args = parser.parse_args(argv)
    seeds = HELD_OUT_SEEDS if args.held_out else args.seeds
    if args.processes or args.prepare_only:
        prepare(seeds, args.jobs, max(1, args.processes))
    if args.prepare_only:
        return 0
    policy = ExplorationPolicy()
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
        outcomes += run_setting(st, args.jobs, history, policy, log)
    result = summary(outcomes)
    print(json.dumps(result, indent=2))
    if args.json:
        rows = [{"setting": o.setting, "kind": o.kind, "row": o.row, "job": o.index, "ran": o.job.segments, "time_s": o.job.time_s,
                 "over_oracle": o.ratio(o.oracle_s), "vs_baseline1": o.ratio(o.baseline1_s), "vs_equation4": o.ratio(o.equation4_s),
                 "role": o.job.role, "note": o.job.note, "cost_bound": o.job.cost_bound, "decisions": o.job.decisions}
                for o in outcomes]  # fmt: skip
        with open(args.json, "w") as out:
            json.dump({"summary": result, "jobs": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
