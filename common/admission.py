"""Whether a job spec may run on this fleet: every field that names code, weights or data,
checked by its form (common/security.py) without importing or reading anything, each problem
with the field named. The client checks before anything is enqueued; the control worker checks
again, against its own allow-list, before anything is dispatched."""

from __future__ import annotations

from collections.abc import Sequence

from .datasets.registry import dataset_names
from .models import model_names, unknown_model_message
from .schemas import DatasetRef, JobSpec
from .security import data_path_problem, user_model_problem, weights_problem


def model_problem(name: str, allowed_modules: Sequence[str] | None) -> str | None:
    """Why model `name` may not run, or None; `allowed_modules` None: the allow-list is not known here."""
    if name in model_names():
        return None
    if ":" not in name:
        return unknown_model_message(name)
    problem = user_model_problem(name, allowed_modules)
    return f"model: {problem}" if problem else None


def dataset_problems(field: str, ref: DatasetRef) -> list[str]:
    """Why the dataset at `field` may not be read: an unknown name, a path out of the data roots."""
    problems = []
    if ref.name not in dataset_names():
        problems.append(f"{field}.name: unknown dataset {ref.name[:100]!r}; available: {dataset_names()}")
    if ref.path is not None and (problem := data_path_problem(ref.path)):
        problems.append(f"{field}.path: {problem}")
    return problems


def job_problems(spec: JobSpec, allowed_modules: Sequence[str] | None) -> list[str]:
    """Every reason `spec` may not run, each starting with its field; empty when it may."""
    problems = [p for p in (model_problem(spec.model, allowed_modules),) if p]
    if problem := weights_problem(spec.weights):
        problems.append(f"weights: {problem}")
    refs = {"dataset": spec.dataset, "proxy_dataset": spec.proxy_dataset}
    refs.update({f"devices.{i}.dataset": d.dataset for i, d in enumerate(spec.devices) if d.dataset})
    for field, ref in refs.items():
        problems += dataset_problems(field, ref)
    return problems


def job_refusal(spec: JobSpec, allowed_modules: Sequence[str]) -> str | None:
    """Why a worker with the allow-list `allowed_modules` refuses `spec`, or None."""
    problems = job_problems(spec, allowed_modules)
    return "refused: " + "; ".join(problems) if problems else None
