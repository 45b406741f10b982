"""Federated jobs on real workers: rounds through the control, device and server queues, with a
device killed mid-round, a device frozen past the round's deadline, and the control worker
restarted while a round is aggregated. One cluster of three twins serves the module."""

import json
import re
import signal
import statistics
import time

import pytest

from edgetrain.common.datasets import DatasetMissingError, locate
from edgetrain.common.federated.records import FederatedStatus, TrainRequest
from edgetrain.common.schemas import utc_now
from edgetrain.common.security import artifact_path
from edgetrain.common.settings import Settings
from edgetrain.tasks.app import producer_app
from edgetrain.tasks.client import EdgeTrainClient, poll_until
from edgetrain.tasks.contract import TaskName, device_queue, send
from edgetrain.workers.cli import main
from edgetrain.workers.cli_args import ExitCode
from edgetrain.workers.processes.cluster import LocalCluster

pytestmark = pytest.mark.e2e
FLEET = {"nano-f": "sim:jetson-nano", "tx2-f": "sim:jetson-tx2-nx", "orin-f": "sim:jetson-agx-orin"}
CAPS = {"nano-f": 5.0, "tx2-f": 10.0, "orin-f": 30.0}
ENDED = ("completed", "failed", "cancelled")


def spec(target: float = 0.8, deadline_s: float = 60.0, max_rounds: int = 12, **extra) -> dict:
    """Three devices on Dirichlet shares of `digits`, smallcnn from a seeded start."""
    return {
        "kind": "federated", "model": "smallcnn", "dataset": {"name": "digits"}, "test_dataset": {"name": "digits"},
        "partition": {"scheme": "dirichlet", "alpha": 1.0}, "target_accuracy": target, "batch_sizes": [16, 32, 64],
        "devices": [{"device_id": d, "power_cap_w": c} for d, c in CAPS.items()], "max_rounds": max_rounds,
        "local": {"local_steps": 8}, "participation": {"deadline_s": deadline_s}, **extra,
    }  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("federated"), devices=FLEET) as running:
        yield running


def rounds_are_whole(status: FederatedStatus) -> None:
    """Every round aggregated once, in order, each device at most once, and never a device whose
    update was missing."""
    rounds = status.rounds
    assert [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    for r in rounds:
        ids = [d.assignment.device_id for d in r.devices]
        assert len(ids) == len(set(ids)) and not set(ids) & set(r.missing), r


def test_a_federated_job_trains_one_model_in_rounds_to_its_target(cluster, tmp_path, capsys) -> None:
    client = EdgeTrainClient(cluster.url)
    path = tmp_path / "federated.json"
    path.write_text(json.dumps(spec()))
    assert main(["submit", str(path), "--wait", "--timeout", "300", "--redis-url", cluster.url]) == ExitCode.ok
    out, err = capsys.readouterr()
    job_id = out.splitlines()[0]
    assert "round 1: global accuracy" in err and f"federated job {job_id}: completed" in out
    assert "SIMULATED" in out
    assert re.search(r"round \d+, the global model on each device's held-out data: mean 0\.\d+, worst 0\.\d+ \((nano|tx2|orin)-f\)", out)
    assert main(["status", job_id, "--json", "--redis-url", cluster.url]) == ExitCode.ok
    assert json.loads(capsys.readouterr().out)["state"]["phase"] == "completed"
    assert main(["cancel", job_id, "--redis-url", cluster.url]) == ExitCode.finished
    capsys.readouterr()
    assert main(["jobs", "--redis-url", cluster.url]) == ExitCode.ok
    assert re.search(
        rf"^{job_id}  completed .* 3 device\(s\) .* federated, round \d+, global accuracy 0\.[89]", capsys.readouterr().out, re.M
    )
    status = client.federated_status(job_id)
    state, rounds = status.state, status.rounds
    assert state.phase == "completed", (state.reason, [e.line() for e in status.events])
    assert state.accuracy >= 0.8 and rounds[-1].accuracy == state.accuracy
    rounds_are_whole(status)
    assert all(set(r.device_accuracy) == set(FLEET) for r in rounds)  # every device scored in every round, taking part or not
    first = {d.assignment.device_id: d.assignment for d in rounds[0].devices}
    assert set(first) == set(FLEET) and all(d.simulated for r in rounds for d in r.devices)
    # time-balanced: the capped Nano trains fewer steps than the Orin, for about the same device time
    assert first["nano-f"].local_steps < first["orin-f"].local_steps
    times = [d.device_time_s for d in rounds[0].devices]
    assert max(times) < 2.5 * min(times), times
    assert rounds[-1].elapsed_s == pytest.approx(sum(r.device_time_s for r in rounds)) == pytest.approx(state.elapsed_s)


def test_a_fednova_job_with_partial_work_to_the_deadline_trains_to_its_target_on_the_workers(cluster, capsys) -> None:
    client = EdgeTrainClient(cluster.url)
    job_id = client.submit(spec() | {"aggregation": {"rule": "fednova"}, "local": {"method": "baseline1-deadline", "local_steps": 8}})
    status = client.wait_federated(job_id, timeout_s=300)
    assert status.state.phase == "completed", (status.state.reason, [e.line() for e in status.events])
    rounds_are_whole(status)
    first = {d.assignment.device_id: d.assignment for d in status.rounds[0].devices}
    assert {a.strategy for a in first.values()} == {"baseline1"} and first["nano-f"].local_steps < first["orin-f"].local_steps
    assert main(["status", job_id, "--redis-url", cluster.url]) == ExitCode.ok
    assert "3 devices, baseline1-deadline local work, fednova" in capsys.readouterr().out


def test_a_drift_corrected_job_trains_to_its_target_on_the_workers_and_leaves_only_its_result(cluster, capsys) -> None:
    """SCAFFOLD through the queues: every update brings its device's control variate, the server
    keeps the fleet's, and once the job ends only its global model is left."""
    client = EdgeTrainClient(cluster.url)
    job_id = client.submit(spec() | {"aggregation": {"drift": "scaffold"}})
    status = client.wait_federated(job_id, timeout_s=300)
    assert status.state.phase == "completed", (status.state.reason, [e.line() for e in status.events])
    rounds_are_whole(status)
    heard = {d.assignment.device_id for r in status.rounds for d in r.devices}
    assert status.state.control is not None and set(status.state.drift) == heard
    assert main(["status", job_id, "--redis-url", cluster.url]) == ExitCode.ok
    assert "3 devices, edgetrain local work, fedavg, drift-corrected (SCAFFOLD)" in capsys.readouterr().out
    folder = Settings(redis_url=cluster.url, redis_url_file=None).artifact_dir  # the workers' (they inherit this environment)
    last = [artifact_path(status.state.global_weights, folder)[0].name]
    poll_until(lambda: sorted(p.name for p in folder.glob(f"fed-{job_id}-*")) == last or None, 60, 0.2, "all but the result deleted")


def test_a_fleet_power_budget_holds_every_round_on_the_workers(cluster, capsys) -> None:
    """Under 12 W across the three twins (their time-balanced rounds draw more), every round's
    expected energy stays within 12 W over the round's time budget (at most its longest
    device's time and a step), chosen by progress per joule, and the job reaches its target."""
    client = EdgeTrainClient(cluster.url)
    job_id = client.submit(spec() | {"local": {"local_steps": 8, "fleet_power_w": 12.0}})
    status = client.wait_federated(job_id, timeout_s=300)
    assert status.state.phase == "completed", (status.state.reason, [e.line() for e in status.events])
    rounds_are_whole(status)
    for r in status.rounds:
        plan = [d.assignment for d in r.devices]
        assert {a.strategy for a in plan} == {"fleet_power"}, plan
        longest_s = max(a.expected_time_s + a.expected_time_s / a.local_steps for a in plan)
        assert sum(a.expected_energy_j or 0.0 for a in plan) <= 12.0 * longest_s, plan
    assert main(["status", job_id, "--redis-url", cluster.url]) == ExitCode.ok
    assert "3 devices, edgetrain local work within a fleet power budget of 12 W, fedavg" in capsys.readouterr().out


def test_a_malformed_federated_spec_is_refused_with_every_bad_field_and_nothing_stored(cluster, tmp_path, capsys) -> None:
    before = cluster.store().federated.job_ids()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec() | {"partition": {"scheme": "dirichlet", "alpha": -1}, "max_rounds": 0}))
    assert main(["submit", str(path), "--redis-url", cluster.url]) == ExitCode.usage
    err = capsys.readouterr().err
    assert "partition.alpha" in err and "max_rounds" in err
    assert cluster.store().federated.job_ids() == before


def test_a_test_set_that_is_not_on_the_server_fails_the_job_with_the_reason(cluster) -> None:
    try:
        locate("svhn")
        pytest.skip("SVHN is on this machine: the test needs a registered dataset that is not")
    except DatasetMissingError:
        pass
    client = EdgeTrainClient(cluster.url)
    job_id = client.submit(spec(deadline_s=5.0) | {"test_dataset": {"name": "svhn"}})  # not fetched here
    status = client.wait_federated(job_id, timeout_s=120)
    assert status.state.phase == "failed" and "round 1: aggregation failed" in status.state.reason, status.state.reason
    assert "svhn" in status.state.reason
    failed = [e.message for e in status.events if "local training failed" in e.message]
    assert {e.device_id for e in status.events if "local training failed" in e.message} == set(FLEET), failed


def test_a_killed_device_misses_its_round_and_rejoins_a_later_one(cluster) -> None:
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    job_id = client.submit(spec(target=0.97, deadline_s=12.0, max_rounds=40))
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round >= 2 or None, 180, 0.2, "round 2")
    cluster.kill("device-nano-f")
    killed_in = store.federated.state(job_id).round
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round >= killed_in + 2 or None, 180, 0.5, "two more rounds")
    cluster.restart("device-nano-f")
    status = client.wait_federated(job_id, timeout_s=400)
    rounds_are_whole(status)
    missed = [r.round for r in status.rounds if "nano-f" in r.missing]
    assert missed, "the killed device's round closed without it"
    after = [r.round for r in status.rounds if r.round > max(missed) and "nano-f" in {d.assignment.device_id for d in r.devices}]
    assert after, f"the device rejoined after round {max(missed)}: {[e.line() for e in status.events]}"
    for r in status.rounds:  # no round waited much past its deadline for the dead device
        assert r.devices, r


def test_a_frozen_device_does_not_stall_a_round_past_its_deadline_and_its_late_update_is_discarded(cluster) -> None:
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    deadline_s = 10.0
    job_id = client.submit(spec(target=0.97, deadline_s=deadline_s, max_rounds=40))
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round >= 2 and s.phase == "training" or None, 180, 0.05, "round 2")
    frozen = cluster.worker("device-tx2-f")
    frozen.signal(signal.SIGSTOP)
    frozen_in = store.federated.state(job_id).round
    opened = time.monotonic()
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round > frozen_in or None, deadline_s + 30, 0.2, "the next round")
    assert time.monotonic() - opened < deadline_s + 15
    frozen.signal(signal.SIGCONT)
    status = client.wait_federated(job_id, timeout_s=400)
    rounds_are_whole(status)
    round_of = next(r for r in status.rounds if r.round == frozen_in)
    if "tx2-f" in round_of.missing:  # frozen before it handed its update in: when it woke, its update was refused
        lines = [e.message for e in status.events if e.device_id == "tx2-f"]
        late = [m for m in lines if f"round {frozen_in}:" in m]
        assert all("discarded" in m for m in late), lines


def test_a_training_delivered_twice_or_after_its_round_closed_leaves_the_job_training_to_its_target(cluster) -> None:
    """A device runs its round's training twice (a frozen worker's task handed on, then both
    copies run): the second trains nothing and the accepted update stays whole; a copy that
    arrives after its round closed changes nothing."""
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    app = producer_app(Settings(redis_url=cluster.url, redis_url_file=None))
    holding = cluster.worker("device-tx2-f")
    holding.signal(signal.SIGSTOP)  # its update keeps round 1 open while the Nano's training runs twice
    try:
        job_id = client.submit(spec(target=0.8, max_rounds=20))
        poll_until(lambda: (s := store.federated.state(job_id)) and s.phase == "training" or None, 120, 0.05, "round 1")
        a = store.federated.state(job_id).assigned("nano-f")
        request = TrainRequest(job_id=job_id, round=1, device_id="nano-f", batch_size=a.batch_size, frequency_hz=a.frequency_hz,
                               local_steps=a.local_steps)  # fmt: skip
        send(app, TaskName.federated_train, request, device_queue("nano-f"))  # the same training, delivered again

        def both_ran() -> bool:
            lines = [e.message for e in store.federated.events(job_id) if e.device_id == "nano-f" and e.message.startswith("round 1:")]
            return len(lines) >= 2 or None

        poll_until(both_ran, 120, 0.1, "both deliveries of the Nano's training")
    finally:
        holding.signal(signal.SIGCONT)
    poll_until(lambda: (s := store.federated.state(job_id)) and (s.round >= 2 or s.phase in ENDED) or None, 180, 0.1, "round 1 aggregated")
    send(app, TaskName.federated_train, request, device_queue("nano-f"))  # after its round closed
    status = client.wait_federated(job_id, timeout_s=400)
    events = [e.line() for e in status.events]
    assert status.state.phase == "completed", (status.state.reason, events)
    rounds_are_whole(status)
    assert "nano-f" in {d.assignment.device_id for d in status.rounds[0].devices}, events


def test_restarting_the_control_worker_while_a_round_is_aggregated_loses_and_repeats_nothing(cluster) -> None:
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    job_id = client.submit(spec(target=0.9, max_rounds=30))
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round >= 2 and s.phase == "aggregating" or None, 180, 0.02,
               "an aggregation")  # fmt: skip
    cluster.kill("control")
    time.sleep(3)
    cluster.restart("control")
    status = client.wait_federated(job_id, timeout_s=400)
    assert status.state.phase == "completed", status.state.reason
    rounds_are_whole(status)


def test_a_cap_set_on_a_device_or_scheduled_rebalances_the_rounds_from_the_next_one(cluster) -> None:
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    job = spec(target=0.99, max_rounds=40)
    job["devices"][1]["power_cap_schedule"] = [[3, 4.0]]  # the TX2 NX at 4 W from round 3 on
    job_id = client.submit(job)
    poll_until(lambda: (s := store.federated.state(job_id)) and s.round >= 2 or None, 180, 0.1, "round 2")
    client.set_power_cap("nano-f", 3.0)  # below the 5 W of the spec: the Nano's clock comes down
    set_in = store.federated.state(job_id).round
    poll_until(lambda: len(store.federated.rounds(job_id)) >= set_in + 1 or None, 180, 0.2, "the next round")
    client.cancel_federated(job_id)
    client.set_power_cap("nano-f", None)
    rounds = store.federated.rounds(job_id)

    def nano(r) -> object:
        return next(d.assignment for d in r.devices if d.assignment.device_id == "nano-f")

    tx2 = [next(d.assignment.power_cap_w for d in r.devices if d.assignment.device_id == "tx2-f") for r in rounds[:3]]
    assert tx2 == [10.0, 10.0, 4.0]
    before, after = nano(rounds[0]), nano(rounds[set_in])
    assert (before.power_cap_w, after.power_cap_w) == (5.0, 3.0)
    assert after.frequency_hz < before.frequency_hz or after.batch_size != before.batch_size
    # re-balanced: every device is expected to train about as long as the median device, within a step
    planned = [d.assignment for d in rounds[set_in].devices]
    middle = statistics.median(a.expected_time_s for a in planned)
    assert all(abs(a.expected_time_s - middle) <= a.expected_time_s / a.local_steps for a in planned), planned


def buffered_spec(**extra) -> dict:
    """The job of `spec`, buffered: the server aggregates every 2 updates."""
    return spec(**extra) | {"aggregation": {"mode": "buffered", "buffer_size": 2}}


def aggregations_are_whole(status: FederatedStatus) -> None:
    """Every aggregation once, in order, with a buffer's updates (2), and no work's update in two."""
    rounds = status.rounds
    assert [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    works = [w for r in rounds for w in r.works]
    assert len(works) == len(set(works)), works
    assert all(len(r.works) == len(r.devices) == len(r.staleness) == 2 for r in rounds), rounds


def test_a_buffered_job_trains_without_rounds_to_its_target_on_the_workers(cluster) -> None:
    client = EdgeTrainClient(cluster.url)
    job_id = client.submit(buffered_spec(target=0.8, max_rounds=40))
    status = client.wait_federated(job_id, timeout_s=400)
    events = [e.line() for e in status.events]
    assert status.state.phase == "completed", (status.state.reason, events)
    assert status.state.accuracy >= 0.8 and "in aggregation" in status.state.reason
    aggregations_are_whole(status)
    assert {d.assignment.device_id for r in status.rounds for d in r.devices} == set(FLEET)
    assert any(s > 0 for r in status.rounds for s in r.staleness), "devices trained on while the server aggregated"
    assert status.rounds[-1].elapsed_s == pytest.approx(status.state.elapsed_s)
    folder = Settings(redis_url=cluster.url, redis_url_file=None).artifact_dir  # the workers' (they inherit this environment)
    last = [artifact_path(status.state.global_weights, folder)[0].name]
    poll_until(lambda: sorted(p.name for p in folder.glob(f"fed-{job_id}-*")) == last or None, 60, 0.2, "all but the last model deleted")


def test_a_buffered_work_delivered_twice_is_aggregated_once(cluster) -> None:
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    app = producer_app(Settings(redis_url=cluster.url, redis_url_file=None))
    job_id = client.submit(buffered_spec(target=0.8, max_rounds=40))

    def nano_work():
        state = store.federated.state(job_id)
        return state and next((w for w in state.in_flight if w.device_id == "nano-f"), None)

    w = poll_until(nano_work, 120, 0.05, "the Nano's first work")
    a = w.assignment
    request = TrainRequest(job_id=job_id, round=w.round, device_id="nano-f", batch_size=a.batch_size, frequency_hz=a.frequency_hz,
                           local_steps=a.local_steps, work=w.work)  # fmt: skip
    send(app, TaskName.federated_train, request, device_queue("nano-f"))  # the same work, delivered again
    status = client.wait_federated(job_id, timeout_s=400)
    events = [e.line() for e in status.events]
    assert status.state.phase == "completed", (status.state.reason, events)
    aggregations_are_whole(status)
    assert sum(r.works.count(w.work) for r in status.rounds) == 1, events  # one of the two copies, once
    send(app, TaskName.federated_train, request, device_queue("nano-f"))  # after the job ended: trains nothing
    time.sleep(3)
    assert client.federated_status(job_id).rounds == status.rounds


def test_a_buffered_job_goes_on_past_a_frozen_device_and_a_restarted_control_worker(cluster) -> None:
    """The TX2 frozen: its work expires at its deadline and the others' updates fill the buffers;
    the control worker killed while a buffer is aggregated: nothing lost or aggregated twice."""
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    job_id = client.submit(buffered_spec(target=0.92, deadline_s=4.0, max_rounds=300))  # not reached before the TX2 expires
    frozen = cluster.worker("device-tx2-f")
    poll_until(lambda: (s := store.federated.state(job_id)) and s.works_sent >= 3 or None, 120, 0.05, "the first works")
    frozen.signal(signal.SIGSTOP)
    try:
        poll_until(lambda: any("no update by the deadline" in e.message for e in store.federated.events(job_id)) or None, 60, 0.2,
                   "the frozen device's work expired")  # fmt: skip
        done = len(store.federated.rounds(job_id))
        poll_until(lambda: len(store.federated.rounds(job_id)) >= done + 2 or None, 120, 0.2, "aggregations without the TX2")
    finally:
        frozen.signal(signal.SIGCONT)
    poll_until(lambda: (s := store.federated.state(job_id)) and (s.aggregating or s.phase in ENDED) or None, 120, 0.02, "an aggregation")
    cluster.kill("control")
    time.sleep(3)
    cluster.restart("control")
    status = client.wait_federated(job_id, timeout_s=400)
    assert status.state.phase == "completed", (status.state.reason, [e.line() for e in status.events])
    aggregations_are_whole(status)


def test_a_buffered_job_goes_on_past_a_killed_device_and_aggregates_its_work_again_once_it_is_restarted(cluster) -> None:
    """The Nano's worker killed (SIGKILL) with a work in flight: the work expires at its deadline,
    moving the Nano's clock on by the device time its table expects and counted in the next
    aggregation, while the others' updates fill the buffers; the Nano's worker restarted, its
    works are aggregated again and the job reaches its target, no work aggregated twice or both
    dropped and aggregated; a work of the Nano dropped while its restarted worker loads (its
    first task loads for seconds) is late, not a failure. A worker takes seconds to start, in
    which the other two alone would take the job to its target: the control worker is down
    while the Nano's starts (the job waits), and two local steps a work (about 90 aggregations
    to the target) keep the target far off until the Nano's updates come in again."""
    client, store = EdgeTrainClient(cluster.url), cluster.store()
    job_id = client.submit(buffered_spec(target=0.95, deadline_s=4.0, max_rounds=300, local={"local_steps": 2}))

    def nano_work():
        state = store.federated.state(job_id)
        return state and next((w for w in state.in_flight if w.device_id == "nano-f"), None)

    poll_until(lambda: (s := store.federated.state(job_id)) and s.works_sent >= 3 or None, 120, 0.05, "the first works")
    cluster.kill("device-nano-f")
    lost = poll_until(nano_work, 30, 0.05, "a work of the killed Nano")  # in flight at the kill, or started while it is heard from
    gone = poll_until(lambda: (s := store.federated.state(job_id)) and not s.work(lost.work) and s or None, 60, 0.1, "its deadline")
    assert gone.device_clock_s["nano-f"] >= lost.started_s + lost.assignment.expected_time_s  # the dropped work's time counts
    done = len(store.federated.rounds(job_id))
    poll_until(lambda: len(store.federated.rounds(job_id)) >= done + 2 or None, 120, 0.2, "aggregations without the Nano")
    cluster.kill("control")  # the job waits while the Nano's worker starts again
    restarted_at = utc_now()
    cluster.restart("device-nano-f", wait=False)
    poll_until(lambda: (d := store.fleet.devices_by_id(["nano-f"]).get("nano-f")) and d.registered_at > restarted_at or None, 120, 0.2,
               "the Nano's worker registered again")  # fmt: skip
    cluster.restart("control")
    status = client.wait_federated(job_id, timeout_s=400)
    events = [e.line() for e in status.events]
    assert status.state.phase == "completed", (status.state.reason, events)
    aggregations_are_whole(status)
    dropped = [w for r in status.rounds for w in r.dropped]
    assert lost.work in dropped and len(dropped) == len(set(dropped)) and not set(dropped) & {w for r in status.rounds for w in r.works}
    assert all(r.energy_j > sum(d.energy_j for d in r.devices) for r in status.rounds if r.dropped), "each dropped work's energy counts"
    back = [w for r in status.rounds for d, w in zip(r.devices, r.works) if d.assignment.device_id == "nano-f" and w > lost.work]
    assert back, f"the restarted Nano's works were aggregated: {events}"
    assert not [e.message for e in store.federated.events(job_id) if "local training failed" in e.message]
