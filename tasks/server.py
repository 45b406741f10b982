"""Tasks on the `server` queue: relation-vector estimation, fanned out per (batch size, seed),
and pre-training."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.utils.log import get_task_logger

from edgetrain.common.estimation import aggregate
from edgetrain.common.estimation import pretrain as run_pretrain
from edgetrain.common.estimation import train_proxy as run_proxy
from edgetrain.common.jobs.admission import spec_problems
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.payloads import (
    EstimateResult,
    PretrainRequest,
    PretrainResult,
    ProxyRunRequest,
)
from edgetrain.common.schemas import EstimationRequest
from edgetrain.common.security import RefusedError

from .app import app
from .context import attempts_exceeded, settings, store
from .contract import TaskFailed, TaskName, claiming_job, send_tracked
from .reporting import proxy_run_reporter
from .workflow import fail_vector, notify_waiters

logger = get_task_logger(__name__)


@app.task(name=TaskName.estimate_relation_vector.value, pydantic=True)
def estimate_relation_vector(request: EstimationRequest) -> EstimateResult:
    """Record the request, then fan out one `train_proxy` task per (batch size, seed) not yet
    run; returns at once. The last run to finish aggregates the vector, so adding server
    workers shortens the estimation. A request that names what this fleet does not allow, or
    any error here, fails the vector with the reason."""
    key = vector_key(request)
    resource = vector_resource(key)
    s = store()
    if s.resources.vector(key) is not None:
        notify_waiters(resource)
        return EstimateResult(vector_key=key, cached=True, runs_dispatched=0)
    try:
        if problems := spec_problems(request.model_dump(mode="json"), settings().allowed_model_modules):
            raise RefusedError("refused: " + "; ".join(problems))
        s.resources.put_vector_request(request)  # before any run is sent: runs of requests not stored are refused
        done = {(o.batch_size, o.seed) for o in s.resources.vector_parts(key)}
    except Exception as exc:
        reason = f"relation vector estimation failed: {exc}"
        fail_vector(key, reason)
        raise TaskFailed(reason) from exc
    runs = [(b, seed) for b, seed in grid(request) if (b, seed) not in done]
    job_id = claiming_job(s.coordination.holder(resource))
    send_tracked(
        app, s.ledger, TaskName.train_proxy, [ProxyRunRequest(request=request, batch_size=b, seed=seed, job_id=job_id) for b, seed in runs]
    )
    if not runs:  # every run is recorded, but the vector is not: its aggregation was cut short
        aggregate_when_complete(request)
    return EstimateResult(vector_key=key, cached=False, runs_dispatched=len(runs))


def grid(request: EstimationRequest) -> list[tuple[int, int]]:
    """The proxy runs of an estimation: every (batch size, seed)."""
    return [(b, seed) for b in request.batch_sizes for seed in request.seeds]


def run_refusal(run: ProxyRunRequest) -> str | None:
    """Why a proxy run is not one the server pool sent, or None: its (batch size, seed) must be
    in its request, and its request must be one sent for estimation and not yet done."""
    key = vector_key(run.request)
    if (run.batch_size, run.seed) not in grid(run.request):
        return (f"refused: b={run.batch_size} seed={run.seed} is not a run of relation vector {key} "
                f"(batch sizes {run.request.batch_sizes}, seeds {run.request.seeds})")  # fmt: skip
    if store().resources.vector_request(key) != run.request:
        return f"refused: relation vector {key} is not being estimated (its runs are sent by {TaskName.estimate_relation_vector.value})"
    return None


def estimation_ended(request: EstimationRequest) -> bool:
    """Whether the estimation of `request`'s vector ended, stored or failed, with no estimation
    of it going on since: its runs still queued or handed on need not run."""
    key = vector_key(request)
    s = store()
    if s.resources.vector_request(key) is not None:
        return False
    return s.resources.vector(key) is not None or s.coordination.failure(vector_resource(key)) is not None


def aggregate_when_complete(request: EstimationRequest) -> None:
    """Store the vector once every run of `request` is recorded, release its claim and wake
    the jobs waiting on it; nothing yet while a run is missing. Storing it twice (two last runs
    finishing together) stores the same vector. Any error fails the vector with the reason and
    forgets the runs, so that the jobs waiting on it fail at once and a later job runs them again."""
    key = vector_key(request)
    resource = vector_resource(key)
    s = store()
    try:
        parts = {(o.batch_size, o.seed): o for o in s.resources.vector_parts(key)}
        if any(run not in parts for run in grid(request)):
            return
        s.resources.put_vector(aggregate(request, [parts[run] for run in grid(request)]))
    except Exception as exc:
        reason = f"relation vector {key}: aggregating the proxy runs failed: {type(exc).__name__}: {exc}"
        fail_vector(key, reason)
        s.resources.drop_vector_parts(key)
        raise TaskFailed(reason) from exc
    s.resources.forget_vector_request(key)
    notify_waiters(resource)


# a run whose pool child died is not sent again: it fails the vector (stopped.py)
@app.task(name=TaskName.train_proxy.value, bind=True, pydantic=True, reject_on_worker_lost=False)
def train_proxy(self: Task, run: ProxyRunRequest) -> dict[str, Any] | str:
    """Train on the proxy dataset with one batch size and seed until the target accuracy; the
    result is its `TrainingOutcome` as JSON (dumped here: Celery dumps a model only for a task
    annotated to return that model alone). A run whose estimation ended (the vector is stored,
    or failed) is skipped, and its result says so (Flower shows it: the task succeeded without
    training); a run the server pool did not send (`run_refusal`) is refused and changes nothing."""
    if estimation_ended(run.request):
        skipped = f"skipped b={run.batch_size} seed={run.seed}: relation vector {vector_key(run.request)} is no longer being estimated"
        logger.info("train_proxy %s", skipped)
        return skipped
    if refusal := run_refusal(run):
        logger.warning("train_proxy: %s", refusal)
        raise TaskFailed(refusal)
    request, b, seed = run.request, run.batch_size, run.seed
    key = vector_key(request)
    s = store()
    if attempts_exceeded(self.request.id):
        reason = f"proxy training b={b} seed={seed} was interrupted too many times (worker lost)"
        fail_vector(key, reason)
        raise TaskFailed(reason)
    try:
        outcome = run_proxy(request, b, seed, proxy_run_reporter(self, key)).model_copy(update={"worker": self.request.hostname})
    except Exception as exc:
        reason = f"relation vector estimation failed (b={b}, seed={seed}): {exc}"
        fail_vector(key, reason)
        raise TaskFailed(reason) from exc
    if s.resources.put_vector_part(key, outcome) >= len(grid(request)):
        aggregate_when_complete(request)
    return outcome.model_dump(mode="json")


@app.task(name=TaskName.pretrain.value, pydantic=True)
def pretrain(request: PretrainRequest) -> PretrainResult:
    """Pre-train on the server and publish the weights; returns their URL for job specs and
    records it for identical requests (`EdgeTrainClient.pretrain` reuses it)."""
    url, accuracy = run_pretrain(
        request.model, request.dataset, request.samples, request.batch_size, request.lr, request.seed,
        settings().artifact_dir,
    )  # fmt: skip
    result = PretrainResult(weights=url, test_accuracy=accuracy)
    store().resources.put_pretrained(request, result)
    return result
