"""Progress for people, on stderr: a live board of a job's devices and a spinner with the time
spent for other waits on a terminal; a line per change where stderr is a log or a pipe."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgetrain.common.jobs import JobStatus, PartState
from edgetrain.common.schemas import utc_now


def stderr_console() -> Console:
    """The console progress goes to (stderr, so stdout keeps only the result)."""
    return Console(stderr=True)


def part_line(status: JobStatus, device_id: str) -> str:
    """What one device of a job is doing, in a few words."""
    part = status.parts[device_id]
    text = part.state.value
    if (progress := status.progress.get(device_id)) and part.state in (PartState.finetuning, PartState.completed):
        text += (f"  samples {progress.samples}/{progress.max_samples}  accuracy {progress.accuracy:.3f}"
                 f" (target {progress.target_accuracy})")  # fmt: skip
        if progress.batch_size and progress.frequency_hz and part.state == PartState.finetuning:
            cap = "no cap" if progress.power_cap_w is None else f"cap {progress.power_cap_w:g} W"
            text += f"  now b={progress.batch_size} f={progress.frequency_hz / 1e6:g} MHz, {cap}"
    if part.state == PartState.failed:
        text += f": {part.reason}"
    if part.waiting:
        text += f"  [{part.waiting}]"
    return text


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
        for note in status.notes:
            table.add_row("", f"[yellow]{note}[/yellow]", "")
        return table


class JobProgress:
    """`on_update` for EdgeTrainClient.wait: a live board on a terminal, else a line whenever a
    device's state or progress changes and whenever a note about a stalled queue appears."""

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
        for key, line in [(d, part_line(status, d)) for d in status.parts] + [(n, n) for n in status.notes]:
            if self.lines.get(key) != line:
                self.lines[key] = line
                who = f"{key}: " if key in status.parts else "note: "
                self.console.print(f"[{time.strftime('%H:%M:%S')}] {who}{line}", highlight=False, markup=False)

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
        console.print(f"{description} ...", highlight=False, markup=False)
        yield
        console.print(f"{description}: done in {time.monotonic() - started:.0f} s", highlight=False, markup=False)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(description, total=None)
        yield
