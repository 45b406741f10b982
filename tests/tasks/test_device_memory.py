"""What a fine-tune reads and leaves of the records of its data (tasks/device.py `_Memory`), in this
process against a real Redis: a read that fails or an entry that does not load is a warning and
the run goes on with what it has, and the run's partial record goes however the run ends."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
import redis
from redis import RedisError

from edgetrain.common.finetune.learned import FinetuneRecord, Segment
from edgetrain.common.finetune.recipe import CancelledRun
from edgetrain.common.finetune.trust import ProxyCheck
from edgetrain.common.jobs.state import PartState
from edgetrain.common.keys import Keys
from edgetrain.common.payloads import FinetuneRequest
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import JobSpec, LearningRatePolicy, RelationVector, Selection, utc_now
from edgetrain.common.store.learned import LIVE_TTL_S
from edgetrain.common.testing.parts import drive_part
from edgetrain.tasks import context, device
from edgetrain.tasks.device import _Memory

CHOICE = Selection(batch_size=16, frequency_hz=900, estimated_time_s=1.0, peak_power_w=4.0)


def request(s, job_id: str = "j1") -> FinetuneRequest:
    s.jobs.create(job_id, JobSpec.model_validate(quick_job([{"device_id": "d1", "power_cap_w": 5.0}])))
    part = drive_part(s, job_id, "d1", PartState.queued, selection=CHOICE)
    assert part.dispatch is not None
    return part.dispatch.request


def record(memory: _Memory, record_id: str, b: int = 16, n: int | None = 3000) -> FinetuneRecord:
    curve = [(k * 256, 0.5, 2.0 / (1 + k)) for k in range(8)]
    return FinetuneRecord(
        record_id=record_id, model="smallcnn", weights="w", data=memory.data, target_accuracy=0.9, lr=LearningRatePolicy(),
        eval_every_samples=256, device_type="jetson-nano", power_cap_w=None, seed=0,
        segments=[Segment(batch_size=b, frequency_hz=900, start_samples=0, end_samples=1792, device_time_s=1.0, curve=curve)],
        reached=n is not None, samples_to_accuracy=n,
    )  # fmt: skip


def newer(r: FinetuneRecord) -> str:
    """`r` as a newer worker writes it: with a field this one does not know."""
    return json.dumps({**json.loads(r.model_dump_json()), "added_later": 1})


def test_an_entry_a_newer_worker_wrote_is_left_out_with_a_warning(s, caplog) -> None:
    memory = _Memory(request(s), None)
    client, keys = redis.Redis.from_url(context.settings().redis_url), Keys(context.settings().key_prefix)
    s.learned.put_record(memory.key, memory.kind, record(memory, "old:d1"))
    client.lpush(keys.learned(memory.key), newer(record(memory, "new:d1")))
    client.incr(keys.learned_count(memory.key))
    client.hset(keys.learned_live(memory.key), "live:d1", newer(record(memory, "live:d1", n=None)))
    other = "otherdata"
    s.learned.put_record(other, memory.kind, record(memory, "similar:d1"))
    client.lpush(keys.learned(other), newer(record(memory, "similar-new:d1")))
    check = ProxyCheck(data=other, error=0.3, pairs=1)
    s.learned.put_check("family", check)
    client.hset(keys.learned_trust("family"), "third", json.dumps({**json.loads(check.model_dump_json()), "added_later": 1}))
    memory.family = "family"
    assert [r.record_id for r in memory.records()] == ["old:d1"]
    assert {k: [r.record_id for r in v] for k, v in memory.similar().items()} == {other: ["similar:d1"]}
    assert memory.trust() > 0.08  # the check that loads counts
    assert sum("does not load here is left out" in m for m in caplog.messages) == 4


def failing(*_, **__):
    raise RedisError("connection lost")


def test_records_read_when_the_live_ones_fail_are_read_again(s, monkeypatch) -> None:
    memory = _Memory(request(s), None)
    s.learned.put_record(memory.key, memory.kind, record(memory, "a:d1"))
    live = s.learned.live
    monkeypatch.setattr(s.learned, "live", failing)  # the records' list was read, the live records were not
    assert memory.records() == []
    monkeypatch.setattr(s.learned, "live", live)
    assert [r.record_id for r in memory.records()] == ["a:d1"]  # the list read in the failed call is read again


def test_similar_data_that_cannot_be_read_leave_the_run_the_proxy(s, monkeypatch, caplog) -> None:
    memory = _Memory(request(s), None)
    monkeypatch.setattr(s.learned, "similar", failing)
    assert memory.similar() == {} and any("similar data were not read" in m for m in caplog.messages)


def test_a_kept_record_is_not_counted_again_as_running(s) -> None:
    memory = _Memory(request(s), None)
    other = record(memory, "j2:d2", n=None)
    s.learned.publish(memory.key, other)
    s.learned.publish(memory.key, record(memory, memory.record_id, n=None))  # its own: never evidence for itself
    assert [r.record_id for r in memory.records()] == ["j2:d2"]
    s.learned.put_record(memory.key, memory.kind, other.model_copy(update={"reached": True, "samples_to_accuracy": 3000}))
    found = memory.records()  # kept, not yet taken down from the live records
    assert [(r.record_id, r.reached) for r in found] == [("j2:d2", True)]


def test_a_partial_record_not_updated_for_the_ttl_is_gone_while_others_are_updated(s) -> None:
    memory = _Memory(request(s), None)
    crashed = record(memory, "j2:d2", n=None).model_copy(update={"created_at": utc_now() - timedelta(seconds=LIVE_TTL_S + 1)})
    s.learned.publish(memory.key, crashed)
    s.learned.publish(memory.key, record(memory, "j3:d3", n=None))  # refreshes the hash's expiry
    assert [r.record_id for r in memory.records()] == ["j3:d3"]
    assert [r.record_id for r in s.learned.live(memory.key)] == ["j3:d3"]  # and it was deleted


def start(memory: _Memory, record_id: str, b: int) -> FinetuneRecord:
    """A run's start as the closed loop shows it: one segment of `b`, no evaluation yet."""
    segment = Segment(batch_size=b, frequency_hz=900, start_samples=0, end_samples=0, device_time_s=0.0)
    return record(memory, record_id, b, n=None).model_copy(update={"segments": [segment], "running": True})


def test_of_runs_starting_at_once_one_claims_each_batch_size(s) -> None:
    memory = _Memory(request(s), None)
    assert memory.claim(start(memory, "j1:d1", 64)) is None  # shown
    assert memory.claim(start(memory, "j1:d2", 64)) == "j1:d1"  # b=64 is being measured: nothing written
    assert memory.claim(start(memory, "j1:d2", 32)) is None
    assert memory.claim(start(memory, "j1:d1", 64)) is None  # its own start again
    assert sorted((r.record_id, r.segments[0].batch_size) for r in s.learned.live(memory.key)) == [("j1:d1", 64), ("j1:d2", 32)]
    moved_on = start(memory, "j1:d1", 64).model_copy(update={"running": False})  # ended (its record kept or not)
    s.learned.publish(memory.key, moved_on)
    stale = start(memory, "j2:d3", 16).model_copy(update={"created_at": utc_now() - timedelta(seconds=LIVE_TTL_S + 1)})
    s.learned.publish(memory.key, stale)
    assert memory.claim(start(memory, "j3:d4", 64)) is None  # an ended run holds nothing
    assert memory.claim(start(memory, "j3:d5", 16)) is None  # nor one not updated for the TTL (its worker died)
    assert memory.claim(start(memory, "j3:d6", 32)) == "j1:d2"


def test_a_claim_redis_does_not_answer_is_a_warning_and_the_run_goes_on(s, monkeypatch, caplog) -> None:
    memory = _Memory(request(s), None)
    monkeypatch.setattr(s.learned, "claim", failing)
    assert memory.claim(start(memory, "j1:d1", 64)) is None and any("was not shown" in m for m in caplog.messages)


class _FailingRun:
    """A fine-tune that shows its partial record, then ends with `error`."""

    error: Exception

    def __init__(self, request, device, writer, options):
        self.options, self.request = options, request

    def setup(self, checkpoint) -> None:
        self.options.publish(record(SimpleNamespace(data=self.options.data), f"{self.request.job_id}:{self.request.device_id}", n=None))
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("the model diverged"), CancelledRun(512, "cancelled after 512 samples")])
def test_a_run_that_fails_or_is_cancelled_takes_its_partial_record_down(s, monkeypatch, error) -> None:
    req = request(s)
    monkeypatch.setattr(device, "FineTune", type("Run", (_FailingRun,), {"error": error}))
    monkeypatch.setattr(device, "attempt_token", lambda task_id: "a1")  # a worker's lease keeper gives it
    context.bind_device("d1", SimpleNamespace(device_type="jetson-nano"))  # type: ignore[arg-type]
    memory = _Memory(req, None)
    published = []
    monkeypatch.setattr(s.learned, "publish", lambda key, r: (published.append(r.record_id), type(s.learned).publish(s.learned, key, r)))
    device.finetune.apply(args=(req.model_dump(mode="json"),), task_id=s.jobs.part("j1", "d1").dispatch.token)
    assert published == ["j1:d1"]
    assert s.learned.live(memory.key) == []
    assert s.jobs.part("j1", "d1").state in (PartState.failed, PartState.cancelled)


def test_keeping_the_record_of_a_completed_part_never_fails_its_task(s, monkeypatch, caplog) -> None:
    prior = RelationVector(batch_sizes=[16, 64], ratios=[0.5, 1.0], samples_mean=[2000.0, 4000.0])
    memory = _Memory(request(s), prior)
    memory.family = "family"

    def broken(*_, **__):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(device, "proxy_check", broken)
    memory.keep(record(memory, memory.record_id))
    assert [r.record_id for r in s.learned.records(memory.key)] == [memory.record_id]
    assert any("was not kept" in m for m in caplog.messages)


def test_the_memory_reads_data_of_its_kind_by_key(s) -> None:
    memory = _Memory(request(s), None)
    s.learned.put_record("a", memory.kind, record(memory, "a:d1"))
    s.learned.put_record("b", memory.kind, record(memory, "b:d1"))
    assert {k: [r.record_id for r in v] for k, v in memory.similar().items()} == {"a": ["a:d1"], "b": ["b:d1"]}
