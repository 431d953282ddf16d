"""MATH-500: the scorer and the loaders.

A response is correct when its final answer is equivalent to the item's reference answer; the
extraction, normalization and equivalence rules are in :mod:`userturn.data.math_answers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from userturn.data.hub import hub_rows
from userturn.data.math_answers import equivalence, extract_answer, extract_boxed, normalize_answer
from userturn.data.rows import (
    existing_file,
    file_format,
    items_with_default_ids,
    json_rows,
    jsonl_rows,
    required_text,
)
from userturn.errors import DatasetError
from userturn.records import Item, Score

HUB_NAME = "HuggingFaceH4/MATH-500"
HUB_SPLIT = "test"  # the only split MATH-500 publishes
OFFLINE_HINT = "use a local .jsonl/.json file with 'problem' and 'answer' instead"


# --- scoring -----------------------------------------------------------------------------------

class MathScorer:
    """Correct when the response's final answer is equivalent to the item's reference answer.

    ``extracted`` is the raw extracted answer; ``details`` holds its ``normalized`` form, the
    ``reference_normalized`` one and the ``method`` that matched them (None when they differ).
    """

    name = "math"

    def score(self, item: Item, response: str) -> Score:
        extracted = extract_answer(response)
        reference = item.reference
        method = equivalence(extracted, reference)
        details = {
            "method": method,
            "normalized": normalize_answer(extracted) if extracted is not None else None,
            "reference_normalized": normalize_answer(reference) if reference is not None else None,
        }
        return Score(method is not None, extracted, reference, details)


# --- loading -----------------------------------------------------------------------------------

def looks_like_math(row: Any) -> bool:
    """Whether a row is in MATH format (what a file sniffer can test on the first row)."""
    return isinstance(row, Mapping) and "problem" in row and ("answer" in row or "solution" in row)


def hub_items(split: str = HUB_SPLIT, limit: int | None = None) -> tuple[Item, ...]:
    """MATH-500 from the Hugging Face hub (needs the network); ids ``math500-0000`` ..."""
    rows, where = hub_rows("math500", HUB_NAME, split, OFFLINE_HINT)
    return items_with_default_ids(enumerate(islice(rows, limit)), "math500", where, "row",
                                  _row_item)


def file_items(path: Path, limit: int | None = None, prefix: str | None = None
               ) -> tuple[Item, ...]:
    """MATH rows (``problem``, ``answer``; optional ``solution``, ``unique_id``, ``subject``,
    ``level``, ``id``) from a .jsonl file or a .json list; ids ``<prefix>-0000`` (prefix: the
    file's stem) unless a row has an ``id``. A row without ``answer`` takes the last
    ``\\boxed{}`` of its ``solution`` (the original MATH format). Errors name the file, the row
    (a JSONL row by its 1-based line, a JSON row by its 0-based index) and the field.
    """
    existing_file(path)
    prefix = prefix or path.stem
    if file_format(path, ("jsonl", "json"), "MATH-format data") == "jsonl":
        rows, unit = jsonl_rows(path), "line"
    else:
        rows, unit = json_rows(path), "row"
    return items_with_default_ids(islice(rows, limit), prefix, str(path), unit, _row_item)


def _row_item(row: Any, default_id: str, position: Mapping[str, int]) -> Item:
    if not isinstance(row, Mapping):
        raise DatasetError(f"expected an object with 'problem' and 'answer': {type(row).__name__}")
    problem = required_text(row, "problem")
    solution = row.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise DatasetError("field 'solution' is not text")
    answer = row.get("answer")
    if answer is None:
        answer = extract_boxed(solution) if solution else None
        if not answer:
            raise DatasetError("missing field 'answer' (and no \\boxed{} answer in 'solution')")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DatasetError("field 'answer' must be text or a number")
    answer = str(answer).strip()
    if not answer or not normalize_answer(answer):
        raise DatasetError("field 'answer' is empty")
    item_id = str(row["id"]) if row.get("id") not in (None, "") else default_id
    metadata: dict[str, Any] = {**position}
    for field in ("solution", "unique_id", "subject", "level"):
        if row.get(field) is not None:
            metadata[field] = row[field]
    return Item(item_id, ({"role": "user", "content": problem.strip()},), answer, metadata)


__all__ = ["MathScorer", "file_items", "hub_items", "looks_like_math"]
