"""Tasks stopped from outside their code (tasks/stopped.py), every kind, in this process against
a real Redis: what a revoked or terminated task leaves, and the queue messages it sends."""

from types import SimpleNamespace

import pytest
from billiard.exceptions import TimeLimitExceeded, WorkerLostError

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import AttemptLost, AttemptStopped, Dispatched, Identified, Requeued
from edgetrain.common.jobs.state import PartState
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.payloads import JobPage, ProfileRequest, ProxyRunRequest, profile_resource
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, JobSpec, Selection
from edgetrain.common.store import Lease
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.common.testing.parts import drive_part
from edgetrain.common.testing.tables import F
from edgetrain.tasks.contract import TaskName
from edgetrain.tasks.stopped import on_lost_child, on_revoked
from edgetrain.tasks.workflow import advance_job

CHOICE = Selection(batch_size=16, frequency_hz=900, estimated_time_s=1.0, peak_power_w=4.0)
HERE = "device-d1@h:100"  # the worker instance (node:pid of its main process) told of the stopped tasks


def revoke(task: TaskName, payload, task_id: str = "t1", terminated: bool = False) -> None:
    on_revoked(sender=SimpleNamespace(name=task.value), request=SimpleNamespace(id=task_id, args=[payload]), terminated=terminated,
               signum=15 if terminated else None, instance=HERE)  # fmt: skip


def lost_child(task: TaskName, payload, task_id: str) -> None:
    on_lost_child(sender=SimpleNamespace(name=task.value), task_id=task_id, exception=WorkerLostError("signal 9"), args=(payload,),
                  instance=HERE)  # fmt: skip


def job(s, job_id: str = "j1") -> JobSpec:
    spec = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0}]))
    s.jobs.create(job_id, spec)
    return spec


def test_a_fine_tune_revoked_before_it_ran_cancels_its_part(s) -> None:
    job(s)
    part = drive_part(s, "j1", "d1", PartState.finetuning, selection=CHOICE, attempt="a1")
    s.jobs.apply("j1", "d1", AttemptLost(attempt="a1", outcome="re-queued"))  # queued again, no attempt runs it
    revoke(TaskName.finetune, part.dispatch.request.model_dump(mode="json"), task_id=part.dispatch.token)
    after = s.jobs.part("j1", "d1")
    assert after.state == PartState.cancelled and "was revoked before it ran" in after.reason


def test_a_running_fine_tune_terminated_cancels_its_part_and_keeps_its_checkpoint(s) -> None:
    job(s)
    part = drive_part(s, "j1", "d1", PartState.finetuning, selection=CHOICE, attempt="a1")
    s.liveness.take(Lease(task_id=part.dispatch.token, task=TaskName.finetune.value, attempt="a1", node="device-d1@h", instance=HERE,
                          job_id="j1", device_id="d1"))  # fmt: skip
    revoke(TaskName.finetune, part.dispatch.request.model_dump(mode="json"), task_id=part.dispatch.token, terminated=True)
    after = s.jobs.part("j1", "d1")
    assert after.state == PartState.cancelled and "terminated by an operator (SIGTERM" in after.reason
    assert "`edgetrain requeue` continues from it" in after.reason and s.liveness.lease(part.dispatch.token) is None


def test_a_terminated_fine_tune_that_stopped_itself_first_is_still_cancelled_as_terminated(s) -> None:
    # Terminate's SIGTERM reaches the pool process, which checkpoints, stops its attempt and puts
    # its message back before the main process reports the termination: the part is cancelled
    # with what the operator did (before, the attempt was gone, the report was refused, and the
    # re-delivered message, discarded as revoked, cancelled it as "revoked before it ran")
    job(s)
    part = drive_part(s, "j1", "d1", PartState.finetuning, selection=CHOICE, attempt="a1")
    s.liveness.take(Lease(task_id=part.dispatch.token, task=TaskName.finetune.value, attempt="a1", node="device-d1@h", instance=HERE,
                          job_id="j1", device_id="d1"))  # fmt: skip
    s.jobs.apply("j1", "d1", AttemptStopped(attempt="a1", reason="its worker is shutting down: checkpointed and stopped"))
    payload = part.dispatch.request.model_dump(mode="json")
    revoke(TaskName.finetune, payload, task_id=part.dispatch.token, terminated=True)
    revoke(TaskName.finetune, payload, task_id=part.dispatch.token)  # the message put back, discarded on receipt
    after = s.jobs.part("j1", "d1")
    assert after.state == PartState.cancelled and "terminated by an operator (SIGTERM" in after.reason, after.reason
    assert "`edgetrain requeue` continues from it" in after.reason


def test_news_of_a_stopped_fine_tune_that_arrives_after_its_part_was_requeued_changes_nothing(s) -> None:
    # the terminated task's message, put back on the queue, is discarded as revoked after the
    # operator re-queued the part; or its process's death is reported late: the part, dispatched
    # anew, goes on (before, a late Failed or Cancelled ended the re-queued part)
    job(s)
    part = drive_part(s, "j1", "d1", PartState.finetuning, selection=CHOICE, attempt="a1")
    old = part.dispatch.token
    s.liveness.take(Lease(task_id=old, task=TaskName.finetune.value, attempt="a1", node="device-d1@h", instance=HERE, job_id="j1",
                          device_id="d1"))  # fmt: skip
    revoke(TaskName.finetune, part.dispatch.request.model_dump(mode="json"), task_id=old, terminated=True)
    s.jobs.apply("j1", "d1", Requeued())
    identity = Identified(device_type="jetson-nano", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)
    s.jobs.apply("j1", "d1", Dispatched(device=identity, token="new-task", request=part.dispatch.request, selection=CHOICE,
                                        estimated_time_to_accuracy_s=None))  # fmt: skip
    revoke(TaskName.finetune, part.dispatch.request.model_dump(mode="json"), task_id=old)
    lost_child(TaskName.finetune, part.dispatch.request.model_dump(mode="json"), old)
    after = s.jobs.part("j1", "d1")
    assert after.state == PartState.queued and after.dispatch.token == "new-task", (after.state, after.reason)


def queued_profile(s, broker):
    """Job j1's first step on a registered device d1: the profile it queued (the control queue emptied)."""
    s.fleet.register(DeviceInfo(device_id="d1", device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True),
                     ttl_s=60, instance="test")  # fmt: skip
    job(s)
    advance_job("j1")
    (profile,) = queued_tasks(broker, "device.d1")
    broker.delete("control")
    return profile


def test_a_revoked_profile_fails_its_table_for_the_jobs_waiting_and_a_revoked_job_step_is_sent_again(s, broker) -> None:
    profile = queued_profile(s, broker)
    revoke(TaskName.profile_device, profile.payload, task_id=profile.id)
    failure = s.coordination.failure(profile_resource(ProfileRequest.model_validate(profile.payload)))
    assert failure is not None and "was revoked before it ran" in failure.reason and failure.for_job("j1")
    assert [t.payload for t in queued_tasks(broker, "control")] == ["j1"]  # the waiting job is woken: it fails with the reason
    broker.delete("control")
    revoke(TaskName.advance_job, "j1")
    revoke(TaskName.advance_page, {"job_id": "j1", "page": 0})
    sent = queued_tasks(broker, "control")
    assert [(t.name, t.payload) for t in sent] == [(TaskName.advance_job.value, "j1"),
                                                   (TaskName.advance_page.value, JobPage(job_id="j1", page=0).model_dump())]  # fmt: skip


def test_a_revoked_proxy_run_or_estimation_fails_the_vector_with_the_reason(s) -> None:
    spec = job(s)
    request = spec.estimation_request()
    resource = vector_resource(vector_key(request))
    s.coordination.claim(resource, "j1")
    revoke(TaskName.train_proxy, ProxyRunRequest(request=request, batch_size=16, seed=0).model_dump(mode="json"), terminated=True)
    failure = s.coordination.failure(resource)
    assert failure is not None and failure.reason.startswith("proxy training b=16 seed=0 was terminated by an operator")
    assert s.coordination.holder(resource) is None and failure.for_job("j1")
    s.coordination.claim(resource, "j1")
    revoke(TaskName.estimate_relation_vector, request.model_dump(mode="json"))
    assert s.coordination.failure(resource).reason == "relation vector estimation was revoked before it ran"


@pytest.mark.parametrize("exception", [WorkerLostError("signal 9"), TimeLimitExceeded(300)])
def test_a_job_step_whose_process_died_or_hit_its_hard_time_limit_is_sent_again(s, broker, exception) -> None:
    """Celery acknowledges the message of a task whose pool child died or was killed at its hard
    time limit: the step's parts not planned yet would wait for good."""
    job(s)
    on_lost_child(sender=SimpleNamespace(name=TaskName.advance_job.value), task_id="t1", exception=exception, args=("j1",), instance=HERE)
    on_lost_child(sender=SimpleNamespace(name=TaskName.advance_page.value), task_id="t2", exception=exception,
                  args=({"job_id": "j1", "page": 1},), instance=HERE)  # fmt: skip
    assert [(t.name, t.payload) for t in queued_tasks(broker, "control")] == [(TaskName.advance_job.value, "j1"),
                                                                              (TaskName.advance_page.value, {"job_id": "j1", "page": 1})]  # fmt: skip


@pytest.mark.parametrize("news", ["lost child", "revoked"])
def test_a_task_handed_on_to_another_worker_is_left_to_it_when_the_first_worker_hears_it_stopped(s, news) -> None:
    """This worker froze; its fine-tune was handed on and another worker's run of it holds the
    lease now. This worker wakes, and its pool child dies (or the copy of the message it took
    is discarded as revoked): the other worker's run goes on, its lease kept. Before, this
    worker released that lease and failed (or cancelled) the part with that run's attempt."""
    job(s)
    part = drive_part(s, "j1", "d1", PartState.finetuning, selection=CHOICE, attempt="c1")
    token, payload = part.dispatch.token, part.dispatch.request.model_dump(mode="json")
    s.liveness.take(Lease(task_id=token, task=TaskName.finetune.value, attempt="c1", node="device-d1@c", instance="device-d1@c:7",
                          job_id="j1", device_id="d1"))  # fmt: skip
    if news == "lost child":
        lost_child(TaskName.finetune, payload, token)
    else:
        revoke(TaskName.finetune, payload, task_id=token)
    after = s.jobs.part("j1", "d1")
    assert after.state == PartState.finetuning and after.attempt.token == "c1", (after.state, after.reason)
    assert s.liveness.lease(token).instance == "device-d1@c:7"


def test_a_profile_whose_child_died_here_fails_its_table_for_the_jobs_waiting(s, broker) -> None:
    profile = queued_profile(s, broker)
    s.liveness.take(Lease(task_id=profile.id, task=TaskName.profile_device.value, attempt="p1", node="device-d1@h", instance=HERE,
                          payload=profile.payload))  # fmt: skip
    lost_child(TaskName.profile_device, profile.payload, profile.id)
    failure = s.coordination.failure(profile_resource(ProfileRequest.model_validate(profile.payload)))
    assert failure is not None and "its process died" in failure.reason and failure.for_job("j1")
    assert s.liveness.lease(profile.id) is None and [t.payload for t in queued_tasks(broker, "control")] == ["j1"]
