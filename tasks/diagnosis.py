"""What a job waits for that nothing will do: a queue that no live worker consumes."""

from __future__ import annotations

from collections.abc import Sequence

from edgetrain.common.jobs.state import DISPATCHED, TERMINAL, JobStatus, PartState
from edgetrain.common.store import WorkerInfo

from .contract import CONTROL_QUEUE, SERVER_QUEUE, device_queue


def stalled(status: JobStatus, workers: Sequence[WorkerInfo]) -> list[str]:
    """One note per queue that the unfinished parts of `status` need and that no live worker
    consumes, saying which worker to start."""
    if status.finished or status.cancelled_at is not None:
        return []
    consumed = {q for w in workers for q in w.queues}
    open_parts = [p for p in status.parts.values() if p.state not in TERMINAL]
    notes = []
    if CONTROL_QUEUE not in consumed:
        notes.append(f"no live worker consumes the {CONTROL_QUEUE!r} queue, so nothing advances this job: "
                     "start `edgetrain worker control`")  # fmt: skip
    if any(p.state == PartState.estimating for p in open_parts) and SERVER_QUEUE not in consumed:
        notes.append(f"no live worker consumes the {SERVER_QUEUE!r} queue, so the relation vector is not estimated: "
                     "start `edgetrain worker server`")  # fmt: skip
    for part in open_parts:
        queue = device_queue(part.device_id)
        if part.state in (PartState.profiling, *DISPATCHED) and queue not in consumed:
            notes.append(f"no live worker consumes {queue!r}: start "
                         f"`edgetrain worker device --device-id {part.device_id} --backend ...` on its board")  # fmt: skip
    return notes
