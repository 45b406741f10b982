"""A control worker instance notes the messages it takes under keys of its own; once it is gone
(started again, or silent for a lease) the reaper puts exactly those back on their queue, once.
Real Redis and kombu channels; the worker is this process."""

import importlib
import json

import redis
from celery.signals import task_postrun
from kombu import Connection

from edgetrain.common.store import WorkerInfo
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks import context
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.contract import CONTROL_QUEUE, HANDED_ON, TaskName, send, send_tracked, wake_ups
from edgetrain.tasks.held_messages import keep_apart, strike_off_when_run, transport_options, waiting
from edgetrain.tasks.reaper import reap_once, resend_lost, restore_gone_consumers

NODE = "control@h"


def take_one(instance: str) -> Connection:
    """What the worker `instance` does as it takes a message: noted, not acknowledged. Its
    connection is left open, as a killed worker leaves it (closing it would put the message back)."""
    taker = producer_app(context.settings())
    keep_apart(taker, instance)
    connection = taker.connection_for_write()
    assert connection.default_channel.basic_get(CONTROL_QUEUE, no_ack=False) is not None
    return connection


def beat(s, pid: int) -> None:
    s.liveness.heartbeat(WorkerInfo(node=NODE, role="control", queues=[CONTROL_QUEUE], hostname="h", pid=pid))


def test_the_steps_a_control_worker_took_go_back_to_the_queue_once_when_it_is_started_again(s, broker: redis.Redis) -> None:
    send(context.app(), TaskName.advance_job, "j1")
    send(context.app(), TaskName.advance_job, "j2")
    beat(s, 111)
    s.liveness.note_consumer(f"{NODE}:111")
    taken = take_one(f"{NODE}:111")  # j1, the oldest
    assert broker.hlen(transport_options(f"{NODE}:111")["unacked_key"]) == 1 and broker.hlen("unacked") == 0
    assert restore_gone_consumers(s, context.app(), context.settings()) == []  # it heartbeats: it holds j1
    assert [t.payload for t in queued_tasks(broker, CONTROL_QUEUE)] == ["j2"]

    beat(s, 222)  # the same node from a new process: the one that took j1 is gone
    (restored,) = restore_gone_consumers(s, context.app(), context.settings())
    assert restored.task == TaskName.advance_job.value and restored.queue == CONTROL_QUEUE
    waiting = queued_tasks(broker, CONTROL_QUEUE)
    assert sorted(t.payload for t in waiting) == ["j1", "j2"] and waiting[0].payload == "j1"  # back at the head
    assert broker.hlen(transport_options(f"{NODE}:111")["unacked_key"]) == 0 and s.liveness.consumers() == []
    assert s.monitoring.counts(HANDED_ON) == {"control": 1}
    assert restore_gone_consumers(s, context.app(), context.settings()) == []  # once
    taken.close()


def test_the_steps_of_a_control_worker_silent_for_a_lease_go_back_in_the_reapers_pass(s, broker: redis.Redis) -> None:
    send(context.app(), TaskName.advance_job, "j1")
    beat(s, 111)
    s.liveness.note_consumer(f"{NODE}:111")
    taken = take_one(f"{NODE}:111")
    broker.zadd(s.keys.workers(), {NODE: 0})  # last heard long ago
    reap_once(s, context.app(), context.settings())
    assert [t.payload for t in queued_tasks(broker, CONTROL_QUEUE)] == ["j1"] and s.liveness.consumers() == []
    taken.close()


def test_a_step_a_live_control_worker_holds_unstarted_past_twice_its_time_limit_goes_back_once(s, broker: redis.Redis) -> None:
    """A pool process stopped while idle never begins the step it is handed, and no time limit
    runs for it: the reaper puts the step back once it is held for twice a step's hard time
    limit and a lease, while the instance lives; a step held for less stays where it is."""
    settings = context.settings()
    send(context.app(), TaskName.advance_job, "j1")
    send(context.app(), TaskName.advance_job, "j2")
    beat(s, 111)
    s.liveness.note_consumer(f"{NODE}:111")
    taken = [take_one(f"{NODE}:111"), take_one(f"{NODE}:111")]  # j1, then j2
    index = transport_options(f"{NODE}:111")["unacked_index_key"]
    (j1_tag, j1_at), (j2_tag, _) = broker.zrange(index, 0, -1, withscores=True)
    just_within = 2 * settings.control_time_limit_s + settings.lease_ttl_s - 30
    broker.zadd(index, {j1_tag: j1_at - just_within - 60, j2_tag: j1_at - just_within})  # j1 taken 90 s before j2
    assert reap_once(s, context.app(), settings) == frozenset()
    assert [t.payload for t in queued_tasks(broker, CONTROL_QUEUE)] == ["j1"]  # j2 is held within the bound
    assert broker.hlen(transport_options(f"{NODE}:111")["unacked_key"]) == 1 and s.liveness.consumers() == [f"{NODE}:111"]
    assert s.monitoring.counts(HANDED_ON) == {"control": 1}
    reap_once(s, context.app(), settings)
    assert [t.payload for t in queued_tasks(broker, CONTROL_QUEUE)] == ["j1"]  # once
    for connection in taken:
        connection.close()


def test_a_control_step_past_its_hard_time_limit_goes_back_to_its_queue_and_a_device_task_does_not(s) -> None:
    """No lease stands for a control task: Celery requeues it when its pool process is ended."""
    for module in ("edgetrain.tasks.device", "edgetrain.tasks.federated"):
        importlib.import_module(module)
    tasks = context.app().tasks
    assert tasks[TaskName.advance_job.value].acks_on_timeout is False
    assert tasks[TaskName.advance_page.value].acks_on_timeout is False
    assert tasks[TaskName.federated_advance.value].acks_on_timeout is False
    assert tasks[TaskName.finetune.value].acks_on_timeout is not False


def test_a_wake_up_a_live_control_worker_holds_is_not_sent_again_and_is_struck_off_the_ledger_once_run(s, broker: redis.Redis) -> None:
    """A control step of the ledger of sent tasks (a job woken when its table is ready) holds no
    lease: while a live instance holds its message it is not sent again, and once it has run it
    leaves the ledger (else the reaper would send it again and again)."""
    (wake_up,) = wake_ups(["j1"])
    send_tracked(context.app(), s.ledger, TaskName.advance_job, [wake_up.payload])
    (recorded,) = s.ledger.unseen_since(float("inf"), 10)
    beat(s, 111)
    s.liveness.note_consumer(f"{NODE}:111")
    taken = take_one(f"{NODE}:111")
    broker.zadd(s.keys.sent_tasks(), {recorded.task_id: 0})  # last seen long ago
    assert resend_lost(s, context.app(), context.settings()) == [] and queued_tasks(broker, CONTROL_QUEUE) == []
    strike_off_when_run()
    task_postrun.send(sender=None, task_id="6f1c7a52-4a1e-4b4e-9a57-3f3b2b1d0c11")  # a task of Celery's own id: not in the ledger
    assert s.ledger.unseen_since(float("inf"), 10) == [recorded]
    task_postrun.send(sender=None, task_id=recorded.task_id)
    assert s.ledger.unseen_since(float("inf"), 10) == []
    taken.close()


def test_the_reaper_finds_a_waiting_message_by_its_task_id_not_by_an_id_another_message_names(s) -> None:
    """A device's queue can hold thousands of fine-tunes: only those whose id is sought are parsed."""
    app = context.app()
    sought, named, compact, absent = "f" * 32, "e" * 32, "d" * 32, "c" * 32
    for k in range(20):
        app.send_task(TaskName.finetune.value, args=[named], task_id=f"{k:032x}", queue="device.q")
    app.send_task(TaskName.finetune.value, args=[], task_id=sought, queue="device.q")
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        message = json.loads(client.lindex("device.q", 0))
        message["headers"]["id"] = compact
        client.lpush("device.q", json.dumps(message, separators=(",", ":")), b"not json")
        raws = client.lrange("device.q", 0, -1)
    assert len(raws) == 23 and all(isinstance(raw, bytes) for raw in raws)
    assert waiting(raws, {sought, named, compact, absent}) == {sought, compact}
