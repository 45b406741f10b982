"""The workflow applying each planner decision, in this process against a real Redis: what
it stores, which events it logs and which task messages it leaves in the broker queues."""

import random

import pytest
import redis

from edgetrain.common.jobs import EventKind, PartState
from edgetrain.common.keys import table_id, table_resource, vector_key, vector_resource
from edgetrain.common.payloads import FinetuneRequest, JobPage, ProfileRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, EstimationRequest, JobSpec, RelationVector
from edgetrain.common.settings import Settings
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.common.testing.tables import B, F, brute_force, random_monotone_table
from edgetrain.tasks import context
from edgetrain.tasks.contract import SERVER_QUEUE, TaskName, device_queue
from edgetrain.tasks.reaper import reap_once
from edgetrain.tasks.workflow import advance_job, advance_page, fail_resource

SHAPE = [1, 28, 28]
TID = table_id("twin", "smallcnn", SHAPE)


@pytest.fixture
def s(redis_server):
    redis.Redis.from_url(redis_server.url).flushdb()  # the store's keys and the broker's queues
    return context.init(Settings(redis_url=redis_server.url), ("edgetrain.tasks.workflow",))


@pytest.fixture
def broker(redis_server) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url)


def register(s, device_id: str, **changes) -> DeviceInfo:
    base = dict(device_id=device_id, device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True)
    info = DeviceInfo(**(base | changes))
    s.fleet.register(info, ttl_s=60, instance="test")
    return info


def submit(s, job_id: str, devices: list[dict]) -> JobSpec:
    spec = JobSpec.model_validate(quick_job(devices, batch_sizes=B))
    s.jobs.create(job_id, spec)
    return spec


def store_resources(s, spec: JobSpec) -> RelationVector:
    table = random_monotone_table(random.Random(0), time_noise=False)
    s.resources.put_table(table.model_copy(update={"device_type": "twin", "model": "smallcnn", "input_shape": SHAPE}))
    vector = RelationVector(batch_sizes=B, ratios=[0.3, 0.4, 0.5, 0.7, 0.8, 1.0], key=vector_key(spec.estimation_request()))
    s.resources.put_vector(vector)
    return vector


def kinds(s, job_id: str) -> list[EventKind]:
    return [e.kind for e in s.jobs.status(job_id).events]


def test_missing_table_and_vector_are_dispatched_once_across_jobs(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    assert advance_job("j1") == "running"
    assert s.jobs.part("j1", "d1").state == PartState.profiling
    (profile,) = queued_tasks(broker, device_queue("d1"))
    assert profile.name == TaskName.profile_device.value
    request = ProfileRequest.model_validate(profile.payload)
    assert (request.device_id, request.model, request.power_cap_w) == ("d1", "smallcnn", 5.0)
    (estimate,) = queued_tasks(broker, SERVER_QUEUE)
    assert estimate.name == TaskName.estimate_relation_vector.value
    assert EstimationRequest.model_validate(estimate.payload) == spec.estimation_request()
    assert kinds(s, "j1") == [EventKind.submitted, EventKind.profiling, EventKind.estimating]
    assert s.coordination.holder(table_resource(TID)).startswith("j1/")

    advance_job("j1")  # again: nothing new
    submit(s, "j2", [{"device_id": "d1", "power_cap_w": 5.0}])
    advance_job("j2")  # another job needing the same table and vector waits for them
    assert len(queued_tasks(broker, device_queue("d1"))) == 1 and len(queued_tasks(broker, SERVER_QUEUE)) == 1
    assert kinds(s, "j2") == [EventKind.submitted]
    assert s.coordination.take_waiters(table_resource(TID)) == ["j1", "j2"]


def test_with_table_and_vector_the_argmin_is_fine_tuned_once(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}])
    vector = store_resources(s, spec)
    advance_job("j1")
    advance_job("j1")
    part = s.jobs.part("j1", "d1")
    _, b, f = brute_force(s.resources.table(TID), vector, 4.0)
    assert part.state == PartState.finetuning and (part.selection.batch_size, part.selection.frequency_hz) == (b, f)
    assert (part.device_type, part.simulated) == ("twin", True)
    (message,) = queued_tasks(broker, device_queue("d1"))
    assert message.name == TaskName.finetune.value
    request = FinetuneRequest.model_validate(message.payload)
    assert (request.job_id, request.batch_size, request.frequency_hz) == ("j1", b, f)
    assert kinds(s, "j1") == [EventKind.submitted, EventKind.selected]
    assert queued_tasks(broker, SERVER_QUEUE) == []


def test_failures_fail_the_part_and_the_job_finishes_once(s, broker) -> None:
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}, {"device_id": "ghost", "power_cap_w": 5.0}])
    advance_job("j1")
    fail_resource(table_resource(TID), "profiling on d1 failed: boom")  # wakes j1 through the control queue
    assert [t.payload for t in queued_tasks(broker, "control")] == ["j1"]
    assert advance_job("j1") == "failed"
    advance_job("j1")
    status = s.jobs.status("j1")
    assert status.parts["d1"].reason == "profiling on d1 failed: boom"
    assert "unknown device 'ghost'" in status.parts["ghost"].reason
    events = [(e.kind, e.device_id) for e in status.events]
    assert events.count((EventKind.finished, None)) == 1
    assert (EventKind.failed, "d1") in events and (EventKind.failed, "ghost") in events


def test_a_stale_table_is_reprofiled_and_said_once(s, broker) -> None:
    register(s, "d1", software={"torch": "9.9"})
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    store_resources(s, spec)
    advance_job("j1")
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.profiling
    assert [t.name for t in queued_tasks(broker, device_queue("d1"))] == [TaskName.profile_device.value]
    stale = [e for e in s.jobs.status("j1").events if e.kind == EventKind.table_not_reused]
    assert len(stale) == 1 and "torch" in stale[0].message


def test_baseline1_without_a_configuration_is_an_event(s, broker) -> None:
    register(s, "d1", power_envelope_w=[1e3] * len(F))
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    store_resources(s, spec)
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.finetuning
    assert EventKind.baseline1_unavailable in kinds(s, "j1")


def test_an_old_failure_is_ignored_while_the_resource_exists(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    vector = store_resources(s, spec)
    s.coordination.fail(vector_resource(vector.key), "an old failure", ["j1"])  # ignored: the vector exists
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.finetuning


def test_a_big_job_is_advanced_in_pages(s, broker) -> None:
    for i in range(120):
        register(s, f"d{i:03d}")
    submit(s, "big", [{"device_id": f"d{i:03d}", "power_cap_w": 5.0} for i in range(120)])
    assert advance_job("big") == "paged"
    pages = queued_tasks(broker, "control")
    assert [t.name for t in pages] == [TaskName.advance_page.value] * 3
    assert [JobPage.model_validate(t.payload).page for t in pages] == [0, 1, 2]
    assert advance_page(JobPage(job_id="big", page=2)) == "running"
    states = {d: p.state for d, p in s.jobs.status("big").parts.items()}
    assert all(states[f"d{i:03d}"] == PartState.profiling for i in range(100, 120))  # page 2 only: devices 100..119
    assert all(states[f"d{i:03d}"] == PartState.pending for i in range(100))


def test_a_device_heard_from_again_has_its_jobs_advanced_once_more_so_the_missing_notice_clears(s, broker) -> None:
    settings = context.settings()
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    store_resources(s, spec)
    s.jobs.update_part("j1", "d1", {"state": PartState.finetuning})
    broker.zadd(s.keys.fleet_seen(), {"d1": broker.time()[0] - settings.heartbeat_ttl_s - 10})  # silent, within the grace
    broker.delete(s.keys.device("d1"))
    app = context.app()

    def advances() -> list[JobPage]:
        found = [JobPage.model_validate(t.payload) for t in queued_tasks(broker, "control") if t.name == TaskName.advance_page.value]
        broker.delete("control")
        return found

    silent = reap_once(s, app, settings)
    assert silent == {"d1"} and [p.job_id for p in advances()] == ["j1"]
    advance_page(JobPage(job_id="j1", page=0))
    assert "has not been heard from since" in (s.jobs.part("j1", "d1").waiting or "")
    register(s, "d1")  # the restarted worker heartbeats again
    assert reap_once(s, app, settings, silent) == frozenset() and [p.job_id for p in advances()] == ["j1"]
    advance_page(JobPage(job_id="j1", page=0))
    assert s.jobs.part("j1", "d1").waiting is None and s.jobs.part("j1", "d1").state == PartState.finetuning
    assert reap_once(s, app, settings, frozenset()) == frozenset() and advances() == []  # nothing more once it is back
