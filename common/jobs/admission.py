"""Whether a job spec may run on this fleet: every field that names code, weights or data,
checked by its form (common/security.py) without importing or reading anything, and the task of
every dataset against the model's, each problem with the field named. The client checks before
anything is enqueued; the control worker checks again, against its own allow-list, before
anything is dispatched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..datasets.registry import DATASET_TASKS, dataset_names
from ..models import get_model, model_names, unknown_model_message
from ..schemas import DatasetRef, JobSpec
from ..security import data_path_problem, user_model_problem, weights_problem


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


def task_problem(field: str, ref: DatasetRef, model: object) -> str | None:
    """Why the dataset at `field` does not suit the registered `model` (text for an image model,
    or the reverse), or None (a user's model: its task is known once imported)."""
    if not isinstance(model, str) or model not in model_names() or ref.name not in DATASET_TASKS:
        return None
    task, takes = DATASET_TASKS[ref.name], get_model(model).task
    if task == takes:
        return None
    return f"{field}.name: {ref.name!r} is a {task} dataset; model {model!r} takes {takes} input: {dataset_names(takes)}"


def dataset_refs(raw: dict[str, Any]) -> dict[str, DatasetRef]:
    """The dataset references of a job spec (a dict, possibly invalid elsewhere), by field;
    references that are themselves malformed are left to the schema's errors."""
    values = {"dataset": raw.get("dataset"), "proxy_dataset": raw.get("proxy_dataset"), "test_dataset": raw.get("test_dataset")}
    devices = raw.get("devices")
    for i, device in enumerate(devices if isinstance(devices, list) else []):
        if isinstance(device, dict) and device.get("dataset") is not None:
            values[f"devices.{i}.dataset"] = device["dataset"]
    refs = {}
    for field, value in values.items():
        try:
            refs[field] = DatasetRef.model_validate(value)
        except ValidationError:
            continue
    return refs


def spec_problems(raw: dict[str, Any], allowed_modules: Sequence[str] | None) -> list[str]:
    """Every reason the job spec `raw` (a dict, possibly invalid elsewhere, so that all its
    problems are found in one pass) may not run, each starting with its field."""
    problems = []
    if isinstance(model := raw.get("model"), str) and (problem := model_problem(model, allowed_modules)):
        problems.append(problem)
    if isinstance(weights := raw.get("weights", "init:0"), str) and (problem := weights_problem(weights)):
        problems.append(f"weights: {problem}")
    for field, ref in dataset_refs(raw).items():
        problems += dataset_problems(field, ref)
        if problem := task_problem(field, ref, model):
            problems.append(problem)
    return problems


def job_problems(spec: JobSpec, allowed_modules: Sequence[str] | None) -> list[str]:
    """Every reason `spec` may not run, each starting with its field; empty when it may."""
    return spec_problems(spec.model_dump(mode="json"), allowed_modules)


def job_refusal(spec: JobSpec, allowed_modules: Sequence[str]) -> str | None:
    """Why a worker with the allow-list `allowed_modules` refuses `spec`, or None."""
    problems = job_problems(spec, allowed_modules)
    return "refused: " + "; ".join(problems) if problems else None
