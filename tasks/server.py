"""Tasks on the `server` queue: relation-vector estimation, fanned out per (batch size, seed),
and pre-training."""

from __future__ import annotations

from celery import Task
from celery.utils.log import get_task_logger

from edgetrain.common.estimation import aggregate
from edgetrain.common.estimation import pretrain as run_pretrain
from edgetrain.common.estimation import train_proxy as run_proxy
from edgetrain.common.keys import vector_key, vector_resource
from edgetrain.common.payloads import (
    EstimateResult,
    PretrainRequest,
    PretrainResult,
    ProxyRunRequest,
)
from edgetrain.common.schemas import EstimationRequest, TrainingOutcome

from .app import app
from .context import attempts_exceeded, settings, store
from .contract import TaskFailed, TaskName, send
from .workflow import fail_resource, notify_waiters

logger = get_task_logger(__name__)


@app.task(name=TaskName.estimate_relation_vector.value, pydantic=True)
def estimate_relation_vector(request: EstimationRequest) -> EstimateResult:
    """Fan out one `train_proxy` task per (batch size, seed); returns at once. The last run
    to finish aggregates the vector, so adding server workers shortens the estimation."""
    key = vector_key(request)
    s = store()
    if s.resources.vector(key) is not None:
        notify_waiters(vector_resource(key))
        return EstimateResult(vector_key=key, cached=True, runs_dispatched=0)
    done = {(o.batch_size, o.seed) for o in s.resources.vector_parts(key)}
    runs = [(b, seed) for b in request.batch_sizes for seed in request.seeds if (b, seed) not in done]
    for b, seed in runs:
        send(app, TaskName.train_proxy, ProxyRunRequest(request=request, batch_size=b, seed=seed))
    return EstimateResult(vector_key=key, cached=False, runs_dispatched=len(runs))


@app.task(name=TaskName.train_proxy.value, bind=True, pydantic=True)
def train_proxy(self: Task, run: ProxyRunRequest) -> TrainingOutcome:
    """Train on the proxy dataset with one batch size and seed until the target accuracy."""
    request, b, seed = run.request, run.batch_size, run.seed
    key = vector_key(request)
    resource = vector_resource(key)
    s = store()
    if attempts_exceeded(self.request.id):
        reason = f"proxy training b={b} seed={seed} was interrupted too many times (worker lost)"
        fail_resource(resource, reason)
        raise TaskFailed(reason)
    try:
        outcome = run_proxy(request, b, seed).model_copy(update={"worker": self.request.hostname})
    except Exception as exc:
        reason = f"relation vector estimation failed (b={b}, seed={seed}): {exc}"
        fail_resource(resource, reason)
        raise TaskFailed(reason) from exc
    count = s.resources.put_vector_part(key, outcome)
    if count == len(request.batch_sizes) * len(request.seeds) and s.coordination.once(f"aggregate:{key}"):
        s.resources.put_vector(aggregate(request, s.resources.vector_parts(key)))
        s.coordination.release(resource)
        notify_waiters(resource)
    return outcome


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
