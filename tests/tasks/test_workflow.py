"""The workflow applying each planner decision, in this process against a real Redis: what
it stores, which events it logs and which task messages it leaves in the broker queues."""

import random
import threading

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import (
    AttemptCancelled,
    AttemptFinished,
    AttemptStarted,
    Dispatched,
    Failed,
    Identified,
    Refused,
    Requeued,
    request_digest,
)
from edgetrain.common.jobs.state import DevicePart, EventKind, JobState, PartState
from edgetrain.common.keys import table_id, table_resource, vector_key, vector_resource
from edgetrain.common.payloads import FinetuneRequest, JobPage, ProfileRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, EstimationRequest, JobSpec, RelationVector, RunReport
from edgetrain.common.store import Lease, Written
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.common.testing.tables import B, F, brute_force, random_monotone_table
from edgetrain.tasks import context, reaper, workflow
from edgetrain.tasks.client import poll_until
from edgetrain.tasks.contract import SERVER_QUEUE, TaskName, device_queue
from edgetrain.tasks.reaper import hand_on, reap_once
from edgetrain.tasks.workflow import advance_job, advance_page, fail_resource, plan_submitted

SHAPE = [1, 28, 28]
TID = table_id("twin", "smallcnn", SHAPE)
IDENTIFIED = Identified(device_type="twin", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)


def register(s, device_id: str, **changes) -> DeviceInfo:
    base = dict(device_id=device_id, device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True)
    info = DeviceInfo(**(base | changes))
    s.fleet.register(info, ttl_s=60, instance="test")
    return info


def submit(s, job_id: str, devices: list[dict], **changes) -> JobSpec:
    spec = JobSpec.model_validate(quick_job(devices, batch_sizes=B, **changes))
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


def test_a_step_that_finishes_the_job_returns_its_state(s) -> None:
    """What Flower shows as advance_job's result: the job's state when the step ended it."""
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 0.01}])  # below every configuration
    store_resources(s, spec)
    assert advance_job("j1") == "failed"
    assert s.jobs.status("j1").state == JobState.failed
    assert advance_job("j1") == "advanced"  # nothing left to do: the job was already finished


def test_missing_table_and_vector_are_dispatched_once_across_jobs(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    assert advance_job("j1") == "advanced"
    assert s.jobs.part("j1", "d1").state == PartState.profiling
    (profile,) = queued_tasks(broker, device_queue("d1"))
    assert profile.name == TaskName.profile_device.value
    request = ProfileRequest.model_validate(profile.payload)
    assert (request.device_id, request.model, request.power_cap_w) == ("d1", "smallcnn", 5.0)
    (estimate,) = queued_tasks(broker, SERVER_QUEUE)
    assert estimate.name == TaskName.estimate_relation_vector.value
    assert EstimationRequest.model_validate(estimate.payload) == spec.estimation_request()
    assert kinds(s, "j1") == [EventKind.submitted, EventKind.profiling, EventKind.estimating]
    _, profiling, estimating = s.jobs.status("j1").events
    assert profiling.fields == {"table": TID, "rows": ",".join(map(str, B)), "mode": "grid"}
    assert estimating.fields == {"vector": vector_key(spec.estimation_request())}
    assert s.coordination.holder(table_resource(TID)).startswith("j1/")

    advance_job("j1")  # again: nothing new
    submit(s, "j2", [{"device_id": "d1", "power_cap_w": 5.0}])
    advance_job("j2")  # another job needing the same table and vector waits for them
    assert len(queued_tasks(broker, device_queue("d1"))) == 1 and len(queued_tasks(broker, SERVER_QUEUE)) == 1
    assert kinds(s, "j2") == [EventKind.submitted]
    waiting: list[str] = []
    s.coordination.settle(table_resource(TID), lambda jobs: waiting.extend(jobs) or [])
    assert waiting == ["j1", "j2"]


def test_with_table_and_vector_the_argmin_is_fine_tuned_once(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}])
    vector = store_resources(s, spec)
    advance_job("j1")
    advance_job("j1")
    part = s.jobs.part("j1", "d1")
    _, b, f = brute_force(s.resources.table(TID), vector, 4.0)
    assert part.state == PartState.queued and (part.selection.batch_size, part.selection.frequency_hz) == (b, f)
    assert (part.device_type, part.simulated) == ("twin", True)
    (message,) = queued_tasks(broker, device_queue("d1"))
    assert message.name == TaskName.finetune.value
    request = FinetuneRequest.model_validate(message.payload)
    assert (request.job_id, request.batch_size, request.frequency_hz) == ("j1", b, f)
    assert kinds(s, "j1") == [EventKind.submitted, EventKind.selected]
    assert queued_tasks(broker, SERVER_QUEUE) == []


def test_failures_fail_the_part_and_the_job_finishes_once(s, broker) -> None:
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}, {"device_id": "ghost", "power_cap_w": 5.0}], device_grace_s=0)
    advance_job("j1")
    fail_resource(table_resource(TID), "profiling on d1 failed: boom")  # wakes j1 through the control queue
    assert [t.payload for t in queued_tasks(broker, "control")] == ["j1"]
    advance_job("j1")
    assert s.jobs.status("j1").state == JobState.failed
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


def test_concurrent_advances_of_a_job_dispatch_its_fine_tune_once_without_a_lock(s, broker) -> None:
    register(s, "d1")
    store_resources(s, submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}]))
    seen = s.jobs.part("j1", "d1")  # read by one control process while another takes the part on
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued
    with pytest.raises(Refused, match="the part is queued"):  # decided on what it read; refused on what is stored
        s.jobs.apply("j1", "d1", Dispatched(device=IDENTIFIED, token="t2", request=s.jobs.part("j1", "d1").dispatch.request,
                                            selection=s.jobs.part("j1", "d1").selection, estimated_time_to_accuracy_s=None), seen)  # fmt: skip
    threads = [threading.Thread(target=advance_job, args=("j1",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(queued_tasks(broker, device_queue("d1"))) == 1, [e.line() for e in s.jobs.status("j1").events]
    assert kinds(s, "j1") == [EventKind.submitted, EventKind.selected]


def test_a_part_read_back_serialises_as_stored(s) -> None:
    register(s, "d1")
    store_resources(s, submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}]))
    advance_job("j1")
    raw = s.jobs._redis.get(s.keys.part("j1", "d1"))  # what `apply(seen=...)` compares: one round trip, not two
    assert DevicePart.model_validate_json(raw).model_dump_json() == raw


def test_baseline1_without_a_configuration_is_an_event(s, broker) -> None:
    register(s, "d1", power_envelope_w=[1e3] * len(F))
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    store_resources(s, spec)
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued
    assert EventKind.baseline1_unavailable in kinds(s, "j1")


def test_an_old_failure_is_ignored_while_the_resource_exists(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    vector = store_resources(s, spec)
    s.coordination.settle(vector_resource(vector.key), lambda jobs: [], reason="an old failure")  # ignored: the vector exists
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued


def test_a_big_job_is_advanced_in_pages(s, broker) -> None:
    for i in range(120):
        register(s, f"d{i:03d}")
    submit(s, "big", [{"device_id": f"d{i:03d}", "power_cap_w": 5.0} for i in range(120)])
    assert advance_job("big") == "paged"
    pages = queued_tasks(broker, "control")
    assert [t.name for t in pages] == [TaskName.advance_page.value] * 3
    assert [JobPage.model_validate(t.payload).page for t in pages] == [0, 1, 2]
    ledger = s.ledger.unseen_since(float("inf"), 10)  # a page Redis loses is sent again by the reaper
    assert sorted(t.task_id for t in ledger) == sorted(t.id for t in pages)
    assert advance_page(JobPage(job_id="big", page=2)) == "advanced"
    states = {d: p.state for d, p in s.jobs.status("big").parts.items()}
    assert all(states[f"d{i:03d}"] == PartState.profiling for i in range(100, 120))  # page 2 only: devices 100..119
    assert all(states[f"d{i:03d}"] == PartState.pending for i in range(100))


def test_a_device_heard_from_again_has_its_jobs_advanced_once_more_so_the_missing_notice_clears(s, broker) -> None:
    settings = context.settings()
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    store_resources(s, spec)
    advance_page(JobPage(job_id="j1", page=0))
    assert s.jobs.part("j1", "d1").state == PartState.queued
    broker.delete(device_queue("d1"))
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
    assert s.jobs.part("j1", "d1").waiting is None and s.jobs.part("j1", "d1").state == PartState.queued
    assert reap_once(s, app, settings, frozenset()) == frozenset() and advances() == []  # nothing more once it is back


def test_a_device_not_registered_yet_is_waited_for_and_its_job_advanced_when_it_registers_or_its_grace_ends(s, broker) -> None:
    settings, app = context.settings(), context.app()

    def advanced() -> list[str]:
        found = [t.payload for t in queued_tasks(broker, "control") if t.name == TaskName.advance_page.value]
        broker.delete("control")
        return [JobPage.model_validate(p).job_id for p in found]

    spec = submit(s, "j1", [{"device_id": "late", "power_cap_w": 5.0}], device_grace_s=600)
    store_resources(s, spec)
    advance_job("j1")
    part = s.jobs.part("j1", "late")
    assert part.state == PartState.pending and "'late' is not registered in the fleet (yet)" in part.waiting, part
    assert EventKind.device_missing in kinds(s, "j1")
    assert reap_once(s, app, settings) == frozenset() and advanced() == []  # still within its grace: nothing to do
    register(s, "late")  # its worker starts
    reap_once(s, app, settings)
    assert advanced() == ["j1"]
    advance_page(JobPage(job_id="j1", page=0))
    assert s.jobs.part("j1", "late").state == PartState.queued and s.jobs.part("j1", "late").waiting is None
    reap_once(s, app, settings)
    assert advanced() == []  # taken off the list once it registered

    submit(s, "j2", [{"device_id": "never", "power_cap_w": 5.0}], device_grace_s=1)
    advance_job("j2")
    assert s.jobs.part("j2", "never").state == PartState.pending
    poll_until(lambda: reap_once(s, app, settings) is not None and advanced() or None, 10, 0.2, "the job advanced when its grace ended")
    advance_page(JobPage(job_id="j2", page=0))
    part = s.jobs.part("j2", "never")
    assert part.state == PartState.failed and part.reason.startswith("unknown device 'never': not registered in the fleet within")


def test_cancel_stops_parts_no_attempt_runs_at_once_and_asks_running_ones_to_stop(s, broker) -> None:
    for d in ("d1", "d2", "d3"):
        register(s, d)
    spec = submit(s, "j1", [{"device_id": d, "power_cap_w": 5.0} for d in ("d1", "d2", "d3")])
    store_resources(s, spec)
    advance_job("j1")
    running = s.jobs.part("j1", "d2")
    s.jobs.apply("j1", "d2", AttemptStarted(dispatch=running.dispatch.token, digest=request_digest(running.dispatch.request),
                                            attempt="a1", node="device-d2@h"))  # fmt: skip
    s.jobs.apply("j1", "d3", AttemptStarted(dispatch=s.jobs.part("j1", "d3").dispatch.token,
                                            digest=request_digest(s.jobs.part("j1", "d3").dispatch.request), attempt="a3", node="n"))  # fmt: skip
    s.jobs.apply("j1", "d3", AttemptFinished(attempt="a3", report=finished(s.jobs.part("j1", "d3"))))
    s.jobs.cancel("j1")
    advance_job("j1")
    parts = s.jobs.status("j1").parts
    assert parts["d1"].state == PartState.cancelled  # its fine-tune was only queued: at once
    assert parts["d2"].state == PartState.finetuning and parts["d2"].cancel_requested_at is not None  # asked to stop
    assert parts["d3"].state == PartState.completed  # finished before: untouched
    assert s.jobs.attempt_write("j1", "d2", "a1") == Written.cancel
    s.jobs.apply("j1", "d2", AttemptCancelled(attempt="a1", reason="cancelled after 64 samples"))
    assert s.jobs.status("j1").state.value == "cancelled"

    s.jobs.apply("j1", "d1", Requeued())  # a part of a cancelled job runs again, and is not cancelled again
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued
    assert [t.name for t in queued_tasks(broker, device_queue("d1"))].count(TaskName.finetune.value) == 2  # the first, then this one


def dispatched(s) -> DevicePart:
    """The part of device d1 of a new job j1, its fine-tune dispatched."""
    register(s, "d1")
    store_resources(s, submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}]))
    advance_job("j1")
    return s.jobs.part("j1", "d1")


def test_a_dispatched_fine_tune_whose_message_is_lost_is_sent_again_under_its_token(s, broker) -> None:
    settings = context.settings()
    token = dispatched(s).dispatch.token
    (message,) = queued_tasks(broker, device_queue("d1"))
    assert message.id == token
    app = context.app()
    reap_once(s, app, settings)
    assert len(queued_tasks(broker, device_queue("d1"))) == 1  # queued: nothing to do
    broker.delete(device_queue("d1"))  # the message is lost (a crash between taking and running it)
    reap_once(s, app, settings)
    assert queued_tasks(broker, device_queue("d1")) == []  # not before a lease's time
    broker.zadd(s.keys.dispatched(), {"j1/d1": broker.time()[0] - settings.lease_ttl_s - 1})
    reap_once(s, app, settings)
    (again,) = queued_tasks(broker, device_queue("d1"))
    assert again.id == token and FinetuneRequest.model_validate(again.payload) == s.jobs.part("j1", "d1").dispatch.request
    assert "sent again" in s.jobs.status("j1").events[-1].message
    reap_once(s, app, settings)
    assert len(queued_tasks(broker, device_queue("d1"))) == 1  # once


def test_a_lost_fine_tune_attempt_lets_its_part_go_before_its_message_is_restored(s, broker) -> None:
    settings = context.settings()
    part = dispatched(s)
    s.jobs.apply("j1", "d1", AttemptStarted(dispatch=part.dispatch.token, digest=request_digest(part.dispatch.request),
                                            attempt="a1", node="device-d1@h"))  # fmt: skip
    lease = Lease(task_id=part.dispatch.token, task=TaskName.finetune.value, attempt="a1", node="device-d1@h", job_id="j1", device_id="d1")
    s.liveness.take(lease)
    broker.zadd(s.keys.leases(), {lease.task_id: broker.time()[0] - settings.lease_ttl_s - 1})  # its process stopped renewing
    reap_once(s, context.app(), settings)
    after = s.jobs.part("j1", "d1")
    assert after.attempt is None and after.state == PartState.queued and s.liveness.lease(lease.task_id) is None
    assert [e.kind for e in s.jobs.status("j1").events][-1] == EventKind.attempt_lost
    assert s.jobs.attempt_write("j1", "d1", "a1") == Written.stale  # the old attempt, if it wakes, writes nothing


def finished(part) -> RunReport:
    b, f = part.selection.batch_size, part.selection.frequency_hz
    return RunReport(device_id=part.device_id, device_type="twin", simulated=True, batch_size=b, frequency_hz=f, reached=True,
                     final_accuracy=0.9, samples_to_accuracy=100, samples_processed=128, steps=8, device_time_s=1.0, energy_j=1.0,
                     peak_power_w=3.0, wall_s=1.0)  # fmt: skip


def test_a_table_and_vector_that_no_longer_load_are_set_aside_with_an_event_and_produced_again(s, broker) -> None:
    register(s, "d1")
    spec = submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}])
    store_resources(s, spec)
    vkey = vector_key(spec.estimation_request())
    broker.set(s.keys.table(TID), b'{"batch_sizes": [4]}')  # an older or hand-edited format
    broker.set(s.keys.vector(vkey), b"{not json")
    advance_job("j1")
    events = s.jobs.status("j1").events
    assert [e.kind for e in events] == [EventKind.submitted, EventKind.set_aside, EventKind.set_aside, EventKind.profiling,
                                        EventKind.estimating]  # fmt: skip
    assert f"edgetrain:table:{TID} no longer loads (frequencies_hz: Field required" in events[1].message
    assert f"set aside under edgetrain:set-aside:table:{TID}:" in events[1].message
    assert f"edgetrain:vector:{vkey} no longer loads (Invalid JSON" in events[2].message
    (profile,) = queued_tasks(broker, device_queue("d1"))
    request = ProfileRequest.model_validate(profile.payload)
    assert request.batch_sizes == B and not request.merge  # the whole table, profiled again
    (estimate,) = queued_tasks(broker, SERVER_QUEUE)
    assert EstimationRequest.model_validate(estimate.payload) == spec.estimation_request()
    assert [r.key for r in s.resources.set_asides()] == [s.keys.table(TID), s.keys.vector(vkey)]


def test_a_part_re_queued_after_its_table_failed_tries_again_instead_of_failing_on_the_old_failure(s, broker) -> None:
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    advance_job("j1")
    fail_resource(table_resource(TID), "profiling on d1 was revoked by an operator")
    advance_job("j1")
    assert s.jobs.status("j1").state == JobState.failed
    s.jobs.apply("j1", "d1", Requeued())
    broker.delete(device_queue("d1"))
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.profiling  # profiled again, not failed with the old reason
    assert [t.name for t in queued_tasks(broker, device_queue("d1"))] == [TaskName.profile_device.value]


def test_a_profile_whose_message_redis_lost_is_sent_again_under_its_task_id(s, broker) -> None:
    settings = context.settings()
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    advance_job("j1")
    (profile,) = queued_tasks(broker, device_queue("d1"))
    [sent] = [t for t in s.ledger.unseen_since(broker.time()[0] + 1, 10) if t.task_id == profile.id]
    assert sent.task == TaskName.profile_device.value and sent.queue == device_queue("d1")
    broker.delete(device_queue("d1"))  # popped by a worker just before Redis died: on no queue, in no worker
    reap_once(s, context.app(), settings)
    assert queued_tasks(broker, device_queue("d1")) == []  # not before a lease's time
    broker.zadd(s.keys.sent_tasks(), {profile.id: broker.time()[0] - settings.lease_ttl_s - 1})
    reap_once(s, context.app(), settings)
    (again,) = queued_tasks(broker, device_queue("d1"))
    assert again.id == profile.id and again.payload == profile.payload
    s.ledger.done(profile.id)  # it ran
    assert profile.id not in {t.task_id for t in s.ledger.unseen_since(broker.time()[0] + 1, 10)}


def test_a_job_no_control_worker_took_up_is_started_again(s, broker) -> None:
    settings = context.settings()
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])  # its advance_job message is lost
    reap_once(s, context.app(), settings)
    assert queued_tasks(broker, "control") == []  # not before a lease's time
    broker.zadd(s.keys.unplanned(), {"j1": broker.time()[0] - settings.lease_ttl_s - 1})
    reap_once(s, context.app(), settings)
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.advance_job.value, "j1")]
    advance_job("j1")
    assert s.jobs.unplanned(broker.time()[0] + 10**6, 10) == []  # taken up: nothing more to remind


def test_a_planning_step_reads_its_part_device_table_vector_and_failure_in_three_commands(s, broker, monkeypatch) -> None:
    from redis.connection import AbstractConnection

    register(s, "d1")
    store_resources(s, submit(s, "j0", [{"device_id": "d1", "power_cap_w": 4.0}]))
    advance_job("j0")  # scripts loaded, the broker's queue declared
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 4.0}])
    sent: list[str] = []  # the commands sent, alone or in pipelines
    one, many = AbstractConnection.send_command, AbstractConnection.pack_commands
    monkeypatch.setattr(AbstractConnection, "send_command", lambda self, *args, **kw: sent.append(str(args[0])) or one(self, *args, **kw))
    monkeypatch.setattr(AbstractConnection, "pack_commands", lambda self, cmds: sent.extend(str(c[0]) for c in cmds) or many(self, cmds))
    advance_job("j1")
    monkeypatch.undo()
    assert s.jobs.part("j1", "d1").state == PartState.queued
    # the record and its unplanned mark; the part and the device; the table and the vector; the table's failure
    assert [c for c in sent if c in ("GET", "ZREM", "MGET")] == ["GET", "ZREM", "MGET", "MGET", "MGET"], sent


def ring(s, job_id: str, device_id: str) -> int:
    """Submit a job as the client does, ringing the planning doorbell; how many rang it."""
    return s.jobs.create(job_id, JobSpec.model_validate(quick_job([{"device_id": device_id, "power_cap_w": 4.0}], batch_sizes=B)),
                         ring_for_s=20.0)  # fmt: skip


def test_jobs_submitted_together_are_taken_up_by_one_planning_step_that_reads_them_in_four_commands(s, broker, monkeypatch) -> None:
    from redis.connection import AbstractConnection

    for i in range(4):
        register(s, f"d{i}")
    store_resources(s, submit(s, "j0", [{"device_id": "d0", "power_cap_w": 4.0}]))
    advance_job("j0")  # scripts loaded, the broker's queue declared
    assert [ring(s, f"j{i}", f"d{i}") for i in (1, 2, 3)] == [1, 2, 3]  # the first rang: only it sends a step
    sent: list[str] = []  # the commands sent, alone or in pipelines
    one, many = AbstractConnection.send_command, AbstractConnection.pack_commands
    monkeypatch.setattr(AbstractConnection, "send_command", lambda self, *args, **kw: sent.append(str(args[0])) or one(self, *args, **kw))
    monkeypatch.setattr(AbstractConnection, "pack_commands", lambda self, cmds: sent.extend(str(c[0]) for c in cmds) or many(self, cmds))
    assert plan_submitted("j1") == "took up 3 job(s): j1 advanced, j2 advanced, j3 advanced"
    monkeypatch.undo()
    assert [s.jobs.part(f"j{i}", f"d{i}").state for i in (1, 2, 3)] == [PartState.queued] * 3
    assert [len(queued_tasks(broker, device_queue(f"d{i}"))) for i in (1, 2, 3)] == [1, 1, 1]
    # the records; the parts and devices; the tables and vectors; the tables' failures; then the three struck off at once
    assert [c for c in sent if c in ("GET", "ZREM", "MGET")] == ["MGET", "MGET", "MGET", "MGET", "ZREM"], sent
    assert s.jobs.unplanned(broker.time()[0] + 10**6, 10) == []
    assert ring(s, "j4", "d3") == 1  # the step answered the doorbell: the next job rings it again


def test_a_job_whose_step_fails_in_a_planning_step_is_left_to_the_reaper_and_the_others_are_taken_up(s, broker) -> None:
    register(s, "d1"), register(s, "d2")
    store_resources(s, submit(s, "j0", [{"device_id": "d1", "power_cap_w": 4.0}]))
    s.jobs.planned(["j0"])
    ring(s, "j1", "d1"), ring(s, "j2", "d2")
    broker.delete(s.keys.part("j1", "d1"))  # written past the client: its step fails
    broker.delete("control")
    assert plan_submitted("j1") == "took up 1 job(s): j2 advanced"
    assert s.jobs.part("j2", "d2").state == PartState.queued
    assert s.jobs.unplanned(broker.time()[0] + 10**6, 10) == ["j1"]  # a lease after its submission, the reaper starts it alone
    broker.zadd(s.keys.unplanned(), {"j1": broker.time()[0] - context.settings().lease_ttl_s - 1})
    reap_once(s, context.app(), context.settings())
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.advance_job.value, "j1")]


def test_a_full_planning_step_sends_the_next_which_takes_up_the_jobs_after_its_own(s, broker, monkeypatch) -> None:
    monkeypatch.setattr(workflow, "PLAN_BATCH", 2)
    for i in (1, 2, 3):
        register(s, f"d{i}")
    store_resources(s, submit(s, "j0", [{"device_id": "d1", "power_cap_w": 4.0}]))
    s.jobs.planned(["j0"])
    for i in (1, 2, 3):
        ring(s, f"j{i}", f"d{i}")
    broker.delete("control")
    assert plan_submitted("j1") == "took up 2 job(s): j1 advanced, j2 advanced"
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.plan_submitted.value, "j1")]
    assert plan_submitted("j1") == "took up 1 job(s): j3 advanced"
    assert s.jobs.unplanned(broker.time()[0] + 10**6, 10) == []


def test_a_planning_step_out_of_time_strikes_off_the_jobs_it_did_and_is_sent_again(s, broker, monkeypatch) -> None:
    register(s, "d1"), register(s, "d2")
    store_resources(s, submit(s, "j0", [{"device_id": "d1", "power_cap_w": 4.0}]))
    s.jobs.planned(["j0"])
    ring(s, "j1", "d1"), ring(s, "j2", "d2")
    broker.delete("control")
    planned = workflow.plan

    def out_of_time_at_j2(view):
        if view.job_id == "j2":
            raise SoftTimeLimitExceeded()
        return planned(view)

    monkeypatch.setattr(workflow, "plan", out_of_time_at_j2)
    with pytest.raises(SoftTimeLimitExceeded):
        plan_submitted("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued and s.jobs.part("j2", "d2").state == PartState.pending
    assert s.jobs.unplanned(broker.time()[0] + 10**6, 10) == ["j2"]
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.plan_submitted.value, "j1")]


def test_a_late_step_of_a_finished_job_reads_no_table(s, broker) -> None:
    """A step that comes after every part finished (a wake-up that lagged) leaves the tables
    alone: a table that no longer loads is set aside by the next job that needs it, which says so."""
    register(s, "d1")
    store_resources(s, submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}]))
    workflow.report("j1", "d1", Failed(reason="its device is gone"))
    broken = b'{"batch_sizes": [16]}'
    broker.set(s.keys.table(TID), broken)
    advance_job("j1")
    assert EventKind.set_aside not in kinds(s, "j1") and broker.get(s.keys.table(TID)) == broken
    submit(s, "j2", [{"device_id": "d1", "power_cap_w": 5.0}])
    advance_job("j2")
    assert EventKind.set_aside in kinds(s, "j2") and broker.get(s.keys.table(TID)) is None


def test_a_step_out_of_time_fails_no_part_and_is_sent_again(s, broker, monkeypatch) -> None:
    """The soft time limit (Redis slow, say) lands while a part is planned: that part is not
    failed for it, and the step is sent again to plan what it had not."""
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    broker.delete("control")

    def out_of_time(view):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(workflow, "plan", out_of_time)
    with pytest.raises(SoftTimeLimitExceeded):
        advance_job("j1")
    assert s.jobs.status("j1").parts["d1"].state == PartState.pending
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.advance_job.value, "j1")]
    with pytest.raises(SoftTimeLimitExceeded):
        advance_page(JobPage(job_id="j1", page=0))
    assert s.jobs.status("j1").parts["d1"].state == PartState.pending
    assert [t.name for t in queued_tasks(broker, "control")] == [TaskName.advance_job.value, TaskName.advance_page.value]


def test_a_job_whose_lost_task_has_no_message_left_is_advanced_by_the_reaper(s, broker) -> None:
    """The server worker running a job's proxy run died and its message was acknowledged already
    (its hard time limit, say): the reaper sends the job's step again instead of leaving its parts."""
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    broker.delete("control")
    s.liveness.take(Lease(task_id="t1", task=TaskName.train_proxy.value, attempt="a1", node="server-0@gone", queue="server", job_id="j1"))
    broker.zadd(s.keys.leases(), {"t1": 0})  # not renewed for long
    reap_once(s, context.app(), context.settings())
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.advance_job.value, "j1")]
    assert s.liveness.lease("t1") is None


def test_a_lease_renewed_after_the_reaper_listed_it_is_not_handed_on(s, broker) -> None:
    """Devices back from a network blip renew their leases while a long pass works through the
    list: a run that renewed is left running."""
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    lease = Lease(task_id="t1", task=TaskName.train_proxy.value, attempt="a1", node="server-0@back", queue="server", job_id="j1")
    s.liveness.take(lease)
    broker.zadd(s.keys.leases(), {"t1": 0})
    (listed,) = s.liveness.expired(context.settings().lease_ttl_s)
    s.liveness.renew({"t1": "a1"})  # renewed meanwhile
    broker.delete("control")
    assert not hand_on(s, context.app(), context.settings(), listed)
    assert s.liveness.lease("t1") == lease and queued_tasks(broker, "control") == []


def test_a_lost_task_whose_message_a_worker_takes_before_its_lease_is_reaped_is_handed_on_and_said_so(s, broker, monkeypatch) -> None:
    """An idle server worker takes the message put back at once, and its new run takes the
    lease before the reaper removes the old one: the hand-on is said in the job's events and
    counted all the same, and the new run's lease is left alone."""
    register(s, "d1")
    submit(s, "j1", [{"device_id": "d1", "power_cap_w": 5.0}])
    lease = Lease(task_id="t1", task=TaskName.train_proxy.value, attempt="a1", node="server-0@gone", queue="server", job_id="j1")
    s.liveness.take(lease)
    broker.zadd(s.keys.leases(), {"t1": 0})
    again = lease.model_copy(update={"attempt": "a2", "node": "server-0@back"})

    def put_back_and_taken_at_once(_app, task_id: str) -> bool:
        s.liveness.take(again)
        return task_id == "t1"

    monkeypatch.setattr(reaper, "restore_message", put_back_and_taken_at_once)
    assert hand_on(s, context.app(), context.settings(), lease)
    assert s.liveness.lease("t1") == again
    assert [e.kind for e in s.jobs.status("j1").events][-1] == EventKind.attempt_lost
    assert s.monitoring.counts("handed_on") == {"server": 1}
