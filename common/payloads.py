"""The payload of every task and what it returns: one typed model each, shared by the code
that sends a task and the code that runs it (task names and queues: tasks/contract.py)."""

from __future__ import annotations

from pydantic import Field

from .ids import Identifier
from .keys import table_id, table_resource
from .limits import MAX_BATCH_SIZES, MAX_NAME_CHARS, BatchSize, SampleCount, Seed
from .models import Optimizer, get_model
from .schemas import (
    PAPER_BATCH_SIZES,
    BatchSizes,
    DatasetRef,
    DeviceInfo,
    DeviceTarget,
    EstimationRequest,
    JobSpec,
    LearningRatePolicy,
    Objective,
    ProfilingOptions,
    Selection,
    Strict,
)


class JobPage(Strict):
    """One page of a job's devices (`page_size` of them, in the spec's order) to advance."""

    job_id: Identifier
    page: int = Field(ge=0)


def device_page(job_id: str, position: int, page_size: int) -> JobPage:
    """The page of job `job_id` that holds the device at `position` in its list of devices."""
    return JobPage(job_id=job_id, page=position // page_size)


class ProfileRequest(Strict):
    """Profile `model` on device `device_id`: T[b][f] and P[b][f] for its device type.

    `owner` holds the claim on the table when the request is sent; a request whose owner no
    longer holds it (the claim was released after its worker was lost) is stale and skipped."""

    device_id: Identifier
    device_type: str
    owner: str = Field(description="who claimed the table's production: a job id, or the command that asked")
    model: str
    batch_sizes: BatchSizes = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    options: ProfilingOptions
    optimizer: Optimizer = Field(description="the optimizer whose step is timed: the model's own")
    power_cap_w: float | None = Field(None, gt=0, description="board power cap (W) a staircase profile is made for")
    merge: bool = Field(False, description="add the rows to the stored table instead of replacing it")


def profile_resource(request: ProfileRequest) -> str:
    """The coordination name of the table a profile request produces (claims, waiters, failures)."""
    return table_resource(table_id(request.device_type, request.model, get_model(request.model).input_shape))


def profile_request(
    device: DeviceInfo,
    owner: str,
    model: str,
    batch_sizes: list[int] | None,
    options: ProfilingOptions,
    power_cap_w: float | None,
) -> ProfileRequest:
    """The one way to ask for a profile, from a job or from `edgetrain profile run`: the step
    timed is the model's own optimizer step, so every request of a table id measures the same."""
    return ProfileRequest(
        device_id=device.device_id,
        device_type=device.device_type,
        owner=owner,
        model=model,
        batch_sizes=batch_sizes or list(PAPER_BATCH_SIZES),
        options=options,
        optimizer=get_model(model).optimizer,
        power_cap_w=power_cap_w,
    )


def job_profile_request(job_id: str, spec: JobSpec, target: DeviceTarget, device: DeviceInfo) -> ProfileRequest:
    """The profile job `job_id` needs from `device`, the device of `target`."""
    return profile_request(device, job_id, spec.model, spec.batch_sizes, spec.profiling, target.cap_at(0.0))


class ProfileResult(Strict):
    """What `profile_device` stored: the table id, how many points it measured, whether simulated."""

    table_id: str
    points_measured: int
    simulated: bool


class FinetuneRequest(Strict):
    """Fine-tune on device `device_id` with the selected (batch size, frequency) until the
    target; `target` (the device's cap, cap schedule and fixed configuration), `objective`,
    `table_id` and `vector_key` are what it re-selects with when the cap changes."""

    job_id: Identifier
    device_id: Identifier
    model: str
    weights: str
    dataset: DatasetRef
    target_accuracy: float = Field(gt=0, lt=1)
    batch_size: BatchSize
    frequency_hz: int = Field(gt=0)
    lr: LearningRatePolicy
    eval_every_samples: SampleCount
    max_samples: SampleCount
    seed: Seed
    target: DeviceTarget
    objective: Objective
    table_id: str = Field(max_length=MAX_NAME_CHARS)
    vector_key: str = Field(max_length=MAX_NAME_CHARS)


def finetune_request(
    job_id: str, spec: JobSpec, target: DeviceTarget, selection: Selection, table_id: str, vector_key: str
) -> FinetuneRequest:
    """What device `target` fine-tunes for job `job_id` with `selection`, chosen from the
    lookup table `table_id` and the relation vector `vector_key`."""
    return FinetuneRequest(
        job_id=job_id,
        device_id=target.device_id,
        model=spec.model,
        weights=spec.weights,
        dataset=spec.dataset_for(target),
        target_accuracy=spec.target_accuracy,
        batch_size=selection.batch_size,
        frequency_hz=selection.frequency_hz,
        lr=spec.lr,
        eval_every_samples=spec.eval_every_samples,
        max_samples=spec.max_samples,
        seed=spec.seeds[0],
        target=target,
        objective=spec.objective,
        table_id=table_id,
        vector_key=vector_key,
    )


class EstimateResult(Strict):
    """What `estimate_relation_vector` did: the vector's key, whether it was cached, runs dispatched."""

    vector_key: str
    cached: bool
    runs_dispatched: int


class ProxyRunRequest(Strict):
    """One proxy training run of an estimation: one batch size, one seed. `job_id` names the
    job that claimed the vector (for the run's label; None when a command asked for it)."""

    request: EstimationRequest
    batch_size: BatchSize
    seed: Seed
    job_id: Identifier | None = None


class PretrainRequest(Strict):
    """Pre-train `model` from `init:<seed>` on `dataset` for `samples` samples on the server pool."""

    model: str
    dataset: DatasetRef
    samples: SampleCount
    batch_size: BatchSize = 128
    lr: LearningRatePolicy = Field(default_factory=LearningRatePolicy)
    seed: Seed = 0


class PretrainResult(Strict):
    """Pre-trained weights in the artifact store, and their test accuracy."""

    weights: str = Field(description="artifact URL of the weights, for a job's `weights`")
    test_accuracy: float
