"""Prompts per batch: a number, or "auto" (the transformers backend on a GPU: the largest batch
that fits, found by halving on running out of memory; elsewhere ``CPU_BATCH``). Its own module so
an engine's module and the registry that loads it (``backends/__init__``) both read it without
importing each other."""

from __future__ import annotations

from typing import Literal

BatchSize = int | Literal["auto"]
CPU_BATCH = 8


def fixed_batch_size(size: BatchSize) -> int:
    """The batch an engine without a search of its own uses for ``size``."""
    return CPU_BATCH if size == "auto" else int(size)
