"""Artifact store for big blobs (weights, checkpoints), addressed by name and checked by hash.

A reference looks like `artifact:<file name>#sha256=<hex>`: a file of the store folder
(`EDGETRAIN_ARTIFACT_DIR` on every worker, a shared volume on a fleet), never a path, so a
reference cannot name a file outside the store; fetching refuses a file that resolves outside
it (a symbolic link) and checks the content against the hash.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch
from torch import nn

from .files import write_atomically
from .models import build_model
from .security import (
    RefusedError,
    artifact_path,
    artifact_url,
    init_seed,
    safe_file_name,
)
from .settings import get_data_settings


class ArtifactError(RuntimeError):
    """An artifact is missing, unreadable or does not match its hash."""


def put_file(data: bytes, file_name: str, folder: Path) -> str:
    """Write `data` as `file_name` in the store `folder` atomically (replacing a file of that
    name); returns its reference."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / file_name, data)
    return artifact_url(file_name, hashlib.sha256(data).hexdigest())


def put_bytes(data: bytes, name: str, folder: Path) -> str:
    """Store `data` in the store `folder` named by its content hash; returns its reference."""
    return put_file(data, f"{safe_file_name(name)[:180]}-{hashlib.sha256(data).hexdigest()[:12]}.pt", folder)


def get_bytes(url: str, store: Path) -> bytes:
    """Fetch an artifact of the store folder `store` by reference, checking its sha256."""
    try:
        path, expected = artifact_path(url, store)
    except RefusedError as exc:
        raise ArtifactError(str(exc)) from None
    if not path.is_file():
        raise ArtifactError(f"weights: artifact {path.name} is not in the artifact store {store}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise ArtifactError(f"weights: artifact {path.name} does not match its sha256 {expected}")
    return data


def put_state_dict(model: nn.Module, name: str, folder: Path) -> str:
    """Store a model's weights (a state_dict) in the store `folder`; returns its reference."""
    return put_state(model.state_dict(), name, folder)


def put_state(state: dict[str, torch.Tensor], name: str, folder: Path) -> str:
    """Store a state_dict in the store `folder`, named by its content hash; returns its reference."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return put_bytes(buffer.getvalue(), name, folder)


def get_state(url: str, folder: Path) -> dict[str, torch.Tensor]:
    """A state_dict stored with `put_state` (tensors only: nothing else is unpickled)."""
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(get_bytes(url, folder)), map_location="cpu", weights_only=True)
    return state


def initial_model(model_name: str, weights: str, num_classes: int, store: Path | None = None) -> nn.Module:
    """The starting point of a run: `init:<seed>` (fresh, seeded) or an artifact of the store
    folder `store` (default: settings.artifact_dir)."""
    seed = init_seed(weights)
    if seed is not None:
        return build_model(model_name, num_classes, seed)
    model = build_model(model_name, num_classes, 0)
    state = get_state(weights, store or get_data_settings().artifact_dir)
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ArtifactError(f"weights: {weights} is not a {model_name} checkpoint (unexpected keys {unknown[:3]})")
    # the classifier head is new when the pre-training task had another number of classes
    model.load_state_dict({k: v for k, v in state.items() if v.shape == own[k].shape}, strict=False)
    return model
