"""The client's protocol for tables and vectors (`EdgeTrainClient.profile`, `request_vector`)
and its reuse of pre-trained weights, against a real Redis: what it claims, which task
messages it leaves in the broker queues, and what it waits for."""

import time

import celery.exceptions
import pytest
import redis

from edgetrain.common.keys import table_id, table_resource, vector_key, vector_resource
from edgetrain.common.payloads import PretrainRequest, PretrainResult
from edgetrain.common.presets import quick_job
from edgetrain.common.redis_health import RedisUnsafe
from edgetrain.common.schemas import DeviceInfo, EstimationRequest, LearningRatePolicy, ProfileTable, ProfilingOptions, RelationVector
from edgetrain.common.store.jobs import PLAN_EARLY_AT
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks import client as client_module
from edgetrain.tasks.client import EdgeTrainClient, ResourceFailed
from edgetrain.tasks.contract import CONTROL_QUEUE, SERVER_QUEUE, TaskName, device_queue

DEVICE = DeviceInfo(device_id="nano-3", device_type="twin", backend="sim", frequencies_hz=[100, 200], memory_bytes=1, simulated=True)
TID = table_id("twin", "smallcnn", [1, 28, 28])
REQUEST = EstimationRequest(model="smallcnn", weights="init:0", proxy_dataset={"name": "digits"}, target_accuracy=0.9,
                            batch_sizes=[16, 64], seeds=[0, 1], lr=LearningRatePolicy(), eval_every_samples=128, max_samples=5000)  # fmt: skip


@pytest.fixture
def broker(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    return client


@pytest.fixture
def client(redis_server, broker) -> EdgeTrainClient:
    return EdgeTrainClient(redis_server.url)


def table(**changes) -> ProfileTable:
    base = dict(batch_sizes=[16, 64], frequencies_hz=[100, 200], samples=64, time_s=[[2.0, 1.0], [1.5, 0.8]],
                peak_power_w=[[2.0, 3.0], [2.5, 3.5]], device_type="twin", model="smallcnn", input_shape=[1, 28, 28])  # fmt: skip
    return ProfileTable(**(base | changes))


def test_profile_claims_the_table_and_sends_its_profiling_to_the_devices_queue(client, broker) -> None:
    old = table()
    client.store.resources.put_table(old)
    pending = client.profile(DEVICE, "smallcnn", [16, 64], ProfilingOptions(mode="staircase"), 3.0, merge=True)
    assert pending.dispatched and pending.resource == table_resource(TID)
    assert client.store.coordination.holder(pending.resource) == pending.holder
    [task] = queued_tasks(broker, device_queue("nano-3"))
    assert task.name == TaskName.profile_device.value
    assert task.payload["owner"] == pending.holder and task.payload["merge"] is True
    assert (task.payload["batch_sizes"], task.payload["power_cap_w"], task.payload["options"]["mode"]) == ([16, 64], 3.0, "staircase")
    assert pending.ready() is None  # the table stored before does not count
    new = table(time_s=[[2.1, 1.1], [1.6, 0.9]])
    client.store.resources.put_table(new)
    assert pending.wait(timeout_s=5) == new


def test_profile_waits_for_the_holder_of_the_claim_and_reports_its_failure(client, broker) -> None:
    assert client.store.coordination.claim(table_resource(TID), "job-7/abc")
    pending = client.profile(DEVICE, "smallcnn")
    assert not pending.dispatched and pending.holder == "job-7/abc"
    assert queued_tasks(broker, device_queue("nano-3")) == []
    client.store.coordination.settle(table_resource(TID), lambda jobs: [], reason="profiling on nano-3 failed: boom")
    with pytest.raises(ResourceFailed, match="boom"):
        pending.ready()


def test_request_vector_sends_one_estimation_and_later_requests_wait_for_it(client, broker) -> None:
    key = vector_key(REQUEST)
    first = client.request_vector(REQUEST)
    second = client.request_vector(REQUEST)
    assert first.dispatched and not second.dispatched and second.holder == first.holder
    [task] = queued_tasks(broker, SERVER_QUEUE)
    assert task.name == TaskName.estimate_relation_vector.value and EstimationRequest.model_validate(task.payload) == REQUEST
    assert first.ready() is None
    vector = RelationVector(batch_sizes=[16, 64], ratios=[0.5, 1.0], key=key)
    client.store.resources.put_vector(vector)
    assert first.wait(timeout_s=5) == second.wait(timeout_s=5) == vector
    stored = client.request_vector(REQUEST)
    assert not stored.dispatched and stored.holder is None and stored.ready() == vector
    assert len(queued_tasks(broker, SERVER_QUEUE)) == 1


def test_request_vector_reports_the_failure_of_its_estimation(client, broker) -> None:
    pending = client.request_vector(REQUEST)
    client.store.coordination.settle(
        vector_resource(vector_key(REQUEST)), lambda jobs: [], reason="relation vector estimation failed (b=16, seed=0): boom"
    )
    with pytest.raises(ResourceFailed, match="b=16, seed=0"):
        pending.wait(timeout_s=5)


def test_weights_pretrained_for_an_identical_request_are_reused_without_a_task(client, broker) -> None:
    request = PretrainRequest(model="smallcnn", dataset={"name": "digits"}, samples=1000, batch_size=32)
    result = PretrainResult(weights="artifact:smallcnn-digits-1000-abc.pt#sha256=" + "0" * 64, test_accuracy=0.5)
    client.store.resources.put_pretrained(request, result)
    assert client.pretrain("smallcnn", {"name": "digits"}, 1000, timeout_s=1, batch_size=32) == result
    assert queued_tasks(broker, SERVER_QUEUE) == []
    assert client.store.resources.pretrained(request.model_copy(update={"samples": 2000})) is None


def test_only_an_awaited_task_has_its_result_stored_and_a_submit_subscribes_to_nothing(client, broker) -> None:
    job_id = client.submit(quick_job([{"device_id": "nano-3", "power_cap_w": 5.0}]))
    client.profile(DEVICE, "smallcnn")
    [advance] = queued_tasks(broker, CONTROL_QUEUE)
    [profile] = queued_tasks(broker, device_queue("nano-3"))
    assert advance.payload == job_id and not advance.result_stored and not profile.result_stored
    assert broker.pubsub_channels() == []  # no result channel to listen on: nobody waits for these
    with pytest.raises(celery.exceptions.TimeoutError):  # pre-training is waited for: its result is stored
        client.pretrain("smallcnn", {"name": "digits"}, 1000, timeout_s=0.5, batch_size=32)
    [pretrain] = queued_tasks(broker, SERVER_QUEUE)
    assert pretrain.name == TaskName.pretrain.value and pretrain.result_stored


def test_submit_takes_either_kind_of_spec(client, broker) -> None:
    job_id = client.submit(quick_job([{"device_id": "nano-3", "power_cap_w": 5.0}]))
    federated_id = client.submit({"kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"},
                                  "test_dataset": {"name": "digits"}, "target_accuracy": 0.8, "batch_sizes": [16],
                                  "devices": [{"device_id": "nano-3", "power_cap_w": 5.0}]})  # fmt: skip
    assert client.store.jobs.record(job_id) is not None and client.federated_status(job_id) is None
    assert client.store.jobs.record(federated_id) is None and client.federated_status(federated_id) is not None
    assert [(t.name, t.payload) for t in queued_tasks(broker, CONTROL_QUEUE)] == [
        (TaskName.plan_submitted.value, job_id), (TaskName.federated_advance.value, federated_id)]  # fmt: skip


def test_a_client_reads_redis_s_settings_once_a_while_and_refuses_an_evicting_redis_after_it(client, broker, monkeypatch) -> None:
    monkeypatch.setattr(client_module, "SAFE_FOR_S", 0.5)
    job = quick_job([{"device_id": "nano-3", "power_cap_w": 5.0}])
    info_calls = lambda: int(broker.info("commandstats").get("cmdstat_info", {"calls": 0})["calls"])  # noqa: E731
    try:
        client.submit(job)
        before = info_calls()
        client.submit(job)
        client.submit(job)
        assert info_calls() - before == 1  # our own INFO only: the two submissions asked nothing
        broker.config_set("maxmemory-policy", "allkeys-lru")
        time.sleep(0.6)
        with pytest.raises(RedisUnsafe, match="refusing to submit: Redis maxmemory-policy is allkeys-lru"):
            client.submit(job)
    finally:
        broker.config_set("maxmemory-policy", "noeviction")
    assert [t.name for t in queued_tasks(broker, CONTROL_QUEUE)] == [TaskName.plan_submitted.value]  # one step takes up all three
    assert len(client.store.jobs.unplanned(float("inf"), 10)) == 3


def test_jobs_submitted_while_a_planning_step_is_due_send_no_message_and_the_eighth_ends_its_wait(client, broker) -> None:
    job = quick_job([{"device_id": "nano-3", "power_cap_w": 5.0}])
    first = client.submit(job)
    for _ in range(PLAN_EARLY_AT - 2):
        client.submit(job)
    assert [(t.name, t.payload) for t in queued_tasks(broker, CONTROL_QUEUE)] == [(TaskName.plan_submitted.value, first)]
    assert broker.llen(client.store.keys.plan_now()) == 0  # the step may wait for more
    client.submit(job)
    assert broker.llen(client.store.keys.plan_now()) == 1 and len(queued_tasks(broker, CONTROL_QUEUE)) == 1
    assert client.store.jobs.answer_doorbell(100) == client.store.jobs.unplanned(float("inf"), 100)  # the step takes up all
    assert broker.llen(client.store.keys.plan_now()) == 0
    client.submit(job)  # after the step answered: a new one
    assert [t.name for t in queued_tasks(broker, CONTROL_QUEUE)] == [TaskName.plan_submitted.value] * 2
