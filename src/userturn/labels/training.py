"""Training the learned classifier: labelled turns in, ``LinearModel`` parameters out.

Splits are drawn by query (every turn of one query stays in one split), so a dev figure never
rewards memorising a conversation. Probabilities are temperature-scaled on the dev split. Needs
scikit-learn (``pip install 'userturn[classifier]'``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from userturn.data.rows import json_lines
from userturn.errors import UserturnError
from userturn.labels.classifier import N_DENSE, LinearModel, context_width, design_matrix
from userturn.labels.context import CONTEXT_FEATURES, ContextReading
from userturn.records import LABELS, Case, is_follow_up
from userturn.settings import bad_text_path
from userturn.stats.agreement import cohen_kappa, confusion_matrix
from userturn.stats.reliability import per_label

REQUIRED = ("query", "answer", "user_turn")


@dataclass(frozen=True)
class Example:
    """One labelled turn: the case, its label, its split and where it came from."""

    case: Case
    label: str
    split: str  # "train" | "dev" | "test" | "" (not given: drawn by query)
    group: str  # turns of one query share a group
    source: str = ""
    reading: ContextReading | None = None  # the turn read in context, for context parameters


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of a .jsonl or .jsonl.gz file; a bad line is named."""
    path = Path(path)
    if not path.is_file():
        raise UserturnError(f"{path}: no such file")
    rows = []
    for line in json_lines(path):
        if line.error is not None:
            raise UserturnError(f"{path}: line {line.number}: {line.error}")
        if not isinstance(line.value, dict):
            raise UserturnError(f"{path}: line {line.number}: expected a JSON object")
        bad = bad_text_path(line.value)
        if bad is not None:  # a lone surrogate ("\ud800") cannot be labelled nor written back
            raise UserturnError(f"{path}: line {line.number}: field {bad!r}: invalid text (a "
                                "lone surrogate, not a character)")
        rows.append((line.number, line.value))
    if not rows:  # labelling or training on nothing is a wrong file, not a success
        raise UserturnError(f"{path}: no rows (the file is empty)")
    return rows


def case_of(row: dict[str, Any], path: Path, number: int) -> Case:
    """The Case of a row with ``query``, ``answer`` and ``user_turn`` (text, all three)."""
    for field in REQUIRED:
        if field not in row:
            raise UserturnError(f"{path}: line {number}: field {field!r} is missing")
        if not isinstance(row[field], str):
            raise UserturnError(f"{path}: line {number}: field {field!r} is not text")
    return Case(row["query"], row["answer"], row["user_turn"], row["user_turn"])


def read_examples(path: Path) -> list[Example]:
    """Labelled turns: ``query``, ``answer``, ``user_turn``, ``label`` (one of docs/labels.md),
    optional ``split`` and ``source``. Errors name the line and the field."""
    examples = []
    for number, row in read_rows(path):
        case = case_of(row, path, number)
        label = row.get("label")
        if label not in LABELS:
            raise UserturnError(f"{path}: line {number}: field 'label' is {label!r}, not one of "
                                f"{', '.join(LABELS)}")
        split = row.get("split") or ""
        if split not in ("", "train", "dev", "test"):
            raise UserturnError(f"{path}: line {number}: field 'split' is {split!r}, not train, "
                                f"dev or test")
        source = row.get("source")
        kind = source.get("kind", "") if isinstance(source, dict) else str(source or "")
        examples.append(Example(case, label, split, group_of(row["query"]), kind))
    if not examples:
        raise UserturnError(f"{path}: no labelled turns")
    return examples


def group_of(query: str) -> str:
    return hashlib.sha256(query.strip().encode()).hexdigest()[:16]


def split_of(group: str, dev: float = 0.15, test: float = 0.2) -> str:
    """A query's split, fixed by its hash: the same query lands in the same split every time."""
    position = int(group[:8], 16) / 0xFFFFFFFF
    return "test" if position < test else "dev" if position < test + dev else "train"


def assign_splits(examples: Sequence[Example], dev: float = 0.15) -> list[Example]:
    """Examples without a split get one by query (no test split: a user's own file trains and
    reports dev agreement only)."""
    out = []
    for ex in examples:
        split = ex.split or ("dev" if split_of(ex.group, dev, 0.0) == "dev" else "train")
        out.append(Example(ex.case, ex.label, split, ex.group, ex.source))
    return out


def with_readings(examples: Sequence[Example], readings: Sequence[ContextReading]
                  ) -> list[Example]:
    """The examples, each carrying its reading (same order)."""
    import dataclasses

    return [dataclasses.replace(ex, reading=r) for ex, r in zip(examples, readings, strict=True)]


def context_meta(scorer: str, embedding: int) -> dict[str, Any]:
    """``meta["context"]`` of parameters that read turns in context with ``scorer``, using the
    first ``embedding`` dimensions of its hidden state (0: the likelihood ratios alone)."""
    return {"scorer": scorer, "features": list(CONTEXT_FEATURES), "embedding": embedding}


def fit(train: Sequence[Example], *, c: float = 0.5, balanced: bool = True,
        version: str = "1", context: dict[str, Any] | None = None) -> LinearModel:
    """Multinomial logistic regression on the design matrix (dense columns standardised).
    ``context`` (:func:`context_meta`): the examples carry readings, and the model reads them."""
    try:
        from sklearn.linear_model import LogisticRegression
        from threadpoolctl import threadpool_limits  # installed with scikit-learn
    except ImportError:
        raise UserturnError("training the classifier needs scikit-learn: "
                            "pip install 'userturn[classifier]'") from None
    labels = sorted({ex.label for ex in train}, key=LABELS.index)
    if len(labels) < 2:
        raise UserturnError(f"training needs at least two labels, the data has {labels}")
    readings = [ex.reading for ex in train] if context else None
    x, scale = standardised_design([ex.case for ex in train], readings=readings, context=context)
    y = np.array([labels.index(ex.label) for ex in train])
    model = LogisticRegression(C=c, max_iter=3000, class_weight="balanced" if balanced else None)
    # One BLAS thread: L-BFGS steps on vectors this small gain nothing from threads, and on a
    # busy machine OpenBLAS's waiting threads made one fit 17 times slower (58 s, not 3.5 s).
    with threadpool_limits(limits=1, user_api="blas"):
        model.fit(x, y)
    weights, bias = model.coef_, model.intercept_
    if len(labels) == 2:  # scikit-learn keeps one row for two classes
        weights = np.vstack([-weights[0] / 2, weights[0] / 2])
        bias = np.array([-bias[0] / 2, bias[0] / 2])
    return LinearModel(weights, bias, scale, 1.0, tuple(labels),
                       {"version": version, "c": c, "balanced": balanced,
                        "trained_on": len(train), **({"context": context} if context else {})})


def standardised_design(cases: Sequence[Case], scale: np.ndarray | None = None,
                        readings: Sequence[ContextReading | None] | None = None,
                        context: dict[str, Any] | None = None):
    """The design matrix with its dense columns divided by ``scale`` (default: their standard
    deviation over ``cases``, floored): (CSR matrix, scale)."""
    width = N_DENSE + context_width(context)
    x = design_matrix(cases, readings, context).tolil()
    dense = x[:, :width].toarray()
    if scale is None:
        scale = np.maximum(dense.std(axis=0), 1e-3)
    x[:, :width] = dense / scale
    return x.tocsr(), scale


def calibrate(model: LinearModel, dev: Sequence[Example]) -> LinearModel:
    """The temperature that minimises the dev negative log-likelihood (a 1-D grid search)."""
    known = [ex for ex in dev if ex.label in model.labels]
    if not known:
        return model
    logits = np.stack([model.logits(ex.case, reading=ex.reading) for ex in known])
    target = np.array([model.labels.index(ex.label) for ex in known])
    best, best_nll = 1.0, float("inf")
    for t in np.exp(np.linspace(np.log(0.2), np.log(5.0), 61)):
        z = logits / t
        z = z - z.max(axis=1, keepdims=True)
        nll = float(-(z[np.arange(len(z)), target] - np.log(np.exp(z).sum(axis=1))).mean())
        if nll < best_nll:
            best, best_nll = float(t), nll
    return LinearModel(model.weights, model.bias, model.scale, best, model.labels,
                       {**model.meta, "temperature_nll": round(best_nll, 4)})


@dataclass(frozen=True)
class Evaluation:
    """Agreement of predictions with reference labels (reference = the corpus's labels)."""

    n: int
    kappa: float
    kappa_follow_up: float
    accuracy: float
    per_label: dict[str, dict[str, Any]]
    confusion: list[list[int]]
    ece: float | None = None

    def line(self) -> str:
        return (f"n={self.n}  kappa {len(LABELS)}-way {_figure(self.kappa)}  follow-up vs rest "
                f"{_figure(self.kappa_follow_up)}  accuracy {self.accuracy:.3f}")

    def undefined(self) -> str | None:
        """Why a kappa could not be computed (the checked turns carry one label only, so
        agreement beyond chance is not defined), or None."""
        missing = [name for name, value in ((f"{len(LABELS)}-way", self.kappa),
                                            ("follow-up vs rest", self.kappa_follow_up))
                   if value != value]
        if not missing:
            return None
        return (f"kappa {' and '.join(missing)} is undefined on these {self.n} turn(s): their "
                "labels (or the classifier's) are all one kind, so agreement beyond chance "
                "cannot be measured; label more turns of each kind")


def _figure(value: float) -> str:
    return "undefined" if value != value else f"{value:.3f}"


# Below this many dev turns the dev split says little: agreement is measured by
# cross-validation over every turn instead (each fold's queries held out of its fit).
MIN_DEV_TURNS = 30


def cross_validate(examples: Sequence[Example], *, c: float = 0.5,
                   context: dict[str, Any] | None = None, folds: int = 5
                   ) -> tuple[list[str], list[float], list[str]]:
    """Predictions for every example from a model fit without its query's turns (``folds``
    folds by query, fewer where there are fewer queries): (labels, probabilities, reference)."""
    from userturn.labels.classifier import LearnedClassifier

    groups = sorted({ex.group for ex in examples})
    fold_of = {group: i % min(folds, len(groups)) for i, group in enumerate(groups)}
    labels: list[str] = []
    probs: list[float] = []
    reference: list[str] = []
    for fold in sorted(set(fold_of.values())):
        held = [ex for ex in examples if fold_of[ex.group] == fold]
        rest = [ex for ex in examples if fold_of[ex.group] != fold]
        kinds = {ex.label for ex in rest}
        if len(kinds) < 2:  # nothing to fit: the fold's model can only say the one label
            labels += [kinds.pop() if kinds else "undecided"] * len(held)
            probs += [1.0] * len(held)
        else:
            model = fit(rest, c=c, context=context)
            read = {ex.case: ex.reading for ex in held}
            got, conf = predict(LearnedClassifier(model, reader=read.__getitem__).classify, held)
            labels += got
            probs += conf
        reference += [ex.label for ex in held]
    return labels, probs, reference


def evaluate(predicted: Sequence[str], reference: Sequence[str],
             confidence: Sequence[float] | None = None) -> Evaluation:
    pairs = list(zip(reference, predicted))
    binary = [("f" if is_follow_up(a) else "r", "f" if is_follow_up(b) else "r")
              for a, b in pairs]
    ece = None
    if confidence is not None:
        ece = expected_calibration_error(confidence, [a == b for a, b in pairs])
    labels = (*LABELS, "undecided")  # the rules' undecided counts as a label of its own: wrong
    return Evaluation(len(pairs), cohen_kappa(pairs, labels), cohen_kappa(binary, ("f", "r")),
                      sum(a == b for a, b in pairs) / max(1, len(pairs)),
                      {k: v for k, v in per_label(pairs, labels).items() if k in LABELS},
                      confusion_matrix(pairs, labels), ece)


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool],
                               bins: int = 10) -> float:
    conf, hit = np.asarray(confidence, float), np.asarray(correct, float)
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            total += inside.mean() * abs(conf[inside].mean() - hit[inside].mean())
    return float(total)


def predict(labeller: Callable[[Case], Any], examples: Iterable[Example]
            ) -> tuple[list[str], list[float]]:
    labels, probs = [], []
    for ex in examples:
        result = labeller(ex.case)
        labels.append(result.label or "undecided")
        probs.append(result.probability if result.probability is not None else 1.0)
    return labels, probs
