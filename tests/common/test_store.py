import time

import pytest

from edgetrain.common.control_axis import ControlAxis
from edgetrain.common.jobs.events import (
    AttemptFailed,
    AttemptFinished,
    AttemptLost,
    AttemptStarted,
    CancelRequested,
    Dispatched,
    Failed,
    Identified,
    Refused,
    Requeued,
    request_digest,
)
from edgetrain.common.jobs.state import EventKind, FinetuneProgress, JobState, PartState
from edgetrain.common.keys import table_id
from edgetrain.common.payloads import finetune_request
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, JobSpec, ProfileTable, RelationVector, RunReport, Selection, TrainingOutcome
from edgetrain.common.store import DeviceIdTaken, JobFinished, JobNotFoundError, Lease, Store, WorkerInfo, Written

CHOICE = Selection(batch_size=16, frequency_hz=900, estimated_time_s=1.0, peak_power_w=4.0)
IDENTITY = Identified(device_type="twin", simulated=True, control=ControlAxis.GPU_CLOCK_HZ)


def info(device_id: str) -> DeviceInfo:
    return DeviceInfo(device_id=device_id, device_type="jetson-nano", backend="sim", frequencies_hz=[1, 2], memory_bytes=4, simulated=True)


def test_fleet_registration_expires_without_heartbeat(store) -> None:
    store.fleet.register(info("a"), ttl_s=0.3, instance="wa")
    store.fleet.register(info("b"), ttl_s=30, instance="wb")
    assert [d.device_id for d in store.fleet.devices()] == ["a", "b"]
    time.sleep(0.5)
    assert [d.device_id for d in store.fleet.devices()] == ["b"]
    assert list(store._redis.hgetall(store.keys.fleet_labels())) == ["b"]  # what metrics label, gone with it
    store.fleet.unregister("b", "wb")
    assert store.fleet.devices() == [] and store._redis.hlen(store.keys.fleet_labels()) == 0


def test_a_device_is_up_in_metrics_for_its_own_workers_heartbeat_ttl(store) -> None:
    """Workers may run with another heartbeat TTL than the exporter's settings: each device is
    up while its own worker's TTL says it is."""
    store.fleet.register(info("slow"), ttl_s=60, instance="ws")
    store.fleet.register(info("fast"), ttl_s=3, instance="wf")
    now, _ = store._redis.time()
    store._redis.zadd(store.keys.fleet_seen(), {"slow": now - 20, "fast": now - 20})  # both last heard 20 s ago
    live = store.monitoring.live_devices(store.monitoring.last_seen(), ttl_s=10)
    assert [(d.device_id, d.device_type, d.simulated) for d in live] == [("slow", "jetson-nano", True)]


def test_a_heartbeat_is_one_command_and_a_taken_id_writes_nothing(store) -> None:
    def calls() -> dict[str, int]:
        return {name: int(v["calls"]) for name, v in store._redis.info("commandstats").items()}

    store.fleet.register(info("b"), ttl_s=30, instance="wb")  # Redis has the script from now on
    before = calls()
    store.fleet.register(info("a"), ttl_s=30, instance="wa")
    after = calls()
    ran = {c.removeprefix("cmdstat_"): n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}
    inside = {"get": 1, "set": 2, "sadd": 1, "zadd": 1, "time": 1, "hset": 1}  # what the script runs (hset: its labels, for metrics)
    assert ran == {"evalsha": 1, "info": 1, **inside}  # one script call sent (and INFO, which counts)
    seen = store.fleet.last_seen("a")
    assert store.fleet.device("a").heartbeat_at is not None and seen is not None and store.fleet.owner("a") == "wa"
    with pytest.raises(DeviceIdTaken):
        store.fleet.register(info("a").model_copy(update={"device_type": "other"}), ttl_s=30, instance="wb")
    assert store.fleet.device("a").device_type == "jetson-nano" and store.fleet.owner("a") == "wa"
    store.fleet.register(info("a"), ttl_s=30, instance="wb", replaces="wa")  # taking over from an owner known to be dead
    assert store.fleet.owner("a") == "wb"


def test_table_and_vector_round_trip(store) -> None:
    table = ProfileTable(
        batch_sizes=[4], frequencies_hz=[10], samples=5, time_s=[[1.0]], peak_power_w=[[None]],
        device_type="jetson-nano", model="smallcnn", input_shape=[1, 28, 28], points_measured=1,
    )  # fmt: skip
    tid = store.resources.put_table(table)
    assert tid == table_id("jetson-nano", "smallcnn", [1, 28, 28]) == "jetson-nano:smallcnn:1x28x28"
    again = store.resources.table(tid)
    assert again.time_s == [[1.0]] and again.peak_power_w == [[None]] and again.points_measured == 1
    assert [t.model for t in store.resources.tables("jetson-nano")] == ["smallcnn"]
    assert store.resources.tables("jetson-tx2-nx") == []
    vector = RelationVector(batch_sizes=[4, 8], ratios=[None, 1.0], key="k1")
    store.resources.put_vector(vector)
    assert store.resources.vector("k1").ratios == [None, 1.0]


def test_vector_parts_count_claims_and_once(store) -> None:
    outcome = TrainingOutcome(
        batch_size=4, seed=0, samples_to_accuracy=10, reached=True, final_accuracy=0.9, samples_processed=10, evaluations=1, wall_s=0.1
    )
    assert store.resources.put_vector_part("k", outcome) == 1
    assert store.resources.put_vector_part("k", outcome) == 1  # a redelivered part counts once
    assert store.resources.put_vector_part("k", outcome.model_copy(update={"seed": 1})) == 2
    c = store.coordination
    assert c.claim("r", "job1") and not c.claim("r", "job2") and c.holder("r") == "job1"
    c.add_waiter("r", "job1")
    c.add_waiter("r", "job2")
    assert c.settle("r", lambda jobs: [], owner="job2") is None and c.holder("r") == "job1"  # not the holder: nothing changes
    woken: list[str] = []
    assert c.settle("r", lambda jobs: woken.extend(jobs) or [], reason="broken") == []
    failure = c.failure("r")
    assert woken == ["job1", "job2"] and c.settle("r", lambda jobs: woken.extend(jobs) or []) == [] and woken == ["job1", "job2"]
    assert failure.for_job("job2") == "broken" and failure.for_job("job9") is None and c.holder("r") is None
    assert c.claim("r", "job3") and c.failure("r") is None  # a new attempt clears the failure
    c.settle("r", lambda jobs: [], reason="broken again")
    c.clear_failure("r")
    assert c.failure("r") is None
    assert c.once("finished:j") and not c.once("finished:j")
    assert c.claim("finished:j", "job4")  # claims and once-only markers are separate names


def test_attempts_are_counted_with_an_expiry(store, redis_server) -> None:
    assert [store.coordination.count_attempt("t1") for _ in range(3)] == [1, 2, 3]
    store.coordination.uncount_attempt("t1")  # that delivery was stopped cleanly: no retry
    assert store.coordination.count_attempt("t1") == 3
    raw = Store.connect(redis_server.url)._redis
    assert 0 < raw.ttl(store.keys.attempts("t1")) <= 7 * 24 * 3600


def test_job_record_status_progress_and_structured_events(store) -> None:
    spec = JobSpec.model_validate(quick_job())
    store.jobs.create("j1", spec)
    status = store.jobs.status("j1")
    assert status.state == JobState.queued and not status.finished
    assert set(status.parts) == {"nano-1", "tx2nx-1"}
    assert [e.kind for e in status.events] == [EventKind.submitted]
    start_attempt(store, "j1", "nano-1", "a1")
    progress = FinetuneProgress(samples=10, accuracy=0.5, device_time_s=1.0, energy_j=2.0, target_accuracy=0.85, max_samples=100)
    assert store.jobs.attempt_write("j1", "nano-1", "a1", progress=progress, event=(EventKind.reconfigured, "b=16 -> b=32")) == Written.ok
    status = store.jobs.status("j1")
    assert status.progress == {"nano-1": progress} and status.state == JobState.running
    assert status.events[-1].kind == EventKind.reconfigured and status.events[-1].device_id == "nano-1"
    assert store.jobs.job_ids() == ["j1"]
    with pytest.raises(JobNotFoundError):
        store.jobs.status("missing")


def test_key_prefixes_let_two_deployments_share_one_redis(redis_server) -> None:
    a, b = Store.connect(redis_server.url, "deploy-a"), Store.connect(redis_server.url, "deploy-b")
    a.clear(), b.clear()
    a.fleet.register(info("only-in-a"), ttl_s=30, instance="w")
    a.jobs.create("j1", JobSpec.model_validate(quick_job()))
    assert [d.device_id for d in a.fleet.devices()] == ["only-in-a"] and b.fleet.devices() == []
    assert a.jobs.job_ids() == ["j1"] and b.jobs.job_ids() == []
    assert b.clear() == 0 and a.clear() > 0 and a.jobs.job_ids() == []


def test_a_device_id_is_served_by_one_live_worker(store) -> None:
    store.fleet.register(info("n1"), ttl_s=0.5, instance="w1")
    with pytest.raises(DeviceIdTaken, match="served by another live worker"):
        store.fleet.register(info("n1"), ttl_s=0.5, instance="w2")
    store.fleet.register(info("n1"), ttl_s=0.5, instance="w2", replaces="w1")  # w1 is known to be dead
    assert store.fleet.owner("n1") == "w2"
    store.fleet.unregister("n1", "w1")  # not the owner: nothing happens
    assert store.fleet.device("n1") is not None
    time.sleep(0.6)
    store.fleet.register(info("n1"), ttl_s=30, instance="w3")  # w2's registration expired
    assert store.fleet.owner("n1") == "w3"


def test_the_last_heartbeat_of_a_device_is_kept(store) -> None:
    store.fleet.register(info("n1"), ttl_s=0.2, instance="w1")
    before = store.fleet.last_seen("n1")
    time.sleep(1.1)
    assert store.fleet.device("n1") is None and store.fleet.last_seen("n1") == before
    assert store.fleet.silent_since(1.0) == ["n1"] and store.fleet.last_seen("never") is None


def test_leases_expire_unless_renewed_and_are_reaped_once(store) -> None:
    live = store.liveness
    live.take(Lease(task_id="t1", task="edgetrain.finetune", attempt="a1", node="device-a@h", job_id="j1", device_id="a"))
    live.take(Lease(task_id="t2", task="edgetrain.train_proxy", attempt="a2", node="server-0@h"))
    time.sleep(1.1)
    live.renew({"t2": "a2", "t-released": "x", "t1": "an-older-run"})  # a released lease is not brought back, nor another run's
    assert [lease.task_id for lease in live.expired(1.0)] == ["t1"]
    lost = live.lease("t1")
    live.take(lost.model_copy(update={"attempt": "newer"}))  # a new run of the task holds it now
    assert not live.reap(lost)
    assert live.reap(live.lease("t1")) and not live.reap(lost)
    assert not live.release("t2", "an-older-run") and live.release("t2", "a2")
    assert live.expired(0.0) == [] and live.lease("t2") is None


def test_the_worker_registry_lists_live_workers(store) -> None:
    live = store.liveness
    live.heartbeat(WorkerInfo(node="control@h", role="control", queues=["control"], hostname="h", pid=1))
    live.heartbeat(WorkerInfo(node="server-0@h", role="server", queues=["server"], hostname="h", pid=2))
    assert [(w.node, w.queues) for w in live.workers(ttl_s=30)] == [("control@h", ["control"]), ("server-0@h", ["server"])]
    time.sleep(1.1)
    assert live.workers(ttl_s=1.0) == []
    live.remove_worker("control@h")
    assert [w.node for w in live.workers(ttl_s=30)] == ["server-0@h"]


def start_attempt(store, job_id: str, device_id: str, attempt: str, token: str = "t1") -> None:
    spec = store.jobs.record(job_id).spec
    target = next(t for t in spec.devices if t.device_id == device_id)
    request = finetune_request(job_id, spec, target, CHOICE, "twin:smallcnn:1x28x28", "vkey")
    store.jobs.apply(job_id, device_id, Dispatched(device=IDENTITY, token=token, request=request, selection=CHOICE,
                                                   estimated_time_to_accuracy_s=1.0))  # fmt: skip
    store.jobs.apply(job_id, device_id, AttemptStarted(dispatch=token, digest=request_digest(request), attempt=attempt, node="n"))


def finished_report(device_id: str) -> RunReport:
    return RunReport(device_id=device_id, device_type="twin", simulated=True, batch_size=16, frequency_hz=900, reached=True,
                     final_accuracy=0.9, samples_to_accuracy=100, samples_processed=128, steps=8, device_time_s=1.0, energy_j=1.0,
                     peak_power_w=3.0, wall_s=1.0)  # fmt: skip


def test_a_part_changes_only_through_events_with_its_counts_index_and_ledger(store) -> None:
    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    assert store.jobs.device_jobs("nano-1") == ["j1"] and store.jobs.tallies(["j1"])["j1"].counts == {PartState.pending: 2}
    with pytest.raises(Refused):
        store.jobs.apply("j1", "nano-1", AttemptFailed(attempt="a1", reason="x"))  # nothing runs it
    start_attempt(store, "j1", "nano-1", "a1")
    assert store.jobs.tallies(["j1"])["j1"].counts == {PartState.pending: 1, PartState.finetuning: 1}
    assert store.jobs.dispatched_since(time.time() + 1, 10) == [("j1", "nano-1")]
    with pytest.raises(Refused, match="no longer holds"):
        store.jobs.apply("j1", "nano-1", AttemptFinished(attempt="stale", report=finished_report("nano-1")))
    done = store.jobs.apply("j1", "nano-1", AttemptFinished(attempt="a1", report=finished_report("nano-1")))
    assert done.part.state == PartState.completed and done.before.state == PartState.finetuning and done.finished is None
    assert store.jobs.part("j1", "nano-1").state == PartState.completed
    assert store.jobs.device_jobs("nano-1") == [] and store.jobs.dispatched_since(time.time() + 1, 10) == []
    with pytest.raises(JobNotFoundError):
        store.jobs.apply("j1", "missing", Failed(reason="x"))


def test_the_store_knows_which_job_each_device_runs_while_an_attempt_runs_it(store) -> None:
    for job_id in ("first", "second"):
        store.jobs.create(job_id, JobSpec.model_validate(quick_job()))
    start_attempt(store, "first", "nano-1", "a1")
    assert store.jobs.running_on(["nano-1", "tx2nx-1"]) == {"nano-1": "first"}
    assert store.monitoring.running()["nano-1"].job_id == "first"
    start_attempt(store, "second", "nano-1", "a2", token="t2")  # the first's attempt was lost and not let go yet
    store.jobs.apply("first", "nano-1", AttemptFailed(attempt="a1", reason="x"))  # it ends: the second's stays known
    assert store.jobs.running_on(["nano-1"]) == {"nano-1": "second"}
    store.jobs.apply("second", "nano-1", AttemptFinished(attempt="a2", report=finished_report("nano-1")))
    assert store.jobs.running_on(["nano-1"]) == {} and store.monitoring.running() == {}


def test_the_last_part_to_finish_logs_the_job_finished_once_and_sets_its_expiry(redis_server) -> None:
    store = Store.connect(redis_server.url, "retained", job_retention_s=600)
    store.clear()
    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    assert store.jobs.apply("j1", "nano-1", Failed(reason="broken")).finished is None
    last = store.jobs.apply("j1", "tx2nx-1", Failed(reason="broken too"))
    assert last.finished == JobState.failed
    kinds = [e.kind for e in store.jobs.status("j1").events]
    assert kinds.count(EventKind.finished) == 1 and kinds[-1] == EventKind.finished
    raw = store._redis
    assert 0 < raw.ttl(store.keys.job("j1")) <= 600 and 0 < raw.ttl(store.keys.part("j1", "nano-1")) <= 600
    store.jobs.apply("j1", "nano-1", Requeued())  # planned again: kept, and it can finish again
    assert raw.ttl(store.keys.job("j1")) == -1 and raw.ttl(store.keys.part("j1", "tx2nx-1")) == -1
    assert store.jobs.apply("j1", "nano-1", Failed(reason="again")).finished == JobState.failed
    with pytest.raises(JobFinished, match="already finished"):
        store.jobs.cancel("j1")
    assert store.jobs.record("j1").cancelled_at is None  # nothing changed


def test_an_attempt_writes_only_while_it_holds_its_part(store) -> None:
    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    progress = FinetuneProgress(samples=10, accuracy=0.5, device_time_s=1.0, energy_j=2.0, target_accuracy=0.85, max_samples=100)
    assert store.jobs.attempt_write("j1", "nano-1", "a1", progress=progress) == Written.stale  # no attempt yet
    assert store.jobs.attempt_write("j1", "gone", "a1", progress=progress) == Written.gone
    start_attempt(store, "j1", "nano-1", "a1")
    store.jobs.apply("j1", "nano-1", AttemptLost(attempt="a1", outcome="re-queued"))
    assert store.jobs.attempt_write("j1", "nano-1", "a1", progress=progress) == Written.stale
    store.jobs.apply("j1", "nano-1", AttemptStarted(dispatch="t1", digest=store.jobs.part("j1", "nano-1").dispatch and
                     request_digest(store.jobs.part("j1", "nano-1").dispatch.request), attempt="a2", node="n"))  # fmt: skip
    assert store.jobs.progress("j1", "nano-1") is None  # the stale writes left nothing
    assert store.jobs.attempt_write("j1", "nano-1", "a2", progress=progress) == Written.ok
    store.jobs.cancel("j1")
    store.jobs.apply("j1", "nano-1", CancelRequested(reason="cancelled"))
    assert store.jobs.attempt_write("j1", "nano-1", "a2") == Written.cancel


def test_finished_jobs_are_pruned_and_running_ones_kept(store) -> None:
    store.jobs.create("done", JobSpec.model_validate(quick_job()))
    store.jobs.create("running", JobSpec.model_validate(quick_job()))
    for device in ("nano-1", "tx2nx-1"):
        store.jobs.apply("done", device, Failed(reason="x"))
    assert store.jobs.prune(older_than_s=3600) == []  # too recent
    assert store.jobs.prune(older_than_s=0) == ["done"]
    assert store.jobs.record("done") is None and store.jobs.job_ids() == ["running"]
    assert [j.job_id for j in store.jobs.summaries()] == ["running"]


def test_a_job_re_queued_while_it_is_pruned_is_kept(store, monkeypatch) -> None:
    from edgetrain.common.store import jobs as jobs_module

    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    for device in ("nano-1", "tx2nx-1"):
        store.jobs.apply("j1", device, Failed(reason="x"))
    parse, raced = jobs_module.Tally.parse, []

    def requeued_meanwhile(raw):
        if not raced:
            raced.append(True)
            store.jobs.apply("j1", "nano-1", Requeued())  # an operator's requeue, between the check and the delete
        return parse(raw)

    monkeypatch.setattr(jobs_module.Tally, "parse", staticmethod(requeued_meanwhile))
    assert store.jobs.prune(older_than_s=0) == []
    assert store.jobs.record("j1") is not None and store.jobs.status("j1").parts["nano-1"].state == PartState.pending


def test_a_job_record_is_parsed_once_until_it_changes(store) -> None:
    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    first = store.jobs.record("j1")
    assert store.jobs.record("j1") is first  # the same record: not parsed again
    assert store.jobs.position("j1", "tx2nx-1") == 1 and store.jobs.position("j1", "absent") is None
    store.jobs.cancel("j1")
    cancelled = store.jobs.record("j1")
    assert cancelled is not first and cancelled is not None and cancelled.cancelled_at is not None
    assert store.jobs.position("missing", "nano-1") is None and store.jobs.record("missing") is None


def test_the_jobs_with_an_unfinished_part_are_found_over_thousands_of_devices(store) -> None:
    from edgetrain.common.presets import quick_job
    from edgetrain.common.schemas import JobSpec

    ids = [f"d{i:04d}" for i in range(2500)]  # more than one SUNION of a thousand keys, and than Lua's unpack takes
    store.jobs.create("wide", JobSpec.model_validate(quick_job([{"device_id": d, "power_cap_w": 5.0} for d in ids])))
    store.jobs.create("last", JobSpec.model_validate(quick_job([{"device_id": ids[-1], "power_cap_w": 5.0}])))
    assert store.monitoring.unfinished_jobs(ids) == {"wide", "last"}
    assert store.monitoring.unfinished_jobs(ids[:10]) == {"wide"} and store.monitoring.unfinished_jobs([]) == set()


def test_caps_set_before_the_fleets_hash_of_caps_are_indexed_once_for_metrics(store: Store) -> None:
    """A store written by a version without `fleet:caps`: its per-device caps fill the hash (the
    exporter reads only that), a cap removed stays out, and a cap in the hash is not overwritten."""
    store.fleet.set_power_cap("nano-1", 3.5)
    store.fleet.set_power_cap("nano-2", None)
    store.fleet.set_power_cap("nano-3", 6.0)
    store._redis.delete(store.keys.fleet_caps())  # what an earlier version left
    store._redis.hset(store.keys.device_cap("nano-4"), mapping={"version": 1, "power_cap_w": "4.0", "set_at": "2026-01-01T00:00:00+00:00"})
    store._redis.hset(store.keys.fleet_caps(), "nano-3", "7.0")  # set since, through the hash
    assert store.monitoring.power_caps() == {"nano-3": 7.0}
    assert store.fleet.index_caps() == 2
    assert store.monitoring.power_caps() == {"nano-1": 3.5, "nano-3": 7.0, "nano-4": 4.0}
    assert store.fleet.index_caps() == 0


def test_a_cancel_racing_the_last_part_to_finish_changes_nothing(store, monkeypatch) -> None:
    """The last part finishes between the cancel's read of the job's counts and its write: the
    cancel reads again and says the job finished, and no 'cancel requested' follows 'finished'."""
    from edgetrain.common.store import jobs as jobs_module

    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    store.jobs.apply("j1", "nano-1", Failed(reason="broken"))
    parse, raced = jobs_module.Tally.parse, []

    def finishing_meanwhile(raw):
        if not raced:
            raced.append(True)
            store.jobs.apply("j1", "tx2nx-1", Failed(reason="broken too"))  # on another connection than the cancel's
        return parse(raw)

    monkeypatch.setattr(jobs_module.Tally, "parse", staticmethod(finishing_meanwhile))
    with pytest.raises(JobFinished):
        store.jobs.cancel("j1")
    assert [e.kind for e in store.jobs.status("j1").events][-1] == EventKind.finished


def test_a_worker_gone_uncleanly_leaves_the_registry_after_a_day(store) -> None:
    """A pod's node name dies with it: its entry must not stay for good."""
    from edgetrain.common.store.liveness import WORKER_KEPT_S

    live = store.liveness
    live.heartbeat(WorkerInfo(node="control@old-pod", role="control", queues=["control"], hostname="old-pod", pid=1))
    assert 0 < store._redis.ttl(store.keys.worker("control@old-pod")) <= WORKER_KEPT_S
    store._redis.zadd(store.keys.workers(), {"control@old-pod": live.now() - WORKER_KEPT_S - 1})
    live.heartbeat(WorkerInfo(node="control@new-pod", role="control", queues=["control"], hostname="new-pod", pid=1))
    assert live.heard_at(["control@old-pod", "control@new-pod"]).keys() == {"control@new-pod"}


def test_a_part_write_whose_reply_was_lost_is_not_refused_when_retried(store, monkeypatch) -> None:
    """The attempt's final write reaches Redis but its reply is lost; redis-py runs the script
    again, which finds the part changed (by that very write): the report is applied once, and the
    attempt learns it was (else it would skip keeping its record)."""
    store.jobs.create("j1", JobSpec.model_validate(quick_job()))
    start_attempt(store, "j1", "nano-1", "a1")
    real, lost = store.jobs._compare_and_write, []

    def reply_lost(keys, args):
        answer = real(keys=keys, args=args)
        if not lost:
            lost.append(answer)
            return 0  # what the retry of a write that went through answers
        return answer

    monkeypatch.setattr(store.jobs, "_compare_and_write", reply_lost)
    applied = store.jobs.apply("j1", "nano-1", AttemptFinished(attempt="a1", report=finished_report("nano-1")))
    assert lost == [1] and applied.change.part.state == PartState.completed
    events = [e.kind for e in store.jobs.status("j1").events]
    assert events.count(EventKind.completed) == 1, events
