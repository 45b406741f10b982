"""Progress for people, on stderr: a live board of a job's devices and a spinner with the time
spent for other waits on a terminal; a line per change where stderr is a log or a pipe (one
event, one line: never wrapped at the console's width)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgetrain.common.jobs.state import JobStatus, PartState
from edgetrain.common.progress import RunState, finetune_line
from edgetrain.common.schemas import utc_now


def stderr_console() -> Console:
    """The console progress goes to (stderr, so stdout keeps only the result)."""
    return Console(stderr=True)


def part_line(status: JobStatus, device_id: str) -> str:
    """What one device of a job is doing, in a few words: a fine-tune's progress, the profile
    and the estimation its part waits for, whether it reached the target, why it failed."""
    part = status.parts[device_id]
    text = status.describe(device_id)
    if part.report is not None and not part.report.reached:
        text += ", target not reached"
    if (progress := status.progress.get(device_id)) and part.state in (PartState.finetuning, PartState.completed):
        text += "  " + finetune_line(progress, part.state.value)
    preparation = status.preparation
    if part.state == PartState.profiling and (profiling := preparation.profiling.get(part.device_type or "")):
        text += "  " + profiling.line()
    if part.state in (PartState.profiling, PartState.estimating) and preparation.estimation:
        text += "  " + preparation.estimation.line()
    if part.state == PartState.failed:
        text += f": {part.reason}"
    if part.waiting:
        text += f"  [{part.waiting}]"
    return text


def _milestone(status: JobStatus, device_id: str) -> str:
    """What must change for a device's line to be printed again where stderr is not a
    terminal: its state, fine-tune progress, tenths of its profile, proxy runs started or done."""
    part = status.parts[device_id]
    progress = status.progress.get(device_id)
    profiling = status.preparation.profiling.get(part.device_type or "")
    estimation = status.preparation.estimation
    return "|".join(map(str, (
        part.state.value, part.waiting, part.reason, progress.samples if progress else None,
        profiling.points_measured * 10 // max(profiling.points_planned, 1) if profiling else None,
        [estimation.count(state) for state in RunState] if estimation else None,
    )))  # fmt: skip


class _Board:
    """A job's devices as a table, with how long each has been in its state (live)."""

    def __init__(self) -> None:
        self.status: JobStatus | None = None

    def __rich__(self) -> RenderableType:
        if self.status is None:
            return "waiting for the job's first status"
        status, now = self.status, utc_now()
        table = Table(title=f"job {status.job_id}: {status.state.value}", title_justify="left", box=None)
        for column in ("device", "state", "for"):
            table.add_column(column)
        for device_id, part in status.parts.items():
            table.add_row(device_id, part_line(status, device_id), f"{(now - part.updated_at).total_seconds():.0f} s")
        if status.preparation.estimation:
            for line in status.preparation.estimation.running_lines():
                table.add_row("proxy run", line, "")
        for note in status.notes:
            table.add_row("", f"[yellow]{note}[/yellow]", "")
        return table


class JobProgress:
    """`on_update` for EdgeTrainClient.wait: a live board on a terminal (with a row per running
    proxy run), else one line, never wrapped, whenever a device's state or progress changes
    (see `_milestone`) and whenever a note about a stalled queue appears."""

    def __init__(self, console: Console | None = None):
        self.console = console or stderr_console()
        self.board = _Board()
        self.live: Live | None = None
        self.lines: dict[str, str] = {}

    def __call__(self, status: JobStatus) -> None:
        """Show what changed in `status`."""
        if self.console.is_terminal:
            self.board.status = status
            if self.live is None:
                self.live = Live(self.board, console=self.console, refresh_per_second=2)
                self.live.start()
            if status.finished:
                self.close()
            return
        for key, milestone in [(d, _milestone(status, d)) for d in status.parts] + [(n, n) for n in status.notes]:
            if self.lines.get(key) != milestone:
                self.lines[key] = milestone
                line = f"{key}: {part_line(status, key)}" if key in status.parts else f"note: {key}"
                self.console.print(f"[{time.strftime('%H:%M:%S')}] {line}", highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        """Stop the live board (leaving its last state on the screen)."""
        if self.live is not None:
            self.live.stop()
            self.live = None


@contextmanager
def activity(description: str, console: Console | None = None) -> Iterator[None]:
    """Show `description` with a spinner and the time spent while the block runs (on a
    terminal), or a line when it starts and when it ends (elsewhere)."""
    console = console or stderr_console()
    if not console.is_terminal:
        started = time.monotonic()
        console.print(f"{description} ...", highlight=False, markup=False, soft_wrap=True)
        yield
        console.print(f"{description}: done in {time.monotonic() - started:.0f} s", highlight=False, markup=False, soft_wrap=True)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(description, total=None)
        yield
