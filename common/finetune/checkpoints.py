"""Fine-tune checkpoints: the trainer's state and the device totals, saved in the artifact
store of the worker host, so that a fine-tune redelivered after its worker died continues
where it was instead of starting over. Each save writes a file of its own (the attempt's token
and the save's number in its name), so a save that the part refuses (the attempt was cancelled,
or replaced by another, meanwhile) never overwrites or removes the file its checkpoint record
names; once the part records a save, the other files of that (job, device) are removed."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import torch

from ..artifacts import get_bytes, put_file
from ..security import safe_file_name
from ..training import DeviceTotals, Trainer

# one pattern (one compiled per job would fill re's cache); without a save number: a file of an earlier version
_SAVE_SUFFIX = re.compile(r"[0-9a-f]{12}(-[0-9]+)?\.pt")


def checkpoint_name(job_id: str, device_id: str, attempt: str, save: int) -> str:
    """The file name, in the artifact store, of the `save`-th checkpoint of (job, device) that
    attempt `attempt` (its token) writes."""
    return safe_file_name(f"checkpoint-{job_id}-{device_id}-{attempt[:12]}-{save}.pt")


def remove_checkpoints(job_id: str, device_id: str, store: Path, keep: str | None = None) -> None:
    """Remove the checkpoint files of (job, device) from the store folder, but `keep` (a file name)."""
    prefix = safe_file_name(f"checkpoint-{job_id}-{device_id}-")
    for path in store.glob("checkpoint-*.pt"):
        name = path.name
        if name.startswith(prefix) and _SAVE_SUFFIX.fullmatch(name[len(prefix) :]) and name != keep:
            path.unlink(missing_ok=True)


def save_checkpoint(trainer: Trainer, totals: DeviceTotals, name: str, store: Path) -> str:
    """Write the checkpoint as `name` in the store folder `store`, atomically; returns its
    artifact reference."""
    buffer = io.BytesIO()
    torch.save({"trainer": trainer.state_dict(), "totals": dataclasses.asdict(totals)}, buffer)
    return put_file(buffer.getvalue(), name, store)


def load_checkpoint(url: str, store: Path, trainer: Trainer) -> DeviceTotals:
    """Restore `trainer` (built as for the checkpointed run) and return the saved totals."""
    state = torch.load(io.BytesIO(get_bytes(url, store)), map_location=trainer.device, weights_only=True)
    trainer.load_state_dict(state["trainer"])
    totals = state["totals"]
    return DeviceTotals(**(totals | {"history": [tuple(h) for h in totals["history"]]}))
