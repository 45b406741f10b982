"""What a user meets at the command line: `status` in every state, notes on stalled queues,
one-line errors with distinct exit statuses, job management, specs checked in one pass."""

import json
import os
import subprocess
import sys

import pytest

from edgetrain.common.jobs import EventKind, FinetuneProgress, JobState, PartState
from edgetrain.common.presets import quick_job
from edgetrain.common.reports import JobReport
from edgetrain.common.schemas import ConfigSwitch, JobSpec, PowerGuardReport, RunReport, Selection
from edgetrain.common.store import WorkerInfo
from edgetrain.tasks.client import EdgeTrainClient, JobSpecError, validate_job
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.output import format_report

CLI = [sys.executable, "-m", "edgetrain.workers.cli"]
SELECTION = Selection(batch_size=16, frequency_hz=614_400_000, estimated_time_s=1.0, peak_power_w=2.9)


def report(peak_w: float = 2.9) -> RunReport:
    return RunReport(
        device_id="nano-1", device_type="jetson-nano", simulated=True, batch_size=16, frequency_hz=614_400_000, reached=True,
        final_accuracy=0.86, samples_to_accuracy=4000, samples_processed=4096, steps=256, device_time_s=0.6, energy_j=1.5,
        peak_power_w=peak_w, wall_s=21.0,
    )  # fmt: skip


STATES = {
    PartState.pending: {},
    PartState.profiling: {"device_type": "jetson-nano", "simulated": True},
    PartState.estimating: {"device_type": "jetson-nano", "simulated": True},
    PartState.finetuning: {"device_type": "jetson-nano", "simulated": True, "selection": SELECTION},
    PartState.completed: {"device_type": "jetson-nano", "simulated": True, "selection": SELECTION, "report": report()},
    PartState.failed: {"reason": "unknown device 'nano-1'"},
    PartState.cancelled: {"reason": "cancelled at 2026-11-23 10:00:00 UTC"},
}


def job_in(store, job_id: str, state: PartState) -> None:
    store.jobs.create(job_id, JobSpec.model_validate(quick_job([{"device_id": "nano-1", "power_cap_w": 3.0}])))
    store.jobs.update_part(job_id, "nano-1", {"state": state, **STATES[state]})
    if state == PartState.finetuning:
        progress = FinetuneProgress(samples=1024, accuracy=0.5, device_time_s=0.1, energy_j=0.2, target_accuracy=0.85, max_samples=40000)
        store.jobs.set_progress(job_id, "nano-1", progress)


@pytest.mark.parametrize("state", list(STATES))
def test_status_prints_every_state(store, redis_server, capsys, state: PartState) -> None:
    job_in(store, "j1", state)
    assert main(["status", "j1", "--redis-url", redis_server.url]) == ExitCode.ok
    out = capsys.readouterr().out
    assert "job j1:" in out and "nano-1" in out and "events:" in out
    assert main(["--redis-url", redis_server.url, "status", "j1", "--json"]) == ExitCode.ok
    document = json.loads(capsys.readouterr().out)
    assert document["devices"][0]["state"] == state.value
    assert ("no live worker consumes the 'control' queue" in " ".join(document["notes"])) == (state not in (PartState.completed, PartState.failed, PartState.cancelled))


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
        assert "cannot use Redis at redis://:***@127.0.0.1:1/0" in done.stderr and "secret" not in done.stderr


def test_bad_arguments_are_refused_with_what_is_allowed() -> None:
    bad_id = subprocess.run([*CLI, "worker", "device", "--device-id", "a b", "--backend", "sim:jetson-nano"], capture_output=True, text=True, timeout=120)
    assert bad_id.returncode == ExitCode.usage and "'a b' is not a device id" in bad_id.stderr
    for cap in ("-1", "nan", "inf"):
        done = subprocess.run([*CLI, "profile", "run", "--device-id", "n1", "--model", "smallcnn", "--power-cap-w", cap], capture_output=True, text=True, timeout=120)
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


def test_cancel_stops_parts_that_are_not_running_and_requeue_refuses_a_cancelled_job(store, redis_server) -> None:
    job_in(store, "j1", PartState.profiling)
    client = EdgeTrainClient(redis_server.url)
    client.cancel("j1")
    assert client.cancel("j1").cancelled_at is not None  # twice is fine
    assert [e.kind for e in store.jobs.status("j1").events].count(EventKind.cancelled) == 1
    with pytest.raises(ValueError, match="cancelled: submit it again"):
        client.requeue("j1", "nano-1")


def test_requeue_plans_a_failed_part_again(store, redis_server) -> None:
    job_in(store, "j1", PartState.failed)
    client = EdgeTrainClient(redis_server.url)
    client.requeue("j1", "nano-1")
    status = client.status("j1")
    assert status.parts["nano-1"].state == PartState.pending and status.parts["nano-1"].reason is None
    assert status.events[-1].kind == EventKind.requeued and store.jobs.device_jobs("nano-1") == ["j1"]
    with pytest.raises(ValueError, match="only a failed or cancelled part is re-queued"):
        client.requeue("j1", "nano-1")


def test_a_spec_s_problems_are_all_reported_at_once() -> None:
    spec = quick_job(target_accuracy=2, weights="file:///etc/shadow", proxy_dataset={"name": "imagenet"})
    with pytest.raises(JobSpecError) as err:
        validate_job(spec)
    message = str(err.value)
    assert "target_accuracy: Input should be less than 1" in message
    assert "weights:" in message and "proxy_dataset.name: unknown dataset 'imagenet'" in message


def test_the_report_flags_a_peak_above_the_cap_and_tells_device_time_from_wall_time(store) -> None:
    job_in(store, "j1", PartState.completed)
    store.jobs.update_part("j1", "nano-1", {"report": report(peak_w=3.05)})
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert "peak power 3.05 W ABOVE the 3.0 W cap" in text
    assert "device time 0.6 s (the twin's clock)" in text and "wall time on the worker 21 s" in text
    assert JobReport.from_status(store.jobs.status("j1")).state == JobState.completed


def test_the_report_says_why_edgetrain_kept_the_largest_batch(store) -> None:
    job_in(store, "j1", PartState.completed)
    note = "kept b=128: b=16's gain 3% within uncertainty 5%"
    store.jobs.update_part("j1", "nano-1", {"selection": SELECTION.model_copy(update={"batch_size": 128, "note": note})})
    lines = format_report(JobReport.from_status(store.jobs.status("j1"))).splitlines()
    assert lines[lines.index(next(line for line in lines if "edgetrain : b=128" in line)) + 1].strip() == note


def test_the_client_and_the_control_worker_do_not_import_pytorch(redis_server) -> None:
    probe = (
        "import sys\n"
        "from edgetrain.common.settings import Settings\n"
        "from edgetrain.tasks import context\n"
        "from edgetrain.tasks.client import EdgeTrainClient\n"
        "import edgetrain.workers.cli, edgetrain.workers.output\n"
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
    job_in(store, "j1", PartState.completed)
    store.jobs.update_part("j1", "nano-1", {"report": report().model_copy(update={"switches": switches, "guard": guard, "paused_s": 30.0})})
    device = JobReport.from_status(store.jobs.status("j1")).devices[0]
    text = format_report(JobReport.from_status(store.jobs.status("j1")))
    assert device.over_cap  # the guard saw readings over the cap in force
    assert "power guard: 2 step-down(s), 1 back up; 0.12 s over the cap" in text
    assert "paused 30 s at idle clocks" in text
    assert "40.0 s  cap    cap 3.5 W: b=64 f=921.6 MHz -> b=32 f=614.4 MHz" in text
    assert "pause  cap 1 W: b=32 f=614.4 MHz -> paused (power cap 1.00 W is below)" in text
