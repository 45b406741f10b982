"""The three federated tasks in this process against a real Redis, with a simulated Jetson Nano
bound as the device: a round opened and sent, each device's local training handed in (once: a
second delivery trains nothing and leaves the accepted update whole), the round closed with
its aggregation written down, aggregated into a new global model, and the next round opened."""

import pytest
import redis
import torch

from edgetrain.common.artifacts import get_state, initial_model
from edgetrain.common.devices.simulated import SimulatedDevice, load_twin
from edgetrain.common.federated.events import Accepted, RoundClosed, WorkExpired
from edgetrain.common.federated.records import AggregateRequest, FederatedRecord, Phase, TrainRequest
from edgetrain.common.federated.rounds import Update, aggregate, local_work
from edgetrain.common.federated.simulate import twin_table
from edgetrain.common.federated.spec import Aggregation, FederatedSpec
from edgetrain.common.keys import table_id, table_resource
from edgetrain.common.models import get_model
from edgetrain.common.security import artifact_path
from edgetrain.common.settings import Settings
from edgetrain.common.testing.broker import queued_tasks
from edgetrain.tasks import context, federated_work
from edgetrain.tasks.contract import SERVER_QUEUE, TaskFailed, TaskName, device_queue
from edgetrain.tasks.federated import federated_advance
from edgetrain.tasks.federated_work import federated_aggregate, federated_cleanup, federated_train
from edgetrain.workers.processes.device_worker import device_info

JOB = "fedtask0001a"
TWIN = "jetson-nano"
SPEC = FederatedSpec.model_validate({
    "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"}, "target_accuracy": 0.99,
    "batch_sizes": [16, 32], "devices": [{"device_id": "a", "power_cap_w": 5.0}, {"device_id": "b"}], "local": {"local_steps": 3},
    "max_rounds": 3,
})  # fmt: skip


@pytest.fixture(scope="module")
def table():
    return twin_table(TWIN, SPEC)


@pytest.fixture
def s(redis_server, tmp_path, table):
    broker = redis.Redis.from_url(redis_server.url)
    broker.flushdb()
    store = context.init(Settings(redis_url=redis_server.url, artifact_dir=tmp_path / "artifacts"),
                         ("edgetrain.tasks.federated", "edgetrain.tasks.federated_work"))  # fmt: skip
    for d in ("a", "b"):
        store.fleet.register(device_info(d, SimulatedDevice(load_twin(TWIN))), ttl_s=60, instance="test")
    store.federated.create(FederatedRecord(job_id=JOB, spec=SPEC))
    store.broker = broker
    return store


def bind(device_id: str) -> None:
    context.bind_device(device_id, SimulatedDevice(load_twin(TWIN), seed=1))


def train_requests(s) -> dict[str, TrainRequest]:
    tasks = [t for d in ("a", "b") for t in queued_tasks(s.broker, device_queue(d))]
    assert all(t.name == TaskName.federated_train.value for t in tasks)
    return {(r := TrainRequest.model_validate(t.args[0])).device_id: r for t in tasks}


def test_a_round_opens_trains_once_per_device_closes_aggregates_and_the_next_opens(s, table) -> None:
    s.resources.put_table(table)
    assert federated_advance(JOB) == Phase.training.value
    requests = train_requests(s)
    assert sorted(requests) == ["a", "b"] and {r.round for r in requests.values()} == {1}
    assert federated_advance(JOB) == Phase.training.value and len(train_requests(s)) == 2  # again: nothing new sent

    bind("a")
    assert federated_train(requests["a"]) == Accepted.accepted.value
    accepted, _ = s.federated.updates(JOB, s.federated.state(JOB))
    weights = accepted["a"].weights
    assert federated_train(requests["a"]) == Accepted.duplicate.value  # delivered again: nothing trains, nothing is removed
    assert artifact_path(weights, context.settings().artifact_dir)[0].is_file()
    forged = requests["a"].model_copy(update={"local_steps": 300})
    assert federated_train(forged) == Accepted.not_assigned.value
    lines = [e.message for e in s.federated.events(JOB) if e.device_id == "a"]
    assert lines[-2:] == ["round 1: its training was delivered again; the update is in already",
                          f"refused: round 1 does not assign a b={forged.batch_size} f={forged.frequency_hz} x300"]  # fmt: skip

    bind("b")
    assert federated_train(requests["b"]) == Accepted.accepted.value
    assert federated_advance(JOB) == Phase.aggregating.value
    (aggregate,) = queued_tasks(s.broker, SERVER_QUEUE)
    assert aggregate.name == TaskName.federated_aggregate.value
    assert [t.task_id for t in s.ledger.unseen_since(float("inf"), 10)] == [aggregate.id]  # written down with the close

    accuracy = federated_aggregate(AggregateRequest(job_id=JOB, round=1))
    state = s.federated.state(JOB)
    assert state.phase == Phase.aggregated and state.accuracy == accuracy and state.global_weights.startswith("artifact:fed-")
    (done,) = s.federated.rounds(JOB)
    assert sorted(d.assignment.device_id for d in done.devices) == ["a", "b"] and done.missing == []
    assert not artifact_path(weights, context.settings().artifact_dir)[0].exists()  # the updates' files are gone with the round
    assert federated_aggregate(AggregateRequest(job_id=JOB, round=1)) is None  # aggregated once

    bind("a")
    assert federated_train(requests["a"]) == Accepted.late.value  # its round closed
    assert federated_advance(JOB) == Phase.training.value and s.federated.state(JOB).round == 2


def test_a_fednova_job_is_aggregated_by_the_server_with_normalized_averaging(s, table) -> None:
    job = "fedtasknova1"
    capped = [SPEC.devices[0].model_copy(update={"power_cap_w": 2.5}), SPEC.devices[1]]  # a: b=16 at 2.5 W, b: b=32
    nova = SPEC.model_copy(update={"aggregation": Aggregation(rule="fednova"), "devices": capped})
    s.federated.create(FederatedRecord(job_id=job, spec=nova))
    s.resources.put_table(table)
    federated_advance(job)
    requests = {r.device_id: r for r in train_requests(s).values() if r.job_id == job}
    for device_id in ("a", "b"):
        bind(device_id)
        assert federated_train(requests[device_id]) == Accepted.accepted.value
    assert federated_advance(job) == Phase.aggregating.value
    accepted, _ = s.federated.updates(job, s.federated.state(job))
    work = {d: local_work(nova.lr, u.trained.assignment, u.held_samples) for d, u in accepted.items()}
    assert work["a"] == pytest.approx(work["b"] / 2**0.5)  # 3 steps each, at lr_16 = lr_32 / sqrt(2)
    start = {k: v.detach().clone() for k, v in initial_model(nova.model, nova.weights, 10).state_dict().items()}
    updates = [
        Update(get_state(u.weights, context.settings().artifact_dir), u.held_samples, u.trained.assignment) for u in accepted.values()
    ]
    federated_aggregate(AggregateRequest(job_id=job, round=1))
    merged = get_state(s.federated.state(job).global_weights, context.settings().artifact_dir)
    expected, plain = aggregate(nova, start, updates), aggregate(SPEC, start, updates)
    assert all(torch.allclose(merged[k], expected[k]) for k in expected)
    assert not all(torch.allclose(merged[k], plain[k]) for k in plain)  # not FedAvg
    (done,) = s.federated.rounds(job)
    assert set(done.device_accuracy) == {"a", "b"} and done.fairness().worst <= done.fairness().mean


def test_a_profile_that_failed_for_the_job_fails_it_instead_of_being_claimed_again(s, table) -> None:
    assert federated_advance(JOB) == Phase.starting.value  # no table: waits for it
    (profile,) = queued_tasks(s.broker, device_queue("a"))
    assert profile.name == TaskName.profile_device.value
    assert s.federated.state(JOB).notice == f"waiting for the lookup tables of {TWIN}"
    resource = table_resource(table_id(TWIN, SPEC.model, get_model(SPEC.model).input_shape))
    s.coordination.settle(resource, lambda jobs: [], reason="profiling failed: the board overheated")
    assert federated_advance(JOB) == Phase.failed.value
    assert s.federated.state(JOB).reason == f"no lookup table: {TWIN}: profiling failed: the board overheated"
    assert len(queued_tasks(s.broker, device_queue("a"))) == 1  # not claimed again


def test_a_cancel_asked_for_is_applied_by_the_next_advance(s, table) -> None:
    s.resources.put_table(table)
    federated_advance(JOB)
    s.federated.request_cancel(JOB)
    assert federated_advance(JOB) == Phase.cancelled.value
    bind("a")
    assert federated_train(train_requests(s)["a"]) == Accepted.late.value
    assert s.federated.active() == []


def files() -> list[str]:
    """The artifact store's files, by name."""
    folder = context.settings().artifact_dir
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def name_of(weights: str) -> str:
    return artifact_path(weights, context.settings().artifact_dir)[0].name


def work_requests(s, job: str, devices: tuple[str, ...] = ("a", "b")) -> dict[int, TrainRequest]:
    """The buffered job's works sent to `devices`, by number."""
    sent = [TrainRequest.model_validate(t.args[0]) for d in devices for t in queued_tasks(s.broker, device_queue(d))]
    return {r.work: r for r in sent if r.job_id == job and r.work is not None}


def test_a_round_closed_without_an_update_keeps_the_global_model_and_the_job_goes_on(s, table) -> None:
    """No device handed its update in by the deadline (the round closed as the planner closes it
    then): the aggregation keeps the global model, stores none, and the round counts as empty."""
    s.resources.put_table(table)
    assert federated_advance(JOB) == Phase.training.value
    s.federated.apply(JOB, RoundClosed(round=1))
    accuracy = federated_aggregate(AggregateRequest(job_id=JOB, round=1))
    state = s.federated.state(JOB)
    assert (state.phase, state.global_weights, state.empty_rounds, state.accuracy) == (Phase.aggregated, SPEC.weights, 1, accuracy)
    (done,) = s.federated.rounds(JOB)
    assert done.devices == [] and done.missing == ["a", "b"] and files() == []
    assert federated_advance(JOB) == Phase.training.value and s.federated.state(JOB).round == 2


def test_the_newest_global_model_stays_when_the_artifact_store_is_reached_through_a_link(s, table, redis_server, tmp_path) -> None:
    """EDGETRAIN_ARTIFACT_DIR names a link to the folder: each aggregation keeps its new global
    model and deletes the one it superseded."""
    (tmp_path / "store").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "store")
    context.init(Settings(redis_url=redis_server.url, artifact_dir=tmp_path / "link"),
                 ("edgetrain.tasks.federated", "edgetrain.tasks.federated_work"))  # fmt: skip
    s.resources.put_table(table)
    for r in (1, 2):
        assert federated_advance(JOB) == Phase.training.value
        for device_id, request in train_requests(s).items():
            bind(device_id)
            federated_train(request)
        assert federated_advance(JOB) == Phase.aggregating.value
        federated_aggregate(AggregateRequest(job_id=JOB, round=r))
        newest = s.federated.state(JOB).global_weights
        assert get_state(newest, tmp_path / "link") and files() == [name_of(newest)]


def test_a_device_named_like_a_global_model_keeps_its_buffered_update(s, table) -> None:
    """Device `b-global`'s update joins the next buffer while aggregation 1 runs; storing and
    pruning aggregation 1's global model leaves it, and aggregation 2 takes it."""
    job = "fedtaskglob1"
    devices = [SPEC.devices[0], SPEC.devices[1].model_copy(update={"device_id": "b-global"})]
    spec = SPEC.model_copy(update={"aggregation": Aggregation(mode="buffered", buffer_size=1), "max_rounds": 5, "devices": devices})
    s.fleet.register(device_info("b-global", SimulatedDevice(load_twin(TWIN))), ttl_s=60, instance="test")
    s.federated.create(FederatedRecord(job_id=job, spec=spec))
    s.resources.put_table(table)
    federated_advance(job)
    sent = work_requests(s, job, ("a", "b-global"))
    bind("a")
    assert federated_train(sent[1]) == Accepted.accepted.value
    federated_advance(job)  # aggregation 1 takes a's update
    bind("b-global")
    assert federated_train(sent[2]) == Accepted.accepted.value
    assert federated_aggregate(AggregateRequest(job_id=job, round=1)) is not None
    federated_advance(job)  # aggregation 2 takes b-global's
    assert federated_aggregate(AggregateRequest(job_id=job, round=2)) is not None
    assert [w for r in s.federated.rounds(job) for w in r.works] == [1, 2]


def test_a_buffered_job_cancelled_leaves_only_its_last_global_model(s, table) -> None:
    """Buffer of 1: b's second work starts from aggregation 1's model, a's second update is being
    aggregated and a third work runs from aggregation 2's when the job is cancelled: the cleanup
    sent with the cancel (written in the ledger) deletes the update and the superseded model."""
    job = "fedtaskend01"
    spec = SPEC.model_copy(update={"aggregation": Aggregation(mode="buffered", buffer_size=1), "max_rounds": 5})
    s.federated.create(FederatedRecord(job_id=job, spec=spec))
    s.resources.put_table(table)
    federated_advance(job)  # works 1 (a) and 2 (b)
    bind("a")
    assert federated_train(work_requests(s, job)[1]) == Accepted.accepted.value
    federated_advance(job)  # aggregation 1 takes a#1; a starts work 3
    bind("b")
    assert federated_train(work_requests(s, job)[2]) == Accepted.accepted.value
    federated_aggregate(AggregateRequest(job_id=job, round=1))
    federated_advance(job)  # aggregation 2 takes b#2; b starts work 4 from aggregation 1's model
    bind("a")
    assert federated_train(work_requests(s, job)[3]) == Accepted.accepted.value
    federated_aggregate(AggregateRequest(job_id=job, round=2))
    federated_advance(job)  # aggregation 3 takes a#3; a starts work 5
    state = s.federated.state(job)
    assert (list(state.aggregating), [(w.work, w.round) for w in state.in_flight]) == (["a#3"], [(4, 2), (5, 3)])
    assert len(files()) == 3  # aggregation 1's model (work 4 starts from it), aggregation 2's, a#3's change
    s.federated.request_cancel(job)
    assert federated_advance(job) == Phase.cancelled.value
    (cleanup,) = [t for t in queued_tasks(s.broker, SERVER_QUEUE) if t.name == TaskName.federated_cleanup.value]
    assert cleanup.args == [job] and cleanup.id in [t.task_id for t in s.ledger.unseen_since(float("inf"), 20)]
    assert federated_cleanup(job) == 2 and files() == [name_of(state.global_weights)]
    assert federated_aggregate(AggregateRequest(job_id=job, round=3)) is None and files() == [name_of(state.global_weights)]


def test_a_job_cancelled_mid_round_leaves_no_update(s, table) -> None:
    """a's update is in when the round's job is cancelled: the cleanup deletes it."""
    s.resources.put_table(table)
    federated_advance(JOB)
    bind("a")
    assert federated_train(train_requests(s)["a"]) == Accepted.accepted.value and len(files()) == 1
    s.federated.request_cancel(JOB)
    assert federated_advance(JOB) == Phase.cancelled.value
    assert federated_cleanup(JOB) == 1 and files() == []


def test_a_buffered_job_aggregates_every_k_updates_while_its_devices_train_on(s, table) -> None:
    """Buffer of 1 over two devices: a's update closes the buffer at once and a starts its next
    work while the server aggregates; b's update, from the model before it, joins the next
    buffer with staleness 1; a second delivery of a's work is never aggregated twice."""
    job = "fedtaskbuf01"
    spec = SPEC.model_copy(update={"aggregation": Aggregation(mode="buffered", buffer_size=1), "max_rounds": 5})
    s.federated.create(FederatedRecord(job_id=job, spec=spec))
    s.resources.put_table(table)

    def requests() -> dict[int, TrainRequest]:
        return work_requests(s, job)

    assert federated_advance(job) == Phase.training.value
    first = requests()
    assert sorted((r.work, r.device_id, r.round) for r in first.values()) == [(1, "a", 1), (2, "b", 1)]
    bind("a")
    assert federated_train(first[1]) == Accepted.accepted.value
    assert federated_advance(job) == Phase.training.value  # the buffer closes, and a starts again at once
    state = s.federated.state(job)
    assert list(state.aggregating) == ["a#1"] and [(w.work, w.device_id) for w in state.in_flight] == [(2, "b"), (3, "a")]
    (aggregate,) = [t for t in queued_tasks(s.broker, SERVER_QUEUE) if t.args[0]["job_id"] == job]
    assert aggregate.args[0]["round"] == 1 and aggregate.id in [t.task_id for t in s.ledger.unseen_since(float("inf"), 10)]
    assert federated_train(first[1]) == Accepted.duplicate.value  # delivered again while its buffer is aggregated
    bind("b")
    assert federated_train(first[2]) == Accepted.accepted.value  # joins the next buffer meanwhile
    assert federated_aggregate(AggregateRequest(job_id=job, round=1)) is not None
    assert federated_aggregate(AggregateRequest(job_id=job, round=1)) is None  # aggregated once
    bind("a")
    assert federated_train(first[1]) == Accepted.late.value  # long aggregated: trains nothing
    federated_advance(job)
    assert federated_aggregate(AggregateRequest(job_id=job, round=2)) is not None
    one, two = s.federated.rounds(job)
    assert [d.assignment.device_id for d in one.devices] == ["a"] and (one.staleness, one.works) == ([0], [1])
    assert [d.assignment.device_id for d in two.devices] == ["b"] and (two.staleness, two.works) == (
        [1],
        [2],
    )  # b trained the model before aggregation 1
    assert two.elapsed_s >= one.elapsed_s and s.federated.state(job).round == 2
    third = requests()[3]  # a's second work started from aggregation 0's model, pinned while in flight
    assert third.round == 1 and federated_train(third) == Accepted.accepted.value


def test_a_buffered_work_dropped_at_its_deadline_counts_on_its_device_s_clock_and_in_the_next_aggregation(s, table) -> None:
    """b's work expires (the planner's step at its deadline, applied as the control worker applies
    it): b's next work starts on its clock moved on by the time its table expects of the dropped
    work, and the aggregation of a's update counts the dropped work's expected energy."""
    job = "fedtaskdrop1"
    spec = SPEC.model_copy(update={"aggregation": Aggregation(mode="buffered", buffer_size=1), "max_rounds": 5})
    s.federated.create(FederatedRecord(job_id=job, spec=spec))
    s.resources.put_table(table)
    assert federated_advance(job) == Phase.training.value
    a_work, b_work = s.federated.state(job).in_flight
    s.federated.apply(job, WorkExpired(works=[b_work.work]))
    assert s.federated.state(job).device_clock_s == {"b": b_work.assignment.expected_time_s}
    bind("a")
    request = next(TrainRequest.model_validate(t.args[0]) for t in queued_tasks(s.broker, device_queue("a")) if t.args[0]["job_id"] == job)
    assert federated_train(request) == Accepted.accepted.value
    bind("b")
    stale = next(TrainRequest.model_validate(t.args[0]) for t in queued_tasks(s.broker, device_queue("b")) if t.args[0]["job_id"] == job)
    assert federated_train(stale) == Accepted.late.value  # its work was dropped: it trains nothing
    federated_advance(job)  # closes the buffer, and starts a's and b's next works
    b_next = next(w for w in s.federated.state(job).in_flight if w.device_id == "b")
    assert b_next.started_s == pytest.approx(b_work.assignment.expected_time_s)
    assert federated_aggregate(AggregateRequest(job_id=job, round=1)) is not None
    (done,) = s.federated.rounds(job)
    assert (done.works, done.dropped, done.missing) == ([a_work.work], [b_work.work], ["b"])
    lost_j = b_work.assignment.expected_energy_j
    assert lost_j and done.energy_j == pytest.approx(done.devices[0].energy_j + lost_j)
    assert s.federated.state(job).dropped == []


def test_a_work_dropped_while_its_device_loads_its_weights_stops_as_late_not_as_a_failure(s, table, monkeypatch) -> None:
    """A work passes its device's check, then passes its deadline while the device loads what it
    trains (a worker's first task loads for seconds), and the weights it started from are pruned
    with it: its training stops as late, with no failure in the job's events. A work still in
    flight whose weights cannot be loaded fails, saying why."""
    job = "fedtaskgone1"
    spec = SPEC.model_copy(update={"aggregation": Aggregation(mode="buffered", buffer_size=1), "max_rounds": 5})
    s.federated.create(FederatedRecord(job_id=job, spec=spec))
    s.resources.put_table(table)
    federated_advance(job)
    requests = {r.device_id: r for r in train_requests(s).values() if r.job_id == job}

    def pruned(record: FederatedRecord, weights: str) -> None:
        if record.job_id == job and requests["a"].work in [w.work for w in s.federated.state(job).in_flight]:
            s.federated.apply(job, WorkExpired(works=[requests["a"].work]))  # the planner's step at the work's deadline, meanwhile
        raise FileNotFoundError(f"{weights} is not in the artifact store")

    monkeypatch.setattr(federated_work, "_global", pruned)
    bind("a")
    assert federated_train(requests["a"]) == Accepted.late.value
    assert not [e.message for e in s.federated.events(job) if "local training failed" in e.message]
    bind("b")
    with pytest.raises(TaskFailed, match="work 2: local training failed"):
        federated_train(requests["b"])


def test_a_drift_corrected_job_keeps_each_device_s_control_variate_and_the_fleet_s_and_corrects_the_next_round(
    s, table, monkeypatch
) -> None:
    """SCAFFOLD through the tasks: each update brings its device's mean gradient, the server's
    variate is their mean, a device's next round is corrected by the difference, and a variate
    replaced, or the job's at its end, is deleted."""
    job = "fedtaskdrift"
    s.federated.create(FederatedRecord(job_id=job, spec=SPEC.model_copy(update={"aggregation": Aggregation(drift="scaffold")})))
    s.resources.put_table(table)
    folder = context.settings().artifact_dir

    def one_round(r: int) -> dict:
        assert federated_advance(job) == Phase.training.value
        requests = {d: q for d, q in train_requests(s).items() if q.job_id == job and q.round == r}
        for device_id in ("a", "b"):
            bind(device_id)
            assert federated_train(requests[device_id]) == Accepted.accepted.value
        accepted, _ = s.federated.updates(job, s.federated.state(job))
        assert federated_advance(job) == Phase.aggregating.value
        federated_aggregate(AggregateRequest(job_id=job, round=r))
        return {d: u.gradient for d, u in accepted.items()}

    brought = one_round(1)
    state = s.federated.state(job)
    assert state.drift == brought and None not in brought.values() and state.control is not None
    control, own = get_state(state.control, folder), {d: get_state(g, folder) for d, g in brought.items()}
    assert set(control) == {name for name, _ in initial_model(SPEC.model, SPEC.weights, 10).named_parameters()}
    assert all(torch.allclose(control[k], (own["a"][k] + own["b"][k]) / 2) for k in control)
    assert files() == sorted(name_of(x) for x in [state.global_weights, state.control, *brought.values()])  # the updates' weights gone

    corrections = {}
    train_round = federated_work.train_round

    def seen(*args, **kwargs):
        corrections[args[4].device_id] = args[7]
        return train_round(*args, **kwargs)

    monkeypatch.setattr(federated_work, "train_round", seen)
    one_round(2)
    assert all(torch.allclose(corrections["a"][k], control[k] - own["a"][k]) for k in control)
    after = s.federated.state(job)
    assert after.control != state.control and set(after.drift.values()).isdisjoint(brought.values())
    assert files() == sorted(name_of(x) for x in [after.global_weights, after.control, *after.drift.values()])  # round 1's deleted

    s.federated.request_cancel(job)
    assert federated_advance(job) == Phase.cancelled.value
    federated_cleanup(job)
    assert files() == [name_of(after.global_weights)]  # its result alone
