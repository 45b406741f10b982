"""Tasks on the `server` queue: relation-vector estimation, fanned out per (batch size, seed)."""

from __future__ import annotations

from celery import Task

from edgetrain.common.estimation import aggregate, pretrain as run_pretrain, train_proxy as run_proxy, vector_key
from edgetrain.common.schemas import DatasetRef, EstimationRequest, LearningRatePolicy
from edgetrain.common.settings import get_settings

from .app import SERVER_QUEUE, app
from .context import attempts_exceeded, store
from .workflow import fail_resource, notify_waiters, vector_resource


@app.task(name="edgetrain.estimate_relation_vector")
def estimate_relation_vector(request: dict) -> dict:
    """Fan out one `train_proxy` task per (batch size, seed); returns at once. The last part
    to finish aggregates the vector, so adding server workers shortens the estimation."""
    req = EstimationRequest.model_validate(request)
    key = vector_key(req)
    cached = store().vector(key)
    if cached is not None:
        notify_waiters(vector_resource(key))
        return {"vector": key, "cached": True}
    done = {(o.batch_size, o.seed) for o in store().vector_parts(key)}
    parts = [(b, seed) for b in req.batch_sizes for seed in req.seeds if (b, seed) not in done]
    for b, seed in parts:
        train_proxy.apply_async(args=[request, b, seed], queue=SERVER_QUEUE)
    return {"vector": key, "parts": len(parts)}


@app.task(name="edgetrain.train_proxy", bind=True)
def train_proxy(self: Task, request: dict, batch_size: int, seed: int) -> dict:
    """Train on the proxy dataset with one batch size and seed until the target accuracy."""
    req = EstimationRequest.model_validate(request)
    key = vector_key(req)
    resource = vector_resource(key)
    s = store()
    if attempts_exceeded(self.request.id):
        fail_resource(resource, f"proxy training b={batch_size} seed={seed} was interrupted too many times (worker lost)")
        return {"failed": "worker lost"}
    try:
        outcome = run_proxy(req, batch_size, seed).model_copy(update={"worker": self.request.hostname})
    except Exception as exc:
        fail_resource(resource, f"relation vector estimation failed (b={batch_size}, seed={seed}): {exc}")
        raise
    count = s.put_vector_part(key, outcome)
    if count == len(req.batch_sizes) * len(req.seeds) and s.claim(f"aggregate:{key}", self.request.id):
        s.put_vector(aggregate(req, s.vector_parts(key)))
        s.release(resource)
        notify_waiters(resource)
    return outcome.model_dump(mode="json")


@app.task(name="edgetrain.pretrain")
def pretrain(model: str, dataset: dict, samples: int, batch_size: int = 128, lr: dict | None = None, seed: int = 0) -> dict:
    """Pre-train on the server and publish the weights; returns their URL for job specs."""
    url, accuracy = run_pretrain(
        model, DatasetRef.model_validate(dataset), samples, batch_size,
        LearningRatePolicy.model_validate(lr or {}), seed, get_settings().artifact_dir,
    )  # fmt: skip
    return {"weights": url, "test_accuracy": accuracy}
