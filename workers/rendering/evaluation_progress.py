"""What `edgetrain evaluate` shows while it runs, on stderr (so `--json` stays clean on stdout):
a live line per thing it waits for (pre-training, each relation vector, each lookup table,
each verification fine-tune) with its progress and elapsed time, and a log line when each
starts and ends (the log lines alone when stderr is not a terminal)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from .progress import stderr_console


class EvaluationProgress:
    """Use as `with EvaluationProgress() as progress:`; `add` a line per thing waited for,
    `update` it, `finish` it with what came of it."""

    def __init__(self, console: Console | None = None):
        self.console = console or stderr_console()
        self._progress = Progress(
            SpinnerColumn(finished_text="-"), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
            console=self.console, transient=False, redirect_stdout=False, redirect_stderr=False,
            disable=not self.console.is_terminal,  # a log file or pipe gets the log lines only
        )  # fmt: skip
        self._started: dict[TaskID, float] = {}

    def __enter__(self) -> EvaluationProgress:
        self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._progress.stop()

    def log(self, text: str) -> None:
        """A line above the live display, with the time of day."""
        self.console.print(f"[{time.strftime('%H:%M:%S')}] {text}", markup=False, highlight=False, soft_wrap=True)

    def add(self, description: str) -> TaskID:
        """A new line that waits for something; logged."""
        self.log(description)
        task = self._progress.add_task(description, total=None)
        self._started[task] = time.monotonic()
        return task

    def update(self, task: TaskID, description: str) -> None:
        """Say how far it got (e.g. runs done)."""
        self._progress.update(task, description=description)

    def finish(self, task: TaskID, description: str) -> None:
        """It ended (done, reused or failed): stop its clock and log it with its wall time."""
        self._progress.update(task, description=description, total=1, completed=1)
        self._progress.stop_task(task)
        self.log(f"{description} ({time.monotonic() - self._started.pop(task):.0f} s)")
