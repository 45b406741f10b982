"""Claims on a table or vector when a process stops midway, in this process against a real Redis:
a control process that stops after it claimed a resource, a producer that stops after it
released the claim, and a claim that expired. Each time the jobs waiting on the resource move
on: through the ledger of sent tasks, or the reaper's wake-up of jobs nobody produces for."""

import random
from collections.abc import Callable

import pytest
from redis.connection import AbstractConnection

from edgetrain.common.jobs.state import PartState
from edgetrain.common.keys import table_id, table_resource, vector_key, vector_resource
from edgetrain.common.payloads import ProfileRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, EstimationRequest, JobSpec, RelationVector, TrainingOutcome
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.common.testing.tables import B, F, random_monotone_table
from edgetrain.tasks import context
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName, device_queue
from edgetrain.tasks.reaper import reap_once
from edgetrain.tasks.server import aggregate_when_complete, grid
from edgetrain.tasks.workflow import advance_job, notify_waiters

SHAPE = [1, 28, 28]
TID = table_id("twin", "smallcnn", SHAPE)


class Died(BaseException):
    """The process stopped here (no `except Exception` of the code under test catches it)."""


@pytest.fixture
def die_after(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], None]:
    """`die_after(command, key)`: the process stops (raises Died) at the first Redis command it
    sends after one that runs `command` on `key`, alone or in a transaction, was sent; the
    commands after it run normally again."""

    def arm(command: str, key: str) -> None:
        state = {"armed": False}
        one, many = AbstractConnection.send_command, AbstractConnection.pack_commands

        def check(commands: list[tuple]) -> None:
            if state["armed"]:
                monkeypatch.undo()
                raise Died(f"stopped after {command} {key}")
            state["armed"] = any(str(c[0]).upper() == command and key in map(str, c[1:]) for c in commands)

        monkeypatch.setattr(AbstractConnection, "send_command", lambda self, *args, **kw: check([args]) or one(self, *args, **kw))
        monkeypatch.setattr(AbstractConnection, "pack_commands", lambda self, cmds: check(list(cmds)) or many(self, cmds))

    return arm


def job_needing(s, missing: str) -> JobSpec:
    """Job j1 on device d1, with the table or the vector (whichever is not `missing`) stored."""
    s.fleet.register(DeviceInfo(device_id="d1", device_type="twin", backend="sim", frequencies_hz=F, memory_bytes=1, simulated=True),
                     ttl_s=60, instance="test")  # fmt: skip
    spec = JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0}], batch_sizes=B))
    s.jobs.create("j1", spec)
    if missing != "table":
        put_table(s)
    if missing != "vector":
        put_vector(s, spec.estimation_request())
    return spec


def put_table(s) -> None:
    table = random_monotone_table(random.Random(0), time_noise=False)
    s.resources.put_table(table.model_copy(update={"device_type": "twin", "model": "smallcnn", "input_shape": SHAPE}))


def put_vector(s, request: EstimationRequest) -> None:
    s.resources.put_vector(RelationVector(batch_sizes=B, ratios=[0.3, 0.4, 0.5, 0.7, 0.8, 1.0], key=vector_key(request)))


def resource_of(spec: JobSpec, missing: str) -> str:
    """The coordination name of the table or the vector of job j1."""
    return vector_resource(vector_key(spec.estimation_request())) if missing == "vector" else table_resource(TID)


def a_lease_later(broker, key: str) -> None:
    """Every entry of the zset `key` was last seen more than a lease ago."""
    old = broker.time()[0] - context.settings().lease_ttl_s - 1
    members = broker.zrange(key, 0, -1)
    if members:
        broker.zadd(key, dict.fromkeys(members, old))


@pytest.mark.parametrize("missing", ["table", "vector"])
def test_a_control_process_that_stops_right_after_it_claimed_leaves_the_producing_task_to_the_reaper(
    s, broker, die_after, missing
) -> None:  # fmt: skip
    """Before, the claim was written alone: the step, run again, lost its own claim, no task
    produced the resource and the job waited for good (the claim expires after 6 h)."""
    spec = job_needing(s, missing)
    resource = resource_of(spec, missing)
    die_after("SET", s.keys.claim(resource))
    with pytest.raises(Died):
        advance_job("j1")
    advance_job("j1")  # the step runs again (its message is redelivered): the claim is held
    a_lease_later(broker, s.keys.sent_tasks())
    reap_once(s, context.app(), context.settings())
    if missing == "table":
        (profile,) = queued_tasks(broker, device_queue("d1"))
        assert profile.name == TaskName.profile_device.value
        assert ProfileRequest.model_validate(profile.payload).owner == s.coordination.holder(resource)
        put_table(s)
    else:
        (estimate,) = queued_tasks(broker, SERVER_QUEUE)
        assert estimate.name == TaskName.estimate_relation_vector.value
        put_vector(s, spec.estimation_request())
    assert notify_waiters(resource)  # produced: the job moves on
    assert [t.payload for t in queued_tasks(broker, CONTROL_QUEUE)] == ["j1"]
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued


def test_a_producer_that_stops_right_after_it_released_the_claim_leaves_the_wake_ups_to_the_reaper(s, broker, die_after) -> None:
    """The last proxy run stores the vector and stops after releasing its claim. Before, the
    release and the wake-ups were separate writes: nobody woke the job, and a proxy run sent
    again is refused (its estimation is done)."""
    spec = job_needing(s, "vector")
    advance_job("j1")  # claims the vector and sends its estimation
    (estimate,) = queued_tasks(broker, SERVER_QUEUE)
    s.ledger.done(estimate.id)  # it ran: the request is recorded and every proxy run is in
    request = spec.estimation_request()
    s.resources.put_vector_request(request)
    for b, seed in grid(request):
        n = 1000 + 10 * b
        s.resources.put_vector_part(vector_key(request), TrainingOutcome(batch_size=b, seed=seed, samples_to_accuracy=n, reached=True,
                                                                         final_accuracy=0.9, samples_processed=n, evaluations=3, wall_s=1.0))  # fmt: skip
    die_after("DEL", s.keys.claim(resource_of(spec, "vector")))
    with pytest.raises(Died):
        aggregate_when_complete(request)
    assert s.resources.vector(vector_key(request)) is not None and s.coordination.holder(resource_of(spec, "vector")) is None
    a_lease_later(broker, s.keys.sent_tasks())
    reap_once(s, context.app(), context.settings())
    assert [(t.name, t.payload) for t in queued_tasks(broker, CONTROL_QUEUE)] == [(TaskName.advance_job.value, "j1")]
    advance_job("j1")
    assert s.jobs.part("j1", "d1").state == PartState.queued


def test_the_jobs_waiting_on_a_resource_nobody_claims_are_woken_once_a_lease(s, broker) -> None:
    """The claim expired (its producer never settled it, CLAIM_TTL_S later): the reaper wakes
    the jobs waiting on it, which claim it again; a resource still claimed is left alone."""
    spec = job_needing(s, "table")
    resource = resource_of(spec, "table")
    advance_job("j1")  # claims the table and sends its profile
    broker.delete(device_queue("d1"))
    a_lease_later(broker, s.keys.waiting())
    reap_once(s, context.app(), context.settings())
    assert queued_tasks(broker, CONTROL_QUEUE) == []  # claimed: its producer wakes the job
    assert broker.zscore(s.keys.waiting(), resource) > broker.time()[0] - 10  # looked at again a lease later
    for sent in s.ledger.unseen_since(float("inf"), 10):
        s.ledger.done(sent.task_id)  # the profile ran and stopped before it settled the claim
    broker.delete(s.keys.claim(resource))  # which expired
    reap_once(s, context.app(), context.settings())
    assert queued_tasks(broker, CONTROL_QUEUE) == []  # not before a lease
    a_lease_later(broker, s.keys.waiting())
    reap_once(s, context.app(), context.settings())
    reap_once(s, context.app(), context.settings())
    assert [(t.name, t.payload) for t in queued_tasks(broker, CONTROL_QUEUE)] == [(TaskName.advance_job.value, "j1")]  # once
    advance_job("j1")  # plans again: claims the table anew and profiles it
    (profile,) = queued_tasks(broker, device_queue("d1"))
    assert ProfileRequest.model_validate(profile.payload).owner == s.coordination.holder(resource)
