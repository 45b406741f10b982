"""Artifact store for big blobs (weights, checkpoints), addressed by URL and checked by hash.

A reference looks like `file:///abs/path/name.pt#sha256=<hex>`; only the local-directory
store exists today, and fetching checks the content against the hash in the reference.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from .models import build_model


class ArtifactError(RuntimeError):
    """An artifact is missing, unreadable or does not match its hash."""


def put_file(data: bytes, path: Path) -> str:
    """Write `data` to `path` atomically (replacing what was there); returns its reference URL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return f"{path.resolve().as_uri()}#sha256={hashlib.sha256(data).hexdigest()}"


def put_bytes(data: bytes, name: str, folder: Path) -> str:
    """Store `data` under `folder` named by its content hash; returns its reference URL."""
    return put_file(data, folder / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.pt")


def get_bytes(url: str) -> bytes:
    """Fetch an artifact by reference, checking its sha256."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise ArtifactError(f"weights: unsupported artifact URL scheme {parsed.scheme!r} in {url!r}; use file://")
    path = Path(parsed.path)
    if not path.is_file():
        raise ArtifactError(f"weights: artifact {path} does not exist")
    data = path.read_bytes()
    expected = parsed.fragment.removeprefix("sha256=") if parsed.fragment.startswith("sha256=") else None
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise ArtifactError(f"weights: artifact {path} does not match its sha256 {expected}")
    return data


def put_state_dict(model: nn.Module, name: str, folder: Path) -> str:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return put_bytes(buffer.getvalue(), name, folder)


def initial_model(model_name: str, weights: str, num_classes: int) -> nn.Module:
    """The starting point of a run: `init:<seed>` (fresh, seeded) or an artifact URL."""
    if weights.startswith("init:"):
        seed = weights.removeprefix("init:")
        if not seed.isdigit():
            raise ArtifactError(f"weights: {weights!r} must be 'init:<integer seed>' or an artifact URL")
        return build_model(model_name, num_classes, int(seed))
    model = build_model(model_name, num_classes, 0)
    state = torch.load(io.BytesIO(get_bytes(weights)), map_location="cpu", weights_only=True)
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ArtifactError(f"weights: {weights} is not a {model_name} checkpoint (unexpected keys {unknown[:3]})")
    # the classifier head is new when the pre-training task had another number of classes
    model.load_state_dict({k: v for k, v in state.items() if v.shape == own[k].shape}, strict=False)
    return model
