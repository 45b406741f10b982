from collections import Counter

import pytest

from edgetrain.common.jobs.state import JobState, PartState, state_of_counts
from edgetrain.common.presets import QUICK_JOB, quick_job
from edgetrain.common.schemas import LearningRatePolicy
from edgetrain.tasks.client import JobSpecError, validate_job


def spec(**changes):
    return quick_job(**changes)


def test_demo_job_is_valid() -> None:
    job = validate_job(QUICK_JOB)
    assert job.batch_sizes == [4, 8, 16, 32, 64, 128]


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"target_accuracy": 1.5}, "target_accuracy", "less than 1"),
        ({"proxy_target_accuracy": 0}, "proxy_target_accuracy", "greater than 0"),
        ({"batch_sizes": [4, 12]}, "batch_sizes", "powers of two"),
        ({"devices": []}, "devices", "at least 1"),
        ({"devices": [{"device_id": "a b", "power_cap_w": 3}]}, "devices.0.device_id", "pattern"),
        ({"devices": [{"device_id": "x", "power_cap_w": -1}]}, "devices.0.power_cap_w", "greater than 0"),
        ({"devices": [{"device_id": "x"}, {"device_id": "x"}]}, "(job)", "repeated: ['x']"),
        ({"modle": "smallcnn"}, "modle", "Extra inputs"),
        ({"model": "nosuchnet"}, "model", "registered"),
        ({"proxy_dataset": {"name": "imagenet"}}, "proxy_dataset.name", "unknown dataset 'imagenet'"),
    ],
)
def test_malformed_job_names_the_field(changes, field, words) -> None:
    with pytest.raises(JobSpecError) as err:
        validate_job(spec(**changes))
    assert field in str(err.value)
    assert words in str(err.value)


def test_the_proxy_trains_to_its_own_target_when_the_job_names_one() -> None:
    job = validate_job(spec(target_accuracy=0.8))
    assert job.estimation_request().target_accuracy == 0.8  # by default the target's
    own = validate_job(spec(target_accuracy=0.8, proxy_target_accuracy=0.9))
    assert own.estimation_request().target_accuracy == 0.9 and own.target_accuracy == 0.8
    assert own.estimation_request().model_dump(exclude={"target_accuracy"}) == job.estimation_request().model_dump(
        exclude={"target_accuracy"}
    )


def test_square_root_learning_rate_rule() -> None:
    policy = LearningRatePolicy(lr_ref=5e-4, b_ref=128)
    assert policy.lr_for(128) == pytest.approx(5e-4)
    assert policy.lr_for(32) == pytest.approx(5e-4 * 0.5)
    assert policy.lr_for(8) == pytest.approx(5e-4 * 0.25)
    assert LearningRatePolicy(rule="linear").lr_for(64) == pytest.approx(2.5e-4)


def test_job_state_is_derived_from_its_parts_states() -> None:
    def job_state(*states: PartState, cancelled: bool = False) -> JobState:
        return state_of_counts(Counter(states), cancelled)

    assert job_state(PartState.pending) == JobState.queued
    assert job_state(PartState.completed, PartState.finetuning) == JobState.running
    assert job_state(PartState.completed, PartState.queued) == JobState.running
    assert job_state(PartState.completed, PartState.queued, cancelled=True) == JobState.cancelling
    assert job_state(PartState.completed, PartState.cancelled, cancelled=True) == JobState.cancelled
    assert job_state(PartState.completed, PartState.failed) == JobState.partial
    assert job_state(PartState.failed) == JobState.failed
    assert job_state(PartState.completed) == JobState.completed
