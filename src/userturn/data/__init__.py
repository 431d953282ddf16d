"""The dataset seam: a spec string in, a named tuple of Items with the Scorer that grades them out.

Specs:
  ``gsm_symbolic``   GSM8K-style problems generated offline by reasoning-gym (``seed`` applies)
  ``gsm8k``          openai/gsm8k from the Hugging Face hub (``split`` applies; needs the network)
  ``*.jsonl``, ``*.json`` (a list), ``*.parquet``: a local file with GSM8K ``question``/``answer``
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from userturn.data import gsm8k
from userturn.errors import DatasetError
from userturn.records import Item, Score

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
GSM_SYMBOLIC_DEFAULT_SIZE = 200


class Scorer(Protocol):
    """Grades one assistant answer against an item's reference."""

    name: str

    def score(self, item: Item, response: str) -> Score: ...


@dataclass(frozen=True)
class Dataset:
    """Items in a fixed order, the scorer for them, and where they came from (for reports)."""

    name: str
    items: tuple[Item, ...]
    scorer: Scorer
    source: str


def load_dataset(
    spec: str, *, limit: int | None = None, seed: int = 0, split: str = "test"
) -> Dataset:
    """Load a dataset by spec; ``limit`` keeps the first N items, so a prefix is always stable."""
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    spec = spec.strip()
    if spec == "gsm_symbolic":
        size = limit or GSM_SYMBOLIC_DEFAULT_SIZE
        items = gsm8k.gsm_symbolic_items(size, seed)
        return Dataset(spec, items, gsm8k.GSM8KScorer(), f"reasoning-gym gsm_symbolic seed={seed}")
    if spec in ("gsm8k", gsm8k.HUB_NAME):
        items = gsm8k.hub_items(split, limit)
        return Dataset("gsm8k", items, gsm8k.GSM8KScorer(), f"hub {gsm8k.HUB_NAME} main/{split}")
    if spec.lower().endswith(FILE_SUFFIXES):
        path = Path(spec).expanduser().resolve()
        items = gsm8k.file_items(path, limit)
        return Dataset(path.stem, items, gsm8k.GSM8KScorer(), f"file {path}")
    raise DatasetError(
        f"unknown dataset {spec!r}: use 'gsm_symbolic', 'gsm8k' or a path ending in "
        f"{', '.join(FILE_SUFFIXES)}"
    )


__all__ = ["Dataset", "Scorer", "load_dataset"]
