"""A chat template is a program from a file or a hub, so its loops run on a budget.

Jinja's sandbox refuses one ``range`` past 100,000 items, but not two nested ones: ``{% for i in
range(99999) %}{% for j in range(99999) %}`` asks for ten billion steps and rendered on for
minutes. Every ``range`` a template makes is this module's :class:`BudgetedRange`, which spends
one step of the render's budget per item it yields; past :data:`RENDER_STEPS` the render stops
with :class:`RenderBudgetExceeded` (one error line, within a fraction of a second). Real chat
templates step through ranges a few times per message, far below the budget.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

RENDER_STEPS = 1_000_000  # about 0.3 s of empty loop steps on a shared 2-core machine
_state = threading.local()  # the budget left to the render running on this thread


class RenderBudgetExceeded(Exception):
    """A template's loops asked for more steps than one render may take."""


class BudgetedRange:
    """Jinja's sandboxed ``range`` (refused past 100,000 items), spending one step of the
    render's budget per item it yields; its length and items read as a range's."""

    def __init__(self, *args: Any) -> None:
        from jinja2.sandbox import safe_range

        self._range: range = safe_range(*args)

    def __iter__(self) -> Iterator[int]:
        for value in self._range:
            spend()
            yield value

    def __reversed__(self) -> Iterator[int]:
        for value in reversed(self._range):
            spend()
            yield value

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __contains__(self, value: object) -> bool:
        return value in self._range

    def __repr__(self) -> str:
        return repr(self._range)


def spend() -> None:
    left = getattr(_state, "left", None)
    if left is None:  # a range used outside a budgeted render
        return
    if left <= 0:
        raise RenderBudgetExceeded(f"its loops took more than {RENDER_STEPS:,} steps in one "
                                   "render (nested ranges?); a chat template needs far fewer")
    _state.left = left - 1


@contextmanager
def render_budget(steps: int = RENDER_STEPS) -> Iterator[None]:
    """One render's budget, on this thread."""
    outer = getattr(_state, "left", None)
    _state.left = steps
    try:
        yield
    finally:
        _state.left = outer


def budget_ranges(template: Any) -> None:
    """Give a compiled Jinja template :class:`BudgetedRange` as its ``range`` (its own
    globals: the environment, and other templates, keep theirs)."""
    if template.globals.get("range") is not BudgetedRange:
        template.globals["range"] = BudgetedRange
