"""Progress of long operations: a rich progress bar on a terminal, nothing otherwise.

``with progress("decommission bookie-2", total=40, unit="ledgers") as bar:
bar.update(done=12)`` -- the bar goes to stderr and only when stderr is a TTY, so
scripts, pipes, tests and ``--json`` output see no escape codes. A total that is not
known yet (``None``) shows a spinner with the count; ``bar.total = n`` sets it later.
``BOOKLINE_PROGRESS=always|never`` overrides the TTY check.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["Progress", "progress", "wanted"]

ENV: Final = "BOOKLINE_PROGRESS"


def wanted() -> bool:
    """Whether bars are drawn: on a terminal, unless ``BOOKLINE_PROGRESS`` says."""
    choice = os.environ.get(ENV, "auto").lower()
    if choice in ("always", "1", "on"):
        return True
    if choice in ("never", "0", "off"):
        return False
    return sys.stderr.isatty()


class Progress:
    """One task's bar; a no-op when bars are not wanted."""

    def __init__(self, bar: Any, task: Any, total: float | None) -> None:
        self._bar = bar
        self._task = task
        self._total = total
        self.done = 0.0

    @property
    def total(self) -> float | None:
        return self._total

    @total.setter
    def total(self, value: float | None) -> None:
        self._total = value
        if self._bar is not None:
            self._bar.update(self._task, total=value)

    def update(self, *, done: float | None = None, advance: float = 0.0, note: str = "") -> None:
        self.done = done if done is not None else self.done + advance
        if self._bar is not None:
            fields = {"description": note} if note else {}
            self._bar.update(self._task, completed=self.done, **fields)


@contextlib.contextmanager
def progress(description: str, *, total: float | None = None, unit: str = "") -> Iterator[Progress]:
    if not wanted():
        yield Progress(None, None, total)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    columns = [
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with RichProgress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield Progress(bar, task, total)
