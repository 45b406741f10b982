"""Progress of estimation and profiling: what the runs and profiles report (real training and a
real twin), how often, how it is stored, and how `status` sums it up."""

from datetime import timedelta

from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.estimation import train_proxy
from edgetrain.common.models import get_model
from edgetrain.common.profiling import profile, staircase_bound
from edgetrain.common.progress import (
    ProfilingProgress,
    ProxyRunProgress,
    RunState,
    estimation_progress,
    throttled,
)
from edgetrain.common.schemas import DatasetRef, EstimationRequest, LearningRatePolicy, ProfilingOptions, TrainingOutcome, utc_now
from edgetrain.common.store.progress import PROGRESS_TTL_S

REQUEST = EstimationRequest(
    model="smallcnn", weights="init:0", proxy_dataset=DatasetRef(name="digits"), target_accuracy=0.8,
    batch_sizes=[16, 32, 64], seeds=[0, 1], lr=LearningRatePolicy(), eval_every_samples=64, max_samples=20000,
)  # fmt: skip


def outcome(b: int, seed: int, wall_s: float, reached: bool = True) -> TrainingOutcome:
    return TrainingOutcome(batch_size=b, seed=seed, samples_to_accuracy=1000 if reached else None, reached=reached,
                           final_accuracy=0.81, samples_processed=1024, evaluations=9, wall_s=wall_s)  # fmt: skip


def running(b: int, seed: int, elapsed_s: float, samples: int = 512) -> ProxyRunProgress:
    start = utc_now()
    return ProxyRunProgress(batch_size=b, seed=seed, samples=samples, accuracy=0.55, target_accuracy=0.8, max_samples=20000,
                            started_at=start, updated_at=start + timedelta(seconds=elapsed_s))  # fmt: skip


def test_a_throttled_callback_passes_the_first_call_then_at_most_one_per_interval() -> None:
    seen: list[int] = []
    every_minute = throttled(seen.append, every_s=60)
    for i in range(5):
        every_minute(i)
    assert seen == [0]
    always = throttled(seen.append, every_s=0)
    for i in range(3):
        always(i)
    assert seen == [0, 0, 1, 2]
    throttled(None)(1)  # no callback: nothing to call


def test_estimation_progress_says_each_run_s_state_and_the_time_left() -> None:
    progress = estimation_progress(
        "k1", REQUEST, [outcome(16, 0, 10.0), outcome(16, 1, 14.0, reached=False)], [running(32, 0, 4.0), running(16, 0, 99.0)]
    )
    states = {(r.batch_size, r.seed): r.state for r in progress.runs}
    assert states == {(16, 0): RunState.done, (16, 1): RunState.done, (32, 0): RunState.running,
                      (32, 1): RunState.waiting, (64, 0): RunState.waiting, (64, 1): RunState.waiting}  # fmt: skip
    # mean of the done runs 12 s: the running one has 8 s of it left, the 3 waiting 36 s, one run at a time
    assert progress.time_left_s == 44.0
    assert progress.line() == "proxy runs 2/6 done, 1 running, 3 waiting, about 44 s left"
    assert progress.running_lines() == ["b=32 seed=0: running, 512 samples, accuracy 0.550 (target 0.8), 4 s"]
    lines = [r.line(0.8) for r in progress.runs]
    assert "b=16 seed=0: done, N_b 1000 samples, 10 s" in lines and "b=16 seed=1: done, target not reached in 1024 samples, 14 s" in lines
    assert "b=64 seed=1: waiting" in lines
    nothing_done = estimation_progress("k1", REQUEST, [], [running(16, 0, 3.0), running(32, 0, 3.0)])
    assert nothing_done.time_left_s is None and nothing_done.line() == "proxy runs 0/6 done, 2 running, 4 waiting"


def test_profiling_progress_counts_points_and_estimates_the_rest() -> None:
    start = utc_now()
    grid = ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=12, points_planned=72,
                             started_at=start, updated_at=start + timedelta(seconds=6), device_id="nano-7")  # fmt: skip
    assert grid.time_left_s == 30.0 and grid.line() == "12 of 72 points measured on nano-7, about 30 s left"
    stairs = grid.model_copy(update={"mode": "staircase", "points_planned": 24})
    assert stairs.line() == "12 of at most 24 points measured on nano-7, at most about 6 s left"
    assert grid.model_copy(update={"points_measured": 0}).time_left_s is None


def test_a_proxy_run_reports_its_evaluations_about_once_a_second() -> None:
    reports: list[ProxyRunProgress] = []
    request = REQUEST.model_copy(update={"target_accuracy": 0.99, "eval_every_samples": 256, "max_samples": 3072})
    result = train_proxy(request, 64, 0, reports.append)
    assert reports and reports[0].samples == 0  # the evaluation before training, at once
    assert [r.samples for r in reports] == sorted(r.samples for r in reports)
    assert all(r.batch_size == 64 and r.seed == 0 and r.target_accuracy == 0.99 for r in reports)
    assert len(reports) <= 2 + result.wall_s  # throttled: at most one a second after the first
    gaps = [(b.updated_at - a.updated_at).total_seconds() for a, b in zip(reports, reports[1:])]
    assert all(gap >= 0.99 for gap in gaps), gaps


def test_profiling_reports_points_measured_of_those_planned_and_when_it_is_done() -> None:
    device = SimulatedDevice(load_twin("jetson-nano"))
    reports: list[ProfilingProgress] = []
    options = ProfilingOptions(samples=64, warmup_batches=0, measure_batches=1)
    table = profile(device, get_model("smallcnn"), [16], options, LearningRatePolicy(), on_progress=reports.append)
    grid = len(device.frequencies_hz)
    assert reports[0].points_measured == 0 and reports[0].points_planned == grid and not reports[0].done
    assert reports[-1].done and reports[-1].points_measured == table.points_measured == grid
    stairs: list[ProfilingProgress] = []
    options = ProfilingOptions(samples=64, warmup_batches=0, measure_batches=1, mode="staircase")
    table = profile(device, get_model("smallcnn"), [16, 32], options, LearningRatePolicy(), 3.0, stairs.append)
    assert stairs[0].mode == "staircase" and stairs[0].points_planned == staircase_bound(2, len(device.frequencies_hz))
    assert stairs[-1].done and stairs[-1].points_measured == table.points_measured <= stairs[0].points_planned


def test_progress_is_stored_to_expire_and_read_back(store) -> None:
    run = running(32, 1, 5.0)
    store.progress.put_proxy_run("k1", run)
    store.progress.put_proxy_run("k1", run.model_copy(update={"samples": 1024}))
    assert [r.samples for r in store.progress.proxy_runs("k1")] == [1024]  # one entry per (b, seed), the latest
    assert store.progress.proxy_runs("k2") == []
    profiling = ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=3,
                                  points_planned=24, started_at=utc_now())  # fmt: skip
    store.progress.put_profiling(profiling)
    assert store.progress.profiling("jetson-nano", "smallcnn") == profiling
    assert store.progress.profiling("jetson-tx2-nx", "smallcnn") is None
    redis = store._redis
    for key in (store.keys.vector_progress("k1"), store.keys.profiling("jetson-nano", "smallcnn")):
        assert 0 < redis.ttl(key) <= PROGRESS_TTL_S
