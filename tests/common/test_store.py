import time

from edgetrain.common.schemas import DeviceInfo, JobSpec, ProfileTable, RelationVector, TrainingOutcome
from edgetrain.common.store import table_id
from edgetrain.workers.demo import DEMO_JOB


def info(device_id: str) -> DeviceInfo:
    return DeviceInfo(device_id=device_id, device_type="jetson-nano", backend="sim", frequencies_hz=[1, 2], memory_bytes=4, simulated=True)


def test_fleet_registration_expires_without_heartbeat(store) -> None:
    store.register_device(info("a"), ttl_s=0.3)
    store.register_device(info("b"), ttl_s=30)
    assert [d.device_id for d in store.fleet()] == ["a", "b"]
    time.sleep(0.5)
    assert [d.device_id for d in store.fleet()] == ["b"]
    store.unregister_device("b")
    assert store.fleet() == []


def test_table_and_vector_round_trip(store) -> None:
    table = ProfileTable(
        batch_sizes=[4], frequencies_hz=[10], samples=5, time_s=[[1.0]], peak_power_w=[[None]],
        device_type="jetson-nano", model="smallcnn", input_shape=[1, 28, 28], points_measured=1,
    )  # fmt: skip
    tid = store.put_table(table)
    assert tid == table_id("jetson-nano", "smallcnn", [1, 28, 28]) == "jetson-nano:smallcnn:1x28x28"
    again = store.table(tid)
    assert again.time_s == [[1.0]] and again.peak_power_w == [[None]] and again.points_measured == 1
    assert [t.model for t in store.tables("jetson-nano")] == ["smallcnn"]
    assert store.tables("jetson-tx2-nx") == []
    vector = RelationVector(batch_sizes=[4, 8], ratios=[None, 1.0], key="k1")
    store.put_vector(vector)
    assert store.vector("k1").ratios == [None, 1.0]


def test_vector_parts_count_and_claims(store) -> None:
    outcome = TrainingOutcome(batch_size=4, seed=0, samples_to_accuracy=10, reached=True, final_accuracy=0.9, samples_processed=10, evaluations=1, wall_s=0.1)
    assert store.put_vector_part("k", outcome) == 1
    assert store.put_vector_part("k", outcome) == 1  # a redelivered part counts once
    assert store.put_vector_part("k", outcome.model_copy(update={"seed": 1})) == 2
    assert store.claim("r", "job1") and not store.claim("r", "job2")
    store.add_waiter("r", "job1")
    store.add_waiter("r", "job2")
    assert store.take_waiters("r") == ["job1", "job2"] and store.take_waiters("r") == []
    store.fail("r", "broken")
    assert store.failure("r") == "broken" and store.claim("r", "job3")


def test_job_record_and_status(store) -> None:
    spec = JobSpec.model_validate(DEMO_JOB)
    store.create_job("j1", spec)
    status = store.status("j1")
    assert status.state.value == "queued"
    assert set(status.parts) == {"nano-1", "tx2nx-1"}
    store.set_progress("j1", "nano-1", samples=10, accuracy=0.5)
    assert store.status("j1").progress == {"nano-1": {"samples": 10.0, "accuracy": 0.5}}
    assert store.status("missing") is None
