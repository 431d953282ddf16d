"""The console every ``userturn`` command prints through (main's handlers and the classifier
commands alike)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console

from userturn.report.progress import progress_bars as bars_on


def plain_console(*, stderr: bool = False) -> Console:
    """The console every command prints through. Markup is off: paths and user text print as
    written (``runs/exp[seed=1]``, a model's ``[INST]``), never read as rich markup (which drops
    ``[seed=1]`` or fails on ``[/x]``); styling is given as ``style=``. In a terminal rich uses
    its width; piped to a file or CI log it would wrap the tables at 80 columns, so give it
    room."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, markup=False, width=None if stream.isatty() else 160)


@contextmanager
def progress_bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """The commands' progress bars: the API's, on the commands' stderr console."""
    with bars_on(plain_console(stderr=True)) as progress:
        yield progress
