"""The exporter's collector reads the fleet from a real Redis, as workers write it through the
store, and exposes it in Prometheus's format (parsed back with prometheus_client's parser)."""

import math
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import AttemptFinished, AttemptStarted, Dispatched, Identified, Prepared, request_digest
from edgetrain.common.jobs.state import FinetuneProgress, PartState
from edgetrain.common.payloads import finetune_request
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, JobSpec, RunReport, Selection
from edgetrain.common.settings import Settings
from edgetrain.common.store import Lease, WorkerInfo, Written
from edgetrain.tasks.contract import HANDED_ON
from edgetrain.workers.processes.exporter import scrape as exposition
from edgetrain.workers.processes.exposition import Family, render, serve_text

DEVICES = [{"device_id": "nano-1", "power_cap_w": 3.0}, {"device_id": "tx2nx-1", "power_cap_w": 5.0}]


def scrape(store) -> dict[tuple[str, tuple], float]:
    text = exposition(store, Settings(redis_url="redis://unused:1/0")).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }  # fmt: skip


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def device(device_id: str) -> DeviceInfo:
    return DeviceInfo(device_id=device_id, device_type="jetson-nano", backend="sim:jetson-nano", frequencies_hz=[1, 2],
                      memory_bytes=4, simulated=True)  # fmt: skip


TWIN = Identified(device_type="jetson-nano", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)
CHOICE = Selection(batch_size=16, frequency_hz=844_800_000, estimated_time_s=0.2, peak_power_w=2.9)


def fine_tune_started(store, job_id: str, spec: JobSpec) -> str:
    """Dispatch nano-1's fine-tune and start its attempt, as the control and device workers do; the attempt's token."""
    request = finetune_request(job_id, spec, spec.devices[0], CHOICE, "jetson-nano:smallcnn:1x28x28", "vkey")
    store.jobs.apply(job_id, "nano-1", Dispatched(device=TWIN, token=f"{job_id}-t", request=request, selection=CHOICE,
                                                  estimated_time_to_accuracy_s=0.17, baseline1_estimated_time_to_accuracy_s=0.92))  # fmt: skip
    store.jobs.apply(job_id, "nano-1", AttemptStarted(dispatch=f"{job_id}-t", digest=request_digest(request), attempt=f"{job_id}-a",
                                                      node="device-nano-1@h"))  # fmt: skip
    return f"{job_id}-a"


def test_a_fine_tune_in_progress_is_exported_per_device_part_role_and_fleet(store) -> None:
    store.fleet.register(device("nano-1"), ttl_s=30, instance="w1")
    store.fleet.register(device("tx2nx-1"), ttl_s=30, instance="w2")
    store.liveness.heartbeat(WorkerInfo(node="device-nano-1@h", role="device", queues=["device.nano-1"], hostname="h", pid=1))
    store.liveness.heartbeat(WorkerInfo(node="control@h", role="control", queues=["control"], hostname="h", pid=2))
    spec = JobSpec.model_validate(quick_job(DEVICES))
    store.jobs.create("j1", spec)
    attempt = fine_tune_started(store, "j1", spec)
    store.jobs.apply("j1", "tx2nx-1", Prepared(state=PartState.profiling, device=TWIN))
    progress = FinetuneProgress(
        samples=2048, accuracy=0.61, device_time_s=0.3, energy_j=0.8, target_accuracy=0.85, max_samples=40000,
        batch_size=16, frequency_hz=844_800_000, power_cap_w=3.0, power_w=2.7, peak_power_w=2.95, samples_per_s=6800.0,
        guard_step_downs=2, switches=3, over_cap_s=0.004,
    )  # fmt: skip
    assert store.jobs.attempt_write("j1", "nano-1", attempt, progress=progress) == Written.ok
    store.liveness.take(Lease(task_id="t1", task="edgetrain.finetune", attempt=attempt, node="device-nano-1@h", queue="device.nano-1"))
    store.monitoring.count(HANDED_ON, "server")
    store.monitoring.count(HANDED_ON, "server")

    s = scrape(store)
    nano = {"device": "nano-1", "simulated": "true"}
    assert value(s, "edgetrain_redis_up") == 1
    assert value(s, "edgetrain_device_power_watts", **nano) == 2.7
    assert value(s, "edgetrain_device_power_cap_watts", **nano) == 3.0
    assert value(s, "edgetrain_device_frequency_hertz", **nano) == 844_800_000
    assert value(s, "edgetrain_device_batch_size", **nano) == 16
    assert value(s, "edgetrain_device_samples_per_second", **nano) == 6800.0
    assert value(s, "edgetrain_device_accuracy_ratio", **nano) == 0.61
    assert value(s, "edgetrain_device_guard_step_downs_total", **nano) == 2
    assert value(s, "edgetrain_device_switches_total", **nano) == 3
    assert value(s, "edgetrain_device_job_info", device="nano-1", job_id="j1") == 1
    assert value(s, "edgetrain_device_up", device="tx2nx-1", device_type="jetson-nano", backend="sim:jetson-nano", simulated="true") == 1
    part = {"job_id": "j1", "device": "nano-1", "simulated": "true"}
    assert value(s, "edgetrain_part_samples", **part) == 2048 and value(s, "edgetrain_part_target_accuracy_ratio", **part) == 0.85
    assert value(s, "edgetrain_part_estimated_time_to_accuracy_seconds", **part, method="baseline1") == 0.92
    assert value(s, "edgetrain_part_state", **part, state="finetuning") == 1
    assert value(s, "edgetrain_part_attempts", **part) == 1
    # tx2nx-1 profiles, but no live worker consumes device.tx2nx-1: it waits on a missing worker
    assert value(s, "edgetrain_part_waiting", job_id="j1", device="tx2nx-1", simulated="true", reason="no_worker") == 1
    assert value(s, "edgetrain_parts_waiting", reason="no_worker") == 1 and value(s, "edgetrain_parts_waiting", reason="table") == 0
    assert value(s, "edgetrain_jobs", state="running") == 1 and value(s, "edgetrain_parts", state="profiling") == 1
    assert value(s, "edgetrain_workers", role="device") == 1 and value(s, "edgetrain_workers", role="server") == 0
    assert value(s, "edgetrain_tasks_running", role="device") == 1
    assert value(s, "edgetrain_tasks_handed_on_total", role="server") == 2
    assert value(s, "edgetrain_queue_messages", queue="device.nano-1", role="device") == 0
    assert value(s, "edgetrain_redis_maxmemory_policy_info", policy="noeviction") == 1


def test_a_completed_part_reports_estimated_and_achieved_time_to_accuracy(store) -> None:
    spec = JobSpec.model_validate(quick_job(DEVICES[:1]))
    store.jobs.create("j2", spec)
    attempt = fine_tune_started(store, "j2", spec)
    report = RunReport(device_id="nano-1", device_type="jetson-nano", simulated=True, batch_size=16, frequency_hz=844_800_000,
                       reached=True, final_accuracy=0.86, samples_to_accuracy=4352, samples_processed=4608, steps=288,
                       device_time_s=0.597, energy_j=1.51, peak_power_w=3.0, wall_s=7.0)  # fmt: skip
    store.jobs.apply("j2", "nano-1", AttemptFinished(attempt=attempt, report=report))
    s = scrape(store)
    part = {"job_id": "j2", "device": "nano-1", "simulated": "true"}
    assert value(s, "edgetrain_part_achieved_time_to_accuracy_seconds", **part) == 0.597
    assert value(s, "edgetrain_part_estimated_time_to_accuracy_seconds", **part, method="edgetrain") == 0.17
    assert value(s, "edgetrain_jobs", state="completed") == 1
    assert not any(name == "edgetrain_part_waiting" for name, _ in s)


def test_unreachable_redis_is_a_metric_not_an_error() -> None:
    from edgetrain.common.store import Store

    s = scrape(Store.connect("redis://127.0.0.1:1/0"))
    assert s == {("edgetrain_redis_up", ()): 0.0}


@pytest.mark.parametrize("module", ["edgetrain.workers.processes.exporter"])
def test_the_exporter_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_fine_tune_queued_behind_another_job_on_its_device_is_queued_not_running(store) -> None:
    store.fleet.register(device("nano-1"), ttl_s=30, instance="w1")
    store.liveness.heartbeat(WorkerInfo(node="device-nano-1@h", role="device", queues=["device.nano-1"], hostname="h", pid=1))
    spec = JobSpec.model_validate(quick_job(DEVICES[:1]))
    for job_id in ("first", "second"):
        store.jobs.create(job_id, spec)
    fine_tune_started(store, "first", spec)
    request = finetune_request("second", spec, spec.devices[0], CHOICE, "jetson-nano:smallcnn:1x28x28", "vkey")
    store.jobs.apply("second", "nano-1", Dispatched(device=TWIN, token="second-t", request=request, selection=CHOICE,
                                                    estimated_time_to_accuracy_s=0.17))  # fmt: skip
    s = scrape(store)
    second = {"job_id": "second", "device": "nano-1", "simulated": "true"}
    assert value(s, "edgetrain_part_state", **second, state="queued") == 1
    assert ("edgetrain_part_state", tuple(sorted({**second, "state": "finetuning"}.items()))) not in s
    assert value(s, "edgetrain_part_waiting", **second, reason="device_queue") == 1
    assert value(s, "edgetrain_parts_waiting", reason="device_queue") == 1 and value(s, "edgetrain_parts", state="queued") == 1
    assert value(s, "edgetrain_device_job_info", device="nano-1", job_id="first") == 1  # what the board runs, ahead of it
    assert value(s, "edgetrain_job_parts", job_id="second", state="queued") == 1


def test_a_big_job_is_exported_from_its_summary_not_per_part(store) -> None:
    devices = [{"device_id": f"d{i:03d}", "power_cap_w": 5.0} for i in range(60)]
    spec = JobSpec.model_validate(quick_job(devices))
    store.jobs.create("big", spec)
    store.liveness.heartbeat(WorkerInfo(node="control@h", role="control", queues=["control"], hostname="h", pid=2))
    store.liveness.heartbeat(WorkerInfo(node="device-d000@h", role="device", queues=["device.d000"], hostname="h", pid=3))
    requests = {d: finetune_request("big", spec, spec.devices[i], CHOICE, "jetson-nano:smallcnn:1x28x28", "vkey")
                for i, d in enumerate(("d000", "d001"))}  # fmt: skip
    for d, request in requests.items():  # dispatched: d000's worker lives, nobody consumes d001's queue
        store.jobs.apply("big", d, Dispatched(device=TWIN, token=f"{d}-t", request=request, selection=CHOICE,
                                              estimated_time_to_accuracy_s=0.17))  # fmt: skip
    store.jobs.apply("big", "d000", AttemptStarted(dispatch="d000-t", digest=request_digest(requests["d000"]), attempt="a0",
                                                  node="device-d000@h"))  # fmt: skip
    progress = FinetuneProgress(samples=512, accuracy=0.3, device_time_s=0.2, energy_j=0.5, target_accuracy=0.85, max_samples=40000)
    assert store.jobs.attempt_write("big", "d000", "a0", progress=progress) == Written.ok
    s = scrape(store)
    assert not [name for name, _ in s if name.startswith("edgetrain_part_")]  # no series per part of a job of 60 devices
    assert value(s, "edgetrain_job_parts", job_id="big", state="pending") == 58
    assert value(s, "edgetrain_job_parts", job_id="big", state="finetuning") == 1
    assert value(s, "edgetrain_parts_waiting", reason="planning") == 58 and value(s, "edgetrain_parts_waiting", reason="no_worker") == 1
    assert value(s, "edgetrain_job_samples", job_id="big") == 512 and value(s, "edgetrain_job_energy_joules", job_id="big") == 0.5


def commands_of_a_scrape(store, monkeypatch, devices: int) -> int:
    """Redis commands the client sends for one scrape of a fleet of `devices`, each with a dispatched part of one job."""
    from redis.connection import AbstractConnection

    store.clear()
    ids = [f"n{i:03d}" for i in range(devices)]
    for d in ids:
        store.fleet.register(device(d), ttl_s=30, instance=f"w-{d}")
        store.fleet.set_power_cap(d, 4.0)
    spec = JobSpec.model_validate(quick_job([{"device_id": d, "power_cap_w": 5.0} for d in ids]))
    job_id = f"j{devices}"
    store.jobs.create(job_id, spec)
    for target in spec.devices:
        request = finetune_request(job_id, spec, target, CHOICE, "jetson-nano:smallcnn:1x28x28", "vkey")
        store.jobs.apply(job_id, target.device_id, Dispatched(device=TWIN, token=f"{target.device_id}-t", request=request,
                                                              selection=CHOICE, estimated_time_to_accuracy_s=0.17))  # fmt: skip
    scrape(store)  # scripts loaded
    sent = []  # the names of the commands sent, alone or in pipelines
    one, many = AbstractConnection.send_command, AbstractConnection.pack_commands
    monkeypatch.setattr(AbstractConnection, "send_command", lambda self, *args, **kw: sent.append(args[0]) or one(self, *args, **kw))
    monkeypatch.setattr(AbstractConnection, "pack_commands", lambda self, cmds: sent.extend(c[0] for c in cmds) or many(self, cmds))
    s = scrape(store)
    monkeypatch.undo()
    assert sum(v for (name, _), v in s.items() if name == "edgetrain_device_up") == devices
    assert value(s, "edgetrain_device_power_cap_watts", device=ids[-1], simulated="true") == 4.0
    assert value(s, "edgetrain_job_parts", job_id=job_id, state="queued") == devices
    return len(sent)


def test_a_scrape_sends_as_many_commands_for_a_big_fleet_as_for_a_small_one(store, monkeypatch) -> None:
    assert commands_of_a_scrape(store, monkeypatch, 60) == commands_of_a_scrape(store, monkeypatch, 150)  # jobs over STATUS_PARTS


def test_idle_devices_show_the_cap_set_on_them_until_lifted_and_leave_the_fleet_when_their_worker_stops(store) -> None:
    odd = DeviceInfo(device_id="odd-1", device_type='board "x"\\1\nrev', backend="sim", frequencies_hz=[1], memory_bytes=4,
                     simulated=False)  # fmt: skip
    store.fleet.register(odd, ttl_s=30, instance="w1")
    store.fleet.register(device("nano-1"), ttl_s=30, instance="w2")
    store.fleet.set_power_cap("nano-1", 3.5)
    s = scrape(store)
    assert value(s, "edgetrain_device_power_cap_watts", device="nano-1", simulated="true") == 3.5
    assert value(s, "edgetrain_device_up", device="odd-1", device_type='board "x"\\1\nrev', backend="sim", simulated="false") == 1
    store.fleet.set_power_cap("nano-1", None)
    store.fleet.unregister("odd-1", "w1")
    s = scrape(store)
    assert not [labels for name, labels in s if name == "edgetrain_device_power_cap_watts"]
    assert [dict(labels)["device"] for name, labels in s if name == "edgetrain_device_up"] == ["nano-1"]
    assert ("edgetrain_device_last_seen_timestamp_seconds", (("device", "odd-1"),)) in s  # its last heartbeat is kept


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_the_metrics_server_answers_on_ipv4_and_ipv6_and_a_failed_scrape_is_a_500_with_its_error(address: str) -> None:
    answers = iter([b"edgetrain_up 1\n", ValueError("a malformed labels entry")])

    def body() -> bytes:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server, thread = serve_text(address, 0, body)
    try:
        host = f"[{address}]" if ":" in address else address
        url = f"http://{host}:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200 and reply.read() == b"edgetrain_up 1\n"
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=10)
        assert failed.value.code == 500 and "ValueError: a malformed labels entry" in failed.value.read().decode()
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_the_text_written_reads_back_as_the_samples_given() -> None:
    """Label values with quotes, backslashes and newlines, ints, bools, large and small floats,
    infinities and NaN, as Prometheus's own parser reads them."""
    family = Family("edgetrain_test_values", 'a "doc"\nwith a \\ in it', labels=["device", "note"])
    given = [(["a", "plain"], 3), (['q"uote', "back\\slash"], 2.5), (["new\nline", ""], True),
             (["big", "x"], 1764278400.123), (["tiny", "x"], 1.5e-09), (["inf", "x"], float("inf")), (["ninf", "x"], -float("inf"))]  # fmt: skip
    for labels, value in given:
        family.add(labels, value)
    family.add(["nan", "x"], float("nan"))
    (parsed,) = text_string_to_metric_families(render([family]).decode())
    assert parsed.documentation == 'a "doc"\nwith a \\ in it'
    samples = [(dict(s.labels), s.value) for s in parsed.samples]
    assert samples[:-1] == [({"device": d, "note": n}, float(v)) for (d, n), v in given]
    assert samples[-1][0] == {"device": "nan", "note": "x"} and math.isnan(samples[-1][1])
