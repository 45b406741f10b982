"""What a user meets at the command line: `status` in every state, notes on stalled queues,
one-line errors with distinct exit statuses, job management, specs checked in one pass."""

import io
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime, timedelta

import pytest
import redis
from rich.console import Console

from edgetrain.common.jobs.events import Failed
from edgetrain.common.jobs.reports import JobReport, completed_message
from edgetrain.common.jobs.state import EventKind, FinetuneProgress, JobState, JobStatus, PartState
from edgetrain.common.keys import vector_key
from edgetrain.common.presets import quick_job
from edgetrain.common.progress import ProfilingProgress, ProxyRunProgress
from edgetrain.common.schemas import (
    ConfigSwitch,
    DeviceInfo,
    JobSpec,
    PowerGuardReport,
    RunReport,
    Selection,
    TrainingOutcome,
    VectorProvenance,
    utc_now,
)
from edgetrain.common.selection import InfeasibleCapError
from edgetrain.common.store import WorkerInfo, Written
from edgetrain.common.testing.parts import drive_part
from edgetrain.tasks.client import EdgeTrainClient, JobSpecError, validate_job
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode, job_exit_code
from edgetrain.workers.rendering.output import format_report
from edgetrain.workers.rendering.progress import JobProgress, part_line

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]
SELECTION = Selection(batch_size=16, frequency_hz=614_400_000, estimated_time_s=1.0, peak_power_w=2.9)


def report(peak_w: float = 2.9) -> RunReport:
    return RunReport(
        device_id="nano-1", device_type="jetson-nano", simulated=True, batch_size=16, frequency_hz=614_400_000, reached=True,
        final_accuracy=0.86, samples_to_accuracy=4000, samples_processed=4096, steps=256, device_time_s=0.6, energy_j=1.5,
        peak_power_w=peak_w, wall_s=21.0,
    )  # fmt: skip


STATES = list(PartState)
REASONS = {PartState.failed: "unknown device 'nano-1'", PartState.cancelled: "cancelled at 2026-11-23 10:00:00 UTC"}


def job_in(store, job_id: str, state: PartState, selection: Selection = SELECTION, run: RunReport | None = None) -> None:
    store.jobs.create(job_id, JobSpec.model_validate(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}])))
    drive_part(store, job_id, "nano-1", state, selection=selection, report=run or report(), reason=REASONS.get(state, ""))
    if state == PartState.finetuning:
        progress = FinetuneProgress(samples=1024, accuracy=0.5, device_time_s=0.1, energy_j=0.2, target_accuracy=0.85, max_samples=40000)
        assert store.jobs.attempt_write(job_id, "nano-1", "a1", progress=progress) == Written.ok


@pytest.mark.parametrize("state", list(STATES))
def test_status_prints_every_state(store, redis_server, capsys, state: PartState) -> None:
    job_in(store, "j1", state)
    assert main(["status", "j1", "--redis-url", redis_server.url]) == ExitCode.ok
    out = capsys.readouterr().out
    assert "job j1:" in out and "nano-1" in out and "events:" in out
    assert main(["--redis-url", redis_server.url, "status", "j1", "--json"]) == ExitCode.ok
    document = json.loads(capsys.readouterr().out)
    assert document["devices"][0]["state"] == state.value
    assert ("no live worker consumes the 'control' queue" in " ".join(document["notes"])) == (
        state not in (PartState.completed, PartState.failed, PartState.cancelled)
    )


def test_a_job_waiting_on_a_queue_nobody_consumes_says_so(store, redis_server) -> None:
    job_in(store, "j1", PartState.estimating)
    store.liveness.heartbeat(WorkerInfo(node="control@h", role="control", queues=["control"], hostname="h", pid=1))
    notes = EdgeTrainClient(redis_server.url).status("j1").notes
    assert notes == ["no live worker consumes the 'server' queue, so the relation vector is not estimated: start `edgetrain worker server`"]
    store.liveness.heartbeat(WorkerInfo(node="server@h", role="server", queues=["server"], hostname="h", pid=2))
    assert EdgeTrainClient(redis_server.url).status("j1").notes == []


def test_submit_without_a_control_worker_warns(store, redis_server, tmp) -> None:
    spec = tmp / "job.json"
    spec.write_text(json.dumps(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}])))
    done = subprocess.run([*CLI, "submit", str(spec), "--redis-url", redis_server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.ok and len(done.stdout.split()) == 1  # only the job id on stdout
    assert "no live worker consumes the 'control' queue" in done.stderr and "edgetrain worker control" in done.stderr


def test_unreachable_redis_is_one_line_naming_it_with_exit_status_4() -> None:
    env = {**os.environ, "EDGETRAIN_REDIS_URL": "redis://:secret@127.0.0.1:1/0"}
    for argv in (["fleet"], ["status", "abc"], ["jobs"]):
        done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == ExitCode.unreachable, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in done.stderr and "secret" not in done.stderr


def test_bad_arguments_are_refused_with_what_is_allowed() -> None:
    bad_id = subprocess.run(
        [*CLI, "worker", "device", "--device-id", "a b", "--backend", "sim:jetson-nano"], capture_output=True, text=True, timeout=120
    )
    assert bad_id.returncode == ExitCode.usage and "device id: 'a b' is not allowed: 1 to 64 letters" in bad_id.stderr
    for cap in ("-1", "nan", "inf"):
        done = subprocess.run(
            [*CLI, "profile", "run", "--device-id", "n1", "--model", "smallcnn", "--power-cap-w", cap],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == ExitCode.usage and "a power cap is a finite number of watts above 0" in done.stderr


def test_a_closed_pipe_ends_quietly(store, redis_server) -> None:
    for i in range(40):
        job_in(store, f"job{i:02d}", PartState.pending)
    done = subprocess.run(f"{sys.executable} -m edgetrain.workers.cli jobs --json --redis-url {redis_server.url} | head -1",
                          shell=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.stdout == "[\n" and done.stderr == ""


def test_unknown_job_is_not_found_with_exit_status_5(store, redis_server, capsys) -> None:
    assert main(["status", "nope", "--redis-url", redis_server.url]) == ExitCode.not_found
    assert "no job 'nope'; `edgetrain jobs` lists the jobs" in capsys.readouterr().err


def test_jobs_lists_and_filters_by_state(store, redis_server, capsys) -> None:
    job_in(store, "old", PartState.completed)
    job_in(store, "new", PartState.pending)
    assert main(["jobs", "--redis-url", redis_server.url, "--json"]) == ExitCode.ok
    assert [(j["job_id"], j["state"]) for j in json.loads(capsys.readouterr().out)] == [("new", "queued"), ("old", "completed")]
    assert main(["jobs", "--state", "completed", "--redis-url", redis_server.url]) == ExitCode.ok
    out = capsys.readouterr().out
    assert "old" in out and "new" not in out


def test_cancel_is_recorded_once_and_a_finished_job_is_left_as_it_is_with_exit_status_6(store, redis_server, capsys) -> None:
    job_in(store, "j1", PartState.profiling)
    client = EdgeTrainClient(redis_server.url)
    client.cancel("j1")
    assert client.cancel("j1").cancelled_at is not None  # twice is fine
    assert [e.kind for e in store.jobs.status("j1").events].count(EventKind.cancelled) == 1
    job_in(store, "done", PartState.completed)
    before = store.jobs.status("done")
    assert main(["cancel", "done", "--redis-url", redis_server.url]) == ExitCode.finished
    assert "job done has already finished (completed): nothing to cancel" in capsys.readouterr().err
    after = store.jobs.status("done")
    assert after.cancelled_at is None and after.events == before.events


def test_requeue_plans_a_failed_or_cancelled_part_again_and_says_what_to_do_otherwise(store, redis_server) -> None:
    job_in(store, "j1", PartState.failed)
    client = EdgeTrainClient(redis_server.url)
    client.requeue("j1", "nano-1")
    status = client.status("j1")
    assert status.parts["nano-1"].state == PartState.pending and status.parts["nano-1"].reason is None
    assert status.events[-1].kind == EventKind.requeued and store.jobs.device_jobs("nano-1") == ["j1"]
    with pytest.raises(ValueError, match="it is pending and goes on by itself"):
        client.requeue("j1", "nano-1")
    job_in(store, "j2", PartState.completed)
    with pytest.raises(ValueError, match="submit the job again to fine-tune anew"):
        client.requeue("j2", "nano-1")
    job_in(store, "j3", PartState.cancelled)
    client.requeue("j3", "nano-1")  # a cancelled part too
    assert client.status("j3").parts["nano-1"].state == PartState.pending


def test_jobs_prune_deletes_old_finished_jobs_only(store, redis_server, capsys) -> None:
    job_in(store, "done", PartState.failed)
    job_in(store, "running", PartState.finetuning)
    assert main(["jobs", "prune", "--older-than-days", "1", "--redis-url", redis_server.url]) == ExitCode.ok
    assert store.jobs.job_ids() == ["done", "running"]
    assert main(["jobs", "prune", "--older-than-days", "0", "--redis-url", redis_server.url, "--json"]) == ExitCode.ok
    assert json.loads(capsys.readouterr().out) == ["done"] and store.jobs.job_ids() == ["running"]


def test_a_spec_s_problems_are_all_reported_at_once() -> None:
    spec = quick_job(target_accuracy=2, weights="file:///etc/shadow", proxy_dataset={"name": "imagenet"})
    with pytest.raises(JobSpecError) as err:
        validate_job(spec)
    message = str(err.value)
    assert "target_accuracy: Input should be less than 1" in message
    assert "weights:" in message and "proxy_dataset.name: unknown dataset 'imagenet'" in message


def test_the_report_flags_a_peak_above_the_cap_and_tells_device_time_from_wall_time(store) -> None:
    job_in(store, "j1", PartState.completed, run=report(peak_w=3.05))
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert "peak power 3.05 W ABOVE the 3 W cap" in text
    assert "device time 0.6 s (the twin's clock)" in text and "wall time on the worker 21 s" in text
    assert JobReport.from_status(store.jobs.status("j1")).state == JobState.completed


def test_the_learned_line_says_where_r_b_came_from_once(store) -> None:
    learned = VectorProvenance(source="learned", summary="learned from 2 fine-tune record(s) of this data: N_b measured at b=[16, 128]")
    job_in(store, "j1", PartState.completed, run=report().model_copy(update={"learned": learned}))
    lines = format_report(JobReport.from_status(store.jobs.status("j1"))).splitlines()
    assert "  learned   : learned from 2 fine-tune record(s) of this data: N_b measured at b=[16, 128]" in lines, lines


def test_a_peak_within_the_sensor_s_resolution_of_the_cap_is_not_above_it(store) -> None:
    job_in(store, "j1", PartState.completed, run=report(peak_w=3.05).model_copy(update={"power_resolution_w": 0.1}))
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert "peak power 3.05 W;" in text and "ABOVE" not in text, text


def test_after_a_cap_set_mid_run_the_header_and_the_verdict_name_the_cap_in_force(store) -> None:
    switch = ConfigSwitch(device_time_s=0.3, samples=2048, cause="cap", power_cap_w=2.6, old_batch_size=16,
                          old_frequency_hz=614_400_000, new_batch_size=16, new_frequency_hz=460_800_000)  # fmt: skip
    guard = PowerGuardReport(over_cap_s=0.05, peak_power_w=3.0, peak_over_cap_w=2.98, over_cap_w=2.6)
    run = report(peak_w=3.0).model_copy(update={"switches": [switch], "guard": guard, "frequency_hz": 460_800_000})
    job_in(store, "j1", PartState.completed, run=run)
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert "power cap 3 W, then 2.6 W from 0.3 s" in text, text
    assert "a reading of 2.98 W was ABOVE the 2.6 W cap in force then" in text and "ABOVE the 3" not in text, text


def test_the_report_says_why_edgetrain_kept_the_largest_batch(store) -> None:
    note = "kept b=128: b=16's gain 3% within uncertainty 5%"
    kept = SELECTION.model_copy(update={"batch_size": 128, "note": note})
    job_in(store, "j1", PartState.completed, selection=kept, run=report().model_copy(update={"batch_size": 128}))
    lines = format_report(JobReport.from_status(store.jobs.status("j1"))).splitlines()
    assert lines[lines.index(next(line for line in lines if "edgetrain : b=128" in line)) + 1].strip() == note


def test_the_client_and_the_control_worker_do_not_import_pytorch(redis_server) -> None:
    probe = (
        "import sys\n"
        "from edgetrain.common.settings import Settings\n"
        "from edgetrain.tasks import context\n"
        "from edgetrain.tasks.client import EdgeTrainClient\n"
        "import edgetrain.workers.cli, edgetrain.workers.rendering.output\n"
        f"context.init(Settings(redis_url={redis_server.url!r}), ('edgetrain.tasks.workflow',))\n"
        "EdgeTrainClient(" + repr(redis_server.url) + ").fleet()\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_cap_sets_the_device_cap_in_the_store_and_none_lifts_it(store, redis_server, capsys) -> None:
    assert main(["cap", "nano-1", "3.5", "--redis-url", redis_server.url]) == ExitCode.ok
    assert "nano-1: power cap 3.5 W" in capsys.readouterr().err
    first = store.fleet.power_cap("nano-1")
    assert first.power_cap_w == 3.5 and first.version == 1
    assert main(["cap", "nano-1", "none", "--redis-url", redis_server.url, "--json"]) == ExitCode.ok
    assert json.loads(capsys.readouterr().out)["power_cap_w"] is None
    assert store.fleet.power_cap("nano-1").version == 2
    with pytest.raises(ValueError, match="power_cap_w: -1 is not allowed"):
        EdgeTrainClient(redis_server.url).set_power_cap("nano-1", -1)
    done = subprocess.run([*CLI, "cap", "nano-1", "0", "--redis-url", redis_server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.usage and "a power cap is a finite number of watts above 0" in done.stderr


def test_the_report_lists_switches_pauses_and_the_power_guard(store) -> None:
    switches = [
        ConfigSwitch(device_time_s=40.0, samples=2048, cause="cap", power_cap_w=3.5, old_batch_size=64,
                     old_frequency_hz=921_600_000, new_batch_size=32, new_frequency_hz=614_400_000),
        ConfigSwitch(device_time_s=60.0, samples=3072, cause="pause", power_cap_w=1.0, old_batch_size=32,
                     old_frequency_hz=614_400_000, new_batch_size=None, new_frequency_hz=None, note="power cap 1.00 W is below"),
    ]  # fmt: skip
    guard = PowerGuardReport(step_downs=2, step_ups=1, over_cap_s=0.12, peak_power_w=3.9, peak_over_cap_w=3.9)
    job_in(store, "j1", PartState.completed, run=report().model_copy(update={"switches": switches, "guard": guard, "paused_s": 30.0}))
    device = JobReport.from_status(store.jobs.status("j1")).devices[0]
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert device.over_cap  # the guard saw readings over the cap in force
    assert "power guard: 2 step-down(s), 1 back up; 0.12 s over the cap" in text
    assert "paused 30 s at idle clocks" in text
    assert "40.0 s  cap    cap 3.5 W: b=64 f=921.6 MHz -> b=32 f=614.4 MHz" in text
    assert "pause  cap 1 W: b=32 f=614.4 MHz -> paused (power cap 1.00 W is below)" in text


def test_a_table_or_vector_that_no_longer_loads_is_one_line_and_is_set_aside(store, redis_server) -> None:
    raw = redis.Redis(unix_socket_path=str(redis_server.socket))
    raw.set(store.keys.table("jetson-nano:smallcnn:1x28x28"), b'{"batch_sizes": [16, 32, 64], "time_s": []}')
    raw.set(store.keys.vector("k1"), b"{not json")
    for args, key in (
        (["profile", "show", "jetson-nano", "smallcnn"], "table:jetson-nano:smallcnn:1x28x28"),
        (["vector", "show", "k1"], "vector:k1"),
    ):
        done = subprocess.run([*CLI, *args, "--redis-url", redis_server.url], capture_output=True, text=True, timeout=120)
        assert done.returncode == ExitCode.not_found and done.stdout == "", done.stderr
        [line] = done.stderr.splitlines()
        assert f"edgetrain:{key} no longer loads (" in line and f"set aside under edgetrain:set-aside:{key}:" in line
    assert [r.key for r in store.resources.set_asides()] == [f"edgetrain:{k}" for k in ("table:jetson-nano:smallcnn:1x28x28", "vector:k1")]


# ---------------------------------------------------------------- progress, fleet, exit statuses

NANO = DeviceInfo(device_id="nano-1", device_type="jetson-nano", backend="sim", frequencies_hz=[76_800_000, 921_600_000],
                  memory_bytes=2**32, simulated=True)  # fmt: skip


def proxy_outcome(b: int, wall_s: float) -> TrainingOutcome:
    return TrainingOutcome(batch_size=b, seed=0, samples_to_accuracy=3000, reached=True, final_accuracy=0.86,
                           samples_processed=3072, evaluations=13, wall_s=wall_s)  # fmt: skip


def proxy_running(b: int, samples: int, elapsed_s: float = 3.0) -> ProxyRunProgress:
    start = utc_now()
    return ProxyRunProgress(batch_size=b, seed=0, samples=samples, accuracy=0.712, target_accuracy=0.85, max_samples=40000,
                            started_at=start, updated_at=start + timedelta(seconds=elapsed_s))  # fmt: skip


def estimating(store, job_id: str) -> str:
    """A job estimating its vector: b=4 done in 10 s, b=8 running; returns the vector's key."""
    job_in(store, job_id, PartState.estimating)
    key = vector_key(JobSpec.model_validate(quick_job()).estimation_request())
    store.resources.put_vector_part(key, proxy_outcome(4, 10.0))
    store.progress.put_proxy_run(key, proxy_running(8, 1536))
    return key


def test_status_says_how_far_the_estimation_is_per_batch_size_and_seed(store, redis_server, capsys) -> None:
    key = estimating(store, "j1")
    assert main(["status", "j1", "--redis-url", redis_server.url]) == ExitCode.ok
    out = capsys.readouterr().out
    assert (
        "nano-1: estimating  proxy runs 1/6 done, 1 running, 4 waiting, about 47 s left" in out
    )  # 10 s a run: 7 s left of b=8, 40 s of the 4 waiting
    assert f"relation vector {key}: proxy runs 1/6 done" in out
    for line in ("b=4 seed=0: done, N_b 3000 samples, 10 s", "b=8 seed=0: running, 1536 samples, accuracy 0.712 (target 0.85), 3 s",
                 "b=16 seed=0: waiting", "b=128 seed=0: waiting"):  # fmt: skip
        assert f"\n  {line}\n" in out, out
    assert main(["status", "j1", "--json", "--redis-url", redis_server.url]) == ExitCode.ok
    runs = json.loads(capsys.readouterr().out)["preparation"]["estimation"]["runs"]
    assert [(r["batch_size"], r["state"], r["samples"]) for r in runs[:3]] == [
        (4, "done", 3072),
        (8, "running", 1536),
        (16, "waiting", None),
    ]


def test_status_says_how_far_profiling_is(store, redis_server, capsys) -> None:
    job_in(store, "j1", PartState.profiling)
    start = utc_now()
    store.progress.put_profiling(ProfilingProgress(device_type="jetson-nano", model="smallcnn", mode="grid", points_measured=12,
                                                   points_planned=72, started_at=start, updated_at=start + timedelta(seconds=6),
                                                   device_id="nano-2"))  # fmt: skip
    assert main(["status", "j1", "--redis-url", redis_server.url]) == ExitCode.ok
    assert "nano-1: profiling  12 of 72 points measured on nano-2, about 30 s left  proxy runs 0/6 done" in capsys.readouterr().out
    store.progress.put_profiling(store.progress.profiling("jetson-nano", "smallcnn").model_copy(update={"done": True}))
    assert EdgeTrainClient(redis_server.url).status("j1").preparation.profiling == {}  # measured: nothing more to show


def test_on_update_sees_each_change_of_an_estimation(store, redis_server) -> None:
    key = estimating(store, "j1")
    seen: list[JobStatus] = []
    later = threading.Timer(0.6, lambda: store.progress.put_proxy_run(key, proxy_running(8, 2048)))
    later.start()
    with pytest.raises(TimeoutError):  # no worker runs it
        EdgeTrainClient(redis_server.url).wait("j1", timeout_s=1.5, on_update=seen.append, poll_s=0.1)
    later.join()
    samples = [next(r.samples for r in s.preparation.estimation.runs if r.batch_size == 8) for s in seen]
    assert samples == [1536, 2048]


def test_fleet_lists_devices_and_live_workers(store, redis_server, capsys) -> None:
    store.fleet.register(NANO, ttl_s=30, instance="i1")
    store.liveness.heartbeat(WorkerInfo(node="control@host-a", role="control", queues=["control"], hostname="host-a", pid=11))
    store.liveness.heartbeat(WorkerInfo(node="device-nano-1@host-b", role="device", queues=["device.nano-1"], hostname="host-b", pid=12))
    assert main(["fleet", "--redis-url", redis_server.url]) == ExitCode.ok
    out = capsys.readouterr().out
    assert "devices (1 registered):\n  nano-1" in out and "workers (2 live):" in out
    assert re.search(r"  control  +control@host-a +queues control +host host-a pid 11, heartbeat \d\d:\d\d:\d\d", out), out
    assert main(["fleet", "--json", "--redis-url", redis_server.url]) == ExitCode.ok
    fleet = json.loads(capsys.readouterr().out)
    assert [d["device_id"] for d in fleet["devices"]] == ["nano-1"]
    assert [(w["role"], w["node"], w["queues"], w["hostname"]) for w in fleet["workers"]] == [
        ("control", "control@host-a", ["control"], "host-a"),
        ("device", "device-nano-1@host-b", ["device.nano-1"], "host-b"),
    ]
    assert all(abs(datetime.fromisoformat(w["heartbeat_at"]) - utc_now()) < timedelta(seconds=30) for w in fleet["workers"])


def test_a_fine_tune_that_ran_out_of_samples_says_target_not_reached(store, redis_server, capsys) -> None:
    short = report().model_copy(update={"reached": False, "final_accuracy": 0.811, "samples_to_accuracy": None, "samples_processed": 40000})
    job_in(store, "j1", PartState.completed, run=short)
    status = EdgeTrainClient(redis_server.url).status("j1")
    assert "accuracy 0.811 (target 0.85 not reached) after 40000 samples" in format_report(JobReport.from_status(status))
    assert part_line(status, "nano-1").startswith("completed, target not reached")
    assert completed_message(short, 0.85) == "completed, accuracy 0.811, target 0.85 not reached in 40000 samples"
    assert main(["jobs", "--redis-url", redis_server.url]) == ExitCode.ok
    assert "completed" in (out := capsys.readouterr().out) and "target not reached on 1 of 1" in out
    assert job_exit_code(JobReport.from_status(status)) == ExitCode.failed
    job_in(store, "j2", PartState.completed)
    assert job_exit_code(JobReport.from_status(store.jobs.status("j2"))) == ExitCode.ok


def test_a_cap_no_configuration_meets_exits_3_and_names_the_registered_device_type(store, redis_server) -> None:
    reason = str(InfeasibleCapError(0.5, 3.4))
    store.jobs.create("j1", JobSpec.model_validate(quick_job([{"device_id": "nano-1", "power_cap_w": 0.5}])))
    drive_part(store, "j1", "nano-1", PartState.failed, reason=reason)  # failed by the planner: no type recorded
    store.fleet.register(NANO, ttl_s=30, instance="i1")
    job = EdgeTrainClient(redis_server.url).report("j1")
    assert job_exit_code(job) == ExitCode.infeasible
    assert "nano-1 [jetson-nano] power cap 0.5 W" in format_report(job)
    store.jobs.create("j2", JobSpec.model_validate(quick_job([{"device_id": "nano-1", "power_cap_w": 0.5}])))
    drive_part(store, "j2", "nano-1", PartState.failed, reason="unknown device 'nano-1'")
    assert job_exit_code(EdgeTrainClient(redis_server.url).report("j2")) == ExitCode.failed


def test_progress_to_a_pipe_is_one_line_per_event(store, redis_server) -> None:
    estimating(store, "j1")
    out = io.StringIO()
    progress = JobProgress(Console(file=out, width=80))
    status = EdgeTrainClient(redis_server.url).status("j1")
    progress(status)
    progress(status.model_copy(update={"notes": status.notes}))  # nothing new: nothing printed
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + len(status.notes) and all(line.startswith("[") for line in lines), lines
    assert max(map(len, lines)) > 80  # longer than the console, and still one line


def test_submit_timeout_gives_up_with_exit_124_and_says_nothing_picks_the_job_up(store, redis_server, tmp) -> None:
    spec = tmp / "job.json"
    spec.write_text(json.dumps(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}])))
    done = subprocess.run([*CLI, "submit", str(spec), "--timeout", "2", "--redis-url", redis_server.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == ExitCode.timed_out, done.stderr
    job_id = done.stdout.strip()
    assert f"nothing picks job {job_id} up until such a worker runs; --wait gives up after 2 s" in done.stderr
    assert (
        f"edgetrain: job {job_id} not finished after 2 s; it goes on: `edgetrain status {job_id}` follows it, `edgetrain cancel {job_id}` stops it"
        in done.stderr
    )
    lines = done.stderr.splitlines()  # a pipe: every event on one line, however long
    assert all(line.startswith(("note: ", "edgetrain: ", "[")) for line in lines), lines
    assert any(len(line) > 100 for line in lines)


def test_status_of_a_big_job_is_a_summary_with_failed_parts_first_and_pages_on_request(store, redis_server, capsys) -> None:
    devices = [{"device_id": f"dev-{i:03d}", "power_cap_w": 5.0} for i in range(120)]
    store.jobs.create("big", JobSpec.model_validate(quick_job(devices)))
    for i in (7, 99, 110):
        store.jobs.apply("big", f"dev-{i:03d}", Failed(reason="no such device"))
    client = EdgeTrainClient(redis_server.url)
    summary = client.status("big")
    assert summary.counts == {PartState.pending: 117, PartState.failed: 3} and not summary.finished
    assert list(summary.parts)[:3] == ["dev-007", "dev-099", "dev-110"] and len(summary.parts) == 50
    assert summary.shown is not None and "of 120 parts: the failed ones first" in summary.shown
    last = client.status("big", page=2)
    assert list(last.parts) == [f"dev-{i:03d}" for i in range(100, 120)] and "page 3 of 3" in (last.shown or "")
    failed = client.status("big", state=PartState.failed)
    assert list(failed.parts) == ["dev-007", "dev-099", "dev-110"] and "page 1 of 1 of the 3 failed parts" in (failed.shown or "")
    assert list(client.status("big", devices=["dev-042"]).parts) == ["dev-042"]
    assert len(client.report("big").devices) == 120  # the report covers every device
    assert main(["--redis-url", redis_server.url, "status", "big", "--state", "failed"]) == ExitCode.ok
    out = capsys.readouterr().out
    assert "120 parts: 117 pending, 3 failed" in out and "dev-099" in out and "dev-042" not in out
    assert main(["--redis-url", redis_server.url, "status", "big", "--device", "dev-500"]) == ExitCode.not_found
    assert "job big has no device 'dev-500'" in capsys.readouterr().err
