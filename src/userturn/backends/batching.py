"""Prompts per batch: a number, or "auto" (the transformers backend on a GPU: the largest batch
that fits, found by halving on running out of memory; on the CPU the width a measurement picks,
:func:`choose_width`; elsewhere ``CPU_BATCH``). Its own module so an engine's module and the
registry that loads it (``backends/__init__``) both read it without importing each other."""

from __future__ import annotations

from typing import Literal, Mapping

BatchSize = int | Literal["auto"]
CPU_BATCH = 8
# --batch-size auto on the CPU: the widths measured, and how close to the best rate a narrower
# one must come to be chosen (a narrower batch holds less memory, and the rows left at the end
# of a unit, when no prompt is waiting, are fewer).
CPU_WIDTHS = (4, 8, 16, 32)
NEAR_BEST = 0.9
# The transformers backend refills rows from a unit of this many batch widths: the deeper the
# queue, the smaller the share of the unit's end, when rows finish with none left to take their
# slots. A unit is also what a killed run loses at most.
QUEUE_WIDTHS = 8


def fixed_batch_size(size: BatchSize) -> int:
    """The batch an engine without a search of its own uses for ``size``."""
    return CPU_BATCH if size == "auto" else int(size)


def choose_width(rates: Mapping[int, float]) -> int:
    """The narrowest width whose measured rate (row-tokens/s) is within NEAR_BEST of the best."""
    best = max(rates.values())
    return min(width for width, rate in rates.items() if rate >= NEAR_BEST * best)
