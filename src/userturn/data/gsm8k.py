"""GSM8K: answer extraction, the scorer, and the loaders (GSM-Symbolic, the hub, local files).

Extraction follows lm-evaluation-harness's gsm8k tasks: a strict match on ``#### N`` and a flexible
fallback to the last number in the text, with ``\\boxed{N}`` and "The answer is N" tried in between
because instruction-tuned models write those far more often than ``####``. Answers are compared as
exact rationals, so "18.0" == "18" and "3/4" == "0.75".
"""

from __future__ import annotations

import re
import warnings
from decimal import Decimal
from fractions import Fraction
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Mapping

from userturn.data.hub import hub_rows
from userturn.data.rows import (
    FileFormat,
    existing_file,
    file_format,
    items_with_default_ids,
    json_rows,
    jsonl_rows,
    parquet_records,
    required,
    required_text,
)
from userturn.errors import DatasetError
from userturn.records import Item, Score

HUB_NAME = "openai/gsm8k"
GSM8K_FORMATS: tuple[FileFormat, ...] = ("jsonl", "json", "parquet")
OFFLINE_HINT = "use 'gsm_symbolic' (offline) or a local .jsonl/.json/.parquet file instead"

# A number as models write it: optional sign and currency, thousands commas, decimals. The
# lookbehind keeps "3-2" and "x2" from yielding "-2" and "2"; the lookahead refuses a number cut
# off in the middle ("12" of "123", "1,234" of "1,2345").
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212])?(?:[$£€¥₹]\s?)?"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?!\d|,\d)"
)
_FRACTION = re.compile(r"(?P<sign>[-\u2212])?(?P<num>\d+)\s*/\s*(?P<den>\d+)")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"\banswer\b[\s*_]*(?:is\b|:|=)[\s*_:]*", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Decoration around a whole answer: markdown emphasis, LaTeX math delimiters, currency, percent.
_DECORATION = "*_$£€¥₹% \t\n"


def normalize_number(text: str) -> str | None:
    """The first number in ``text`` in canonical form, or None when it holds no number.

    "1,234" -> "1234", "$18.00" -> "18", "3.50" -> "3.5", "12 apples" -> "12". A fraction is kept
    ("6/8" -> "3/4") only when it is the whole answer; inside prose "3/4 cup" reads as "3".
    """
    cleaned = _clean_latex(text)
    fraction = _whole_fraction(cleaned)
    if fraction is not None:
        return fraction
    match = _NUMBER.search(cleaned)
    return _canonical(match) if match else None


def extract_answer(text: str) -> str | None:
    """The model's final numeric answer, normalized; None when the text holds no number.

    Tried in order: ``#### N``; ``\\boxed{N}``; "The answer is N" / "answer: N" (the last such);
    the last number in the text.
    """
    if not text:
        return None
    for strategy in (_after_hashes, _in_boxed, _after_answer_phrase, _last_number):
        answer = strategy(text)
        if answer is not None:
            return answer
    return None


def same_number(a: str | None, b: str | None) -> bool:
    """Whether two normalized answers are the same number (exactly, as rationals)."""
    if a is None or b is None:
        return False
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return a == b


class GSM8KScorer:
    """Correct when the response's final number equals the item's reference."""

    name = "gsm8k"

    def score(self, item: Item, response: str) -> Score:
        extracted = extract_answer(response)
        reference = normalize_number(item.reference) if item.reference is not None else None
        return Score(same_number(extracted, reference), extracted, item.reference)


# --- extraction strategies ---------------------------------------------------------------------

def _after_hashes(text: str) -> str | None:
    return _last_normalized(_first_line(text[m.end():]) for m in re.finditer("####", text))


def _in_boxed(text: str) -> str | None:
    return _last_normalized(_braced(text, m.end()) for m in _BOXED.finditer(text))


def _after_answer_phrase(text: str) -> str | None:
    # Markdown often puts the number on its own line ("Answer:\n\n42"): read the next non-blank one.
    return _last_normalized(_first_line(text[m.end():]) for m in _ANSWER_IS.finditer(text))


def _last_number(text: str) -> str | None:
    cleaned = _clean_latex(text)
    matches = list(_NUMBER.finditer(cleaned))
    if not matches:
        return None
    # A reply that is just "3/4" means three quarters; inside prose the fraction is not trusted.
    return _whole_fraction(cleaned) or _canonical(matches[-1])


def _last_normalized(candidates: Iterable[str]) -> str | None:
    """The last candidate that holds a number: models restate and correct themselves."""
    found = None
    for candidate in candidates:
        number = normalize_number(candidate)
        if number is not None:
            found = number
    return found


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def _braced(text: str, start: int) -> str:
    """The content of the brace group opened just before ``start``, nested braces included."""
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    return text[start:]


# --- number forms ------------------------------------------------------------------------------

def _clean_latex(text: str) -> str:
    """Rewrite the LaTeX that models put around numbers into plain text."""
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    text = text.replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    text = text.replace("\\$", "$").replace("\\%", "%")
    return re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r" \1 ", text)


def _whole_fraction(text: str) -> str | None:
    core = text.strip().rstrip(".").strip(_DECORATION + "\\()[]")
    match = _FRACTION.fullmatch(core)
    if not match or int(match["den"]) == 0:
        return None
    value = Fraction(int(match["num"]), int(match["den"]))
    if match["sign"]:
        value = -value
    return str(value)  # Fraction prints "3/4", or "2" when the denominator reduces to 1.


def _canonical(match: re.Match[str]) -> str:
    value = Decimal(match["digits"].replace(",", ""))  # the regex admits only valid decimals
    if match["sign"]:
        value = -value
    if value == 0:
        return "0"  # Avoids "-0" and "0E-2".
    return format(value.normalize(), "f")


# --- loading -----------------------------------------------------------------------------------

def reference_from_solution(solution: Any) -> str | None:
    """The normalized final answer of a GSM8K solution (``... #### N``) or of a bare number."""
    if isinstance(solution, bool) or not isinstance(solution, (str, int, float)):
        return None
    text = str(solution)
    if "####" in text:
        return normalize_number(_first_line(text.rsplit("####", 1)[1]))
    return normalize_number(text) if _is_bare_number(text) else None


def _is_bare_number(text: str) -> bool:
    # Only a whole number counts: reading the first number of a prose solution would be wrong.
    core = text.strip().rstrip(".").strip(_DECORATION)
    return bool(_NUMBER.fullmatch(core) or _FRACTION.fullmatch(core))


def gsm_symbolic_items(size: int, seed: int) -> tuple[Item, ...]:
    """GSM8K-style problems generated offline from the GSM-Symbolic templates by reasoning-gym."""
    try:
        # cellpylib, which reasoning-gym imports, has `is "recursive"` comparisons that Python
        # warns about when it compiles them (a first import, or an install that kept no
        # bytecode): its words, not the user's, so they are not shown.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
    except ImportError:
        raise DatasetError(
            "gsm_symbolic needs the 'reasoning-gym' package: pip install 'userturn[offline]'"
        ) from None
    entries = reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)
    # Which GSM-Symbolic template an item instantiates: items of one template differ only in
    # names and numbers, so a training split must keep templates apart from evaluation items.
    templates = getattr(entries, "task_indices", None)
    return tuple(_symbolic_item(index, entry, seed,
                                None if templates is None else int(templates[index]))
                 for index, entry in enumerate(entries))


def _symbolic_item(index: int, entry: Mapping[str, Any], seed: int,
                   template: int | None = None) -> Item:
    meta = entry.get("metadata", {})
    item_id = f"gsm_symbolic-s{seed}-{index:04d}"
    reference = normalize_number(str(entry["answer"]))
    if reference is None:
        raise DatasetError(f"gsm_symbolic seed={seed} item {index}: answer has no number")
    solution = meta.get("answer_cot", entry["answer"])
    metadata = {"solution": solution, "source_index": meta.get("source_index", index)}
    if template is not None:
        metadata["template"] = template
    return Item(item_id, ({"role": "user", "content": entry["question"]},), reference, metadata)


def hub_items(split: str, limit: int | None) -> tuple[Item, ...]:
    """GSM8K from the Hugging Face hub: the online users' dataset."""
    rows, where = hub_rows("gsm8k", HUB_NAME, split, OFFLINE_HINT, config="main")
    return items_with_default_ids(enumerate(islice(rows, limit)), f"gsm8k-{split}", where, "row",
                                  _row_item)


def file_items(path: Path, limit: int | None) -> tuple[Item, ...]:
    """GSM8K rows (``question``, ``answer``, optional ``id``) from a .jsonl, .json or .parquet file.

    Errors name a JSONL row by its 1-based line (what an editor shows) and a JSON or Parquet row by
    its 0-based index (what ``data[i]`` and pandas show), which is also the number in its item id.
    """
    existing_file(path)
    kind = file_format(path, GSM8K_FORMATS, "GSM8K-format data")
    if kind == "jsonl":
        rows, unit = jsonl_rows(path), "line"
    else:
        rows = json_rows(path) if kind == "json" else enumerate(parquet_records(path))
        unit = "row"
    return items_with_default_ids(islice(rows, limit), path.stem, str(path), unit, _row_item)


def _row_item(row: Any, default_id: str, position: Mapping[str, int]) -> Item:
    if not isinstance(row, Mapping):
        raise DatasetError(f"expected an object with 'question' and 'answer': {type(row).__name__}")
    question = required_text(row, "question")
    solution = required(row, "answer")
    reference = reference_from_solution(solution)
    if reference is None:
        raise DatasetError("field 'answer' has neither '#### N' nor a bare number")
    item_id = str(row["id"]) if row.get("id") not in (None, "") else default_id
    metadata = {"solution": str(solution), **position}
    return Item(item_id, ({"role": "user", "content": question.strip()},), reference, metadata)
