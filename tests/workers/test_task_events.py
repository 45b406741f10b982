"""A control worker sends task events only while a receiver bound to Celery's event exchange takes them."""

from types import SimpleNamespace

import pytest

from edgetrain.common.store.monitoring import EVENT_BINDINGS, KOMBU_SEPARATOR
from edgetrain.workers.processes.task_events import WORKER_GROUPS, TaskEventsGate, follows_task_events


@pytest.mark.parametrize(("keys", "followed"), [([], False), (["worker.#"], False), (["#"], True), (["worker.#", "task.#"], True),
                                                 (["*.multi"], True), (["task.heartbeat"], False)])  # fmt: skip
def test_a_receiver_follows_task_events_when_its_routing_key_takes_them(keys: list[str], followed: bool) -> None:
    assert follows_task_events(keys) is followed


def test_the_gate_turns_task_events_on_while_flower_s_binding_is_there_and_off_without_at_most_once_a_second(store) -> None:
    store._redis.delete(EVENT_BINDINGS)  # kombu's key, not under the store's prefix
    now = [0.0]
    gate = TaskEventsGate(store, every_s=1.0, clock=lambda: now[0])
    consumer = SimpleNamespace(event_dispatcher=SimpleNamespace(groups=None))
    store._redis.sadd(EVENT_BINDINGS, KOMBU_SEPARATOR.join(["worker.#", "", "celeryev.gossip"]))
    gate.received(sender=consumer)
    assert consumer.event_dispatcher.groups == WORKER_GROUPS  # a worker's gossip takes worker events only
    store._redis.sadd(EVENT_BINDINGS, KOMBU_SEPARATOR.join(["#", "", "celeryev.flower"]))
    now[0] = 0.5
    gate.received(sender=consumer)
    assert consumer.event_dispatcher.groups == WORKER_GROUPS  # looked half a second ago
    now[0] = 1.0
    gate.received(sender=consumer)
    assert consumer.event_dispatcher.groups is None  # every group, task events included
    store._redis.delete(EVENT_BINDINGS)
