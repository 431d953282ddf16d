"""A chat template is a program from a file or a hub, so one render runs on a budget.

Three things bound it, all counted on this thread while :func:`render_budget` is open:

- steps: every loop item, call, filter and operator the template runs spends one; past
  :data:`RENDER_STEPS` the render stops. Two nested ``range(99999)`` loops (ten billion steps),
  or two nested loops over a 99,999-character string, stop within a fraction of a second.
- characters: every value the template makes (an operator's, a call's or a filter's result, a
  literal list, a concatenation, each ``{{ }}`` output, a loop body's text per item) is charged
  its printed size; past :data:`RENDER_CHARS` the render stops. Where one operation could make
  a huge value at once (``'x' * 10**9``, ``'x'|center(10**9)``, ``'{:>1000000000}'.format``),
  its size is estimated first (:func:`afford`) and the operation is refused before it allocates.
- seconds: :data:`RENDER_SECONDS` of the thread's CPU, read every :data:`CLOCK_EVERY` steps,
  for whatever is slow without being large.

Real chat templates spend a few steps per message and make values about the size of the
prompt, far below every bound. A bound reached is :class:`RenderBudgetExceeded`, which the
renderer turns into one error line.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Mapping

from jinja2.utils import Namespace

RENDER_STEPS = 1_000_000  # about 0.3 s of empty loop steps on a shared 2-core machine
# A prompt of a million tokens is about four million characters: a render may make a dozen
# times that in values and output, and no more (about 200 MB at worst).
RENDER_CHARS = 50_000_000
# Seconds of this thread's CPU: a loaded machine slows a render's clock, never its work, so a
# real template is not failed by a busy neighbour. A chat template renders in milliseconds;
# this bounds what is slow without being large (a macro that calls itself twice, 40 deep).
RENDER_SECONDS = 2.0
CLOCK_EVERY = 1024  # steps between reads of the clock (a read costs about as much as a step)
# Python refuses to print an integer longer than this (sys.get_int_max_str_digits): a template
# has no use for a larger one, and making one (9**9**9) takes minutes.
MAX_INT_DIGITS = 4300

_state = threading.local()  # the budget of the render running on this thread


class RenderBudgetExceeded(Exception):
    """A template asked for more steps, characters or seconds than one render may take."""


@dataclass
class _Budget:
    steps: int
    chars: int
    deadline: float


def _budget() -> _Budget | None:
    return getattr(_state, "budget", None)


@contextmanager
def render_budget(steps: int = RENDER_STEPS, chars: int = RENDER_CHARS,
                  seconds: float = RENDER_SECONDS) -> Iterator[None]:
    """One render's budget, on this thread."""
    outer = _budget()
    _state.budget = _Budget(steps, chars, time.thread_time() + seconds)
    try:
        yield
    finally:
        _state.budget = outer


def spend() -> None:
    """One step of the render (a loop item, a call, a filter, an operator), and the clock."""
    budget = _budget()
    if budget is None:  # outside a budgeted render (a template compiled for a check)
        return
    if budget.steps <= 0:
        raise RenderBudgetExceeded(f"its loops and calls took more than {RENDER_STEPS:,} steps "
                                   "in one render (nested loops?); a chat template needs far "
                                   "fewer")
    budget.steps -= 1
    if budget.steps % CLOCK_EVERY == 0 and time.thread_time() > budget.deadline:
        raise RenderBudgetExceeded(f"it worked for more than {RENDER_SECONDS:g} s of CPU in one "
                                   "render; a chat template renders in milliseconds")


def afford(chars: int) -> None:
    """Refuse, before it is made, a value of about ``chars`` characters that the render's
    budget cannot take (nothing is charged: the value made is, by :func:`charge`)."""
    budget = _budget()
    if budget is not None and chars > budget.chars:
        raise _too_large()


def charge(value: Any) -> Any:
    """Charge ``value``'s printed size to the render's budget; returns ``value``."""
    budget = _budget()
    if budget is not None:
        budget.chars -= size(value, budget.chars)
        if budget.chars < 0:
            raise _too_large()
    return value


def charge_chars(chars: int) -> None:
    budget = _budget()
    if budget is not None and chars:
        budget.chars -= chars
        if budget.chars < 0:
            raise _too_large()


def afford_digits(digits: int) -> None:
    if digits > MAX_INT_DIGITS:
        raise RenderBudgetExceeded(f"it asks for an integer of more than {MAX_INT_DIGITS:,} "
                                   "digits; a chat template needs none")


def _too_large() -> RenderBudgetExceeded:
    return RenderBudgetExceeded(f"it asks for more than {RENDER_CHARS:,} characters of values "
                                "in one render (a string or list repeated past any prompt's "
                                "size?); a chat template makes far fewer")


def size(value: Any, cap: int = RENDER_CHARS) -> int:
    """About how many characters ``value`` prints as, containers counted through (a list that
    holds one string a thousand times prints it a thousand times); counting stops past
    ``cap``. Flat lists of strings or numbers are summed at C speed."""
    if isinstance(value, str):  # most values a render makes: an output, a filter's result
        return len(value)
    total, stack = 0, [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, int):
            total += digits(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            if total <= cap:
                total += _flat(item, stack)
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            if total <= cap:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, Namespace):  # prints every attribute it holds
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
        else:  # a number, None, a macro, a loop: a short repr
            total += 8
    return total


def _flat(items: Collection[Any], stack: list[Any]) -> int:
    """The characters of a container's items when all are strings or short numbers; else the
    items go on ``stack`` to be counted one by one (0 here)."""
    kinds = set(map(type, items))
    if kinds <= {str}:
        return sum(map(len, items))
    if kinds <= {int, bool}:
        return sum(map(int.bit_length, items)) // 3 + len(items)
    if kinds <= {float, bool, type(None)}:
        return 8 * len(items)
    stack.extend(items)
    return 0


def digits(number: int) -> int:
    """About how many decimal digits ``number`` has (a little over, never under)."""
    return number.bit_length() // 3 + 1


class BudgetedIterable:
    """What a template's ``{% for %}`` iterates: each item spends a step, and charges the
    text the loop's body writes per item (``chars``), whatever is iterated (a range, a list,
    a 99,999-character string). Its length reads as the iterable's, for ``loop.length``."""

    def __init__(self, iterable: Any, chars: int = 0) -> None:
        self._iterable, self._chars = iterable, chars

    def __iter__(self) -> Iterator[Any]:
        for item in self._iterable:
            spend()
            charge_chars(self._chars)
            yield item

    def __len__(self) -> int:
        return len(self._iterable)
