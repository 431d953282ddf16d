"""The one progress display of userturn: rich bars, on stderr in a terminal and as a live
output in a Jupyter notebook (rich tells them apart), for the commands and the Python API alike.

Stages below take a :data:`~userturn.records.Progress` callback and never draw; this is what a
caller at the top hands them (``progress_bars() as progress``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextmanager
def progress_bars(console: Console | None = None
                  ) -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """A ``Progress`` callback that draws one bar per stage on ``console`` (default: stderr,
    markup off)."""
    # A description names models and datasets (user text): shown as written, not as markup.
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console or Console(stderr=True, markup=False)) as bars:
        def start(description: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(description, total=total)
            return lambda n: bars.advance(task, n)

        yield start
