"""The IFEval and IFBench verifiers: found in the ``if-verifiable`` package, imported for offline use.

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
from typing import Any, Mapping

from userturn.errors import DatasetError

BENCHMARKS = ("ifeval", "ifbench")
VERIFIER_INSTALL = (
    "pip install --no-deps if-verifiable && pip install nltk langdetect immutabledict emoji syllapy"
)

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


@functools.lru_cache(maxsize=None)
def load_verifiers(benchmark: str) -> Mapping[str, type]:
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


def unverifiable_reason(benchmark: str, registry: Mapping[str, type], instruction_id: str
                        ) -> str | None:
    """Why this machine cannot check ``instruction_id`` (no verifier, or missing NLTK data), or None."""
    if instruction_id not in registry:
        return f"no {benchmark} verifier for this instruction id"
    resource = NLTK_DATA_NEEDED[benchmark].get(instruction_id)
    if resource is not None and not _nltk_has(resource):
        return f"needs NLTK data {resource!r}, not installed (python -m nltk.downloader)"
    return None


__all__ = [
    "BENCHMARKS", "NLTK_DATA_NEEDED", "load_verifiers", "sentence_splitter", "unverifiable_reason",
]
