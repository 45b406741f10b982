"""Fine-tune checkpoints: the trainer's state and the device totals, saved in the artifact
store of the worker host, so that a fine-tune redelivered after its worker died continues
where it was instead of starting over."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import torch

from .artifacts import get_bytes, put_file
from .training import DeviceTotals, Trainer


def checkpoint_path(folder: Path, job_id: str, device_id: str) -> Path:
    """Where the fine-tune of (job, device) keeps its one, latest checkpoint."""
    return folder / "checkpoints" / f"{job_id}-{device_id}.pt"


def save_checkpoint(trainer: Trainer, totals: DeviceTotals, path: Path) -> str:
    """Write the checkpoint atomically over the previous one; returns its artifact URL."""
    buffer = io.BytesIO()
    torch.save({"trainer": trainer.state_dict(), "totals": dataclasses.asdict(totals)}, buffer)
    return put_file(buffer.getvalue(), path)


def load_checkpoint(url: str, trainer: Trainer) -> DeviceTotals:
    """Restore `trainer` (built as for the checkpointed run) and return the saved totals."""
    state = torch.load(io.BytesIO(get_bytes(url)), map_location=trainer.device, weights_only=True)
    trainer.load_state_dict(state["trainer"])
    totals = state["totals"]
    return DeviceTotals(**(totals | {"history": [tuple(h) for h in totals["history"]]}))
