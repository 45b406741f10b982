"""How tasks are labelled in logs and Flower: the job they serve, and what they do."""

from edgetrain.common.payloads import FinetuneRequest, ProxyRunRequest, finetune_request, job_profile_request
from edgetrain.common.presets import quick_job
from edgetrain.common.schemas import DeviceInfo, JobSpec, Selection
from edgetrain.common.store import claim_token
from edgetrain.tasks.contract import TaskName, claiming_job, label

JOB = "3f2a9c4d1e07"
SPEC = JobSpec.model_validate(quick_job([{"device_id": "nano-7", "power_cap_w": 3.0}]))
NANO = DeviceInfo(device_id="nano-7", device_type="jetson-nano", backend="sim", frequencies_hz=[76_800_000, 921_600_000],
                  memory_bytes=2**32, simulated=True)  # fmt: skip


def body(payload) -> dict:
    return payload.model_dump(mode="json")


def test_every_task_of_a_job_is_labelled_with_the_job() -> None:
    selection = Selection(batch_size=16, frequency_hz=844_800_000, estimated_time_s=1.0, peak_power_w=2.9)
    fine_tune = finetune_request(JOB, SPEC, SPEC.devices[0], selection, "table", "vector")
    assert isinstance(fine_tune, FinetuneRequest)
    labelled = label(TaskName.finetune, body(fine_tune), setting="844.8 MHz")  # the device setting in its unit, as the CLI says it
    assert labelled == f"edgetrain.finetune[{JOB}/nano-7 planned b=16 f=844.8 MHz]"
    profile = job_profile_request(claim_token(JOB), SPEC, SPEC.devices[0], NANO)  # sent under the job's claim token
    assert label(TaskName.profile_device, body(profile)) == f"edgetrain.profile_device[{JOB}/nano-7 smallcnn]"
    run = ProxyRunRequest(request=SPEC.estimation_request(), batch_size=8, seed=1, job_id=JOB)
    assert label(TaskName.train_proxy, body(run)) == f"edgetrain.train_proxy[{JOB} b=8 seed=1]"
    estimate = body(SPEC.estimation_request())
    assert label(TaskName.estimate_relation_vector, estimate, job_id=JOB) == f"edgetrain.estimate_relation_vector[{JOB} smallcnn]"
    assert label(TaskName.advance_job, JOB) == f"edgetrain.advance_job[{JOB}]"
    assert label(TaskName.advance_page, {"job_id": JOB, "page": 2}) == f"edgetrain.advance_page[{JOB} page 2]"


def test_work_asked_for_by_a_command_is_labelled_without_a_job() -> None:
    owner = claim_token("client:host-1:4242")  # `edgetrain profile run`, `evaluate`
    assert claiming_job(owner) is None and claiming_job(claim_token(JOB)) == JOB and claiming_job(JOB) == JOB
    profile = job_profile_request(owner, SPEC, SPEC.devices[0], NANO)
    assert label(TaskName.profile_device, body(profile)) == "edgetrain.profile_device[nano-7 smallcnn]"
    run = ProxyRunRequest(request=SPEC.estimation_request(), batch_size=8, seed=1)
    assert label(TaskName.train_proxy, body(run)) == "edgetrain.train_proxy[b=8 seed=1]"
    assert label(TaskName.estimate_relation_vector, body(SPEC.estimation_request())) == "edgetrain.estimate_relation_vector[smallcnn]"


def test_a_malformed_payload_still_gets_a_label() -> None:
    assert claiming_job({"not": "a token"}) is None and claiming_job("../x/y") is None
    assert label(TaskName.profile_device, {"owner": ["x"], "device_id": "nano-7", "model": "m"}) == "edgetrain.profile_device[nano-7 m]"


def test_the_tasks_of_a_federated_round_are_labelled_with_the_job_round_and_work() -> None:
    from edgetrain.common.federated.records import AggregateRequest, TrainRequest

    train = TrainRequest(job_id=JOB, round=3, device_id="nano-7", batch_size=32, frequency_hz=921_600_000, local_steps=12)
    assert label(TaskName.federated_train, body(train)) == f"edgetrain.federated_train[{JOB}/nano-7 round 3 b=32 f=921600000 x12]"
    assert (
        label(TaskName.federated_aggregate, body(AggregateRequest(job_id=JOB, round=3))) == f"edgetrain.federated_aggregate[{JOB} round 3]"
    )
    assert label(TaskName.federated_advance, JOB) == f"edgetrain.federated_advance[{JOB}]"
