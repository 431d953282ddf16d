"""The classifier fit to a user's labelled turns, end to end (``userturn train-classifier``):
the splits (the user's turns, with the shipped corpus's train split or not), the context
readings the parameters need, the fit and the check of it on turns it was not fit to.

The steps themselves are :mod:`.training`'s; this module chains them, so the command only reads
its flags and prints.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from userturn.errors import UserturnError
from userturn.records import Progress

if TYPE_CHECKING:  # numpy and the model: imported by the functions, so the CLI starts light
    from userturn.labels.classifier import LinearModel
    from userturn.labels.training import Evaluation, Example

# What the classifier reads of a turn in context (through the embedded SmolLM2): as the shipped
# parameters do, nothing (form alone), the likelihood ratios, or those and the hidden state.
ContextChoice = Literal["shipped", "none", "ratios", "hidden"]
CONTEXT_CHOICES: tuple[ContextChoice, ...] = get_args(ContextChoice)


@dataclass(frozen=True)
class Splits:
    """The labelled turns a classifier is fit and checked on (test turns are never used)."""

    train: list[Example]
    dev: list[Example]
    test: int  # turns of the test split, left untouched

    @property
    def small(self) -> bool:
        """Too few dev turns to measure anything: every turn is checked by cross-validation
        by query instead, and every turn trains."""
        from userturn.labels.training import MIN_DEV_TURNS

        return len(self.dev) < MIN_DEV_TURNS


@dataclass(frozen=True)
class Fitted:
    """A fit classifier and how it agrees with the labels it was checked against."""

    model: LinearModel
    result: Evaluation
    checked: str  # how the agreement was measured, for the line that shows it


def training_splits(labelled: Path, *, with_corpus: bool = False) -> Splits:
    """The train and dev turns of ``labelled`` (JSON Lines; without splits a dev split is drawn
    by query), after the shipped corpus's train split when ``with_corpus``. Refused when either
    split is empty: a fit needs the turns of several queries."""
    from userturn.labels.training import assign_splits, read_examples

    examples = assign_splits(read_examples(labelled))
    if with_corpus:
        from userturn.labels.corpus import corpus_examples

        examples = [*corpus_examples("train"), *examples]
    train = [ex for ex in examples if ex.split == "train"]
    dev = [ex for ex in examples if ex.split == "dev"]
    if not train or not dev:
        raise UserturnError(f"{labelled}: needs turns of several queries for a train and a "
                            f"dev split (got {len(train)} train, {len(dev)} dev)")
    return Splits(train, dev, sum(ex.split == "test" for ex in examples))


def fit_classifier(splits: Splits, labelled: Path, *, c: float = 0.5,
                   context: ContextChoice = "shipped", readings: Path,
                   progress: Progress | None = None) -> Fitted:
    """Fit the classifier to ``splits`` (read from ``labelled``, named in warnings) and check
    it: on the dev split, the probabilities calibrated on it; with too few dev turns, by
    cross-validation by query, and then fit to every turn. ``readings`` caches the turns'
    context readings, so a killed training resumes from it."""
    from userturn.labels.classifier import LearnedClassifier
    from userturn.labels.training import calibrate, cross_validate, evaluate, fit, predict

    meta = context_meta_of(context)
    train, dev = splits.train, splits.dev
    if meta is not None:
        train, dev = read_in_context(train, dev, readings, progress)
    if splits.small:
        # A dev split of a few turns measures nothing (8 rows: 1 dev turn, kappa undefined):
        # every turn is checked by a model fit without its query, and all of them train.
        warnings.warn(f"{labelled}: {len(train) + len(dev)} labelled turn(s) leave "
                      f"{len(dev)} for a dev split: agreement is measured by cross-validation "
                      "by query instead, and the classifier is fit to every turn (with a few "
                      "hundred across the labels it can be checked on held-out queries)",
                      stacklevel=1)
        labels, probs, reference = cross_validate([*train, *dev], c=c, context=meta)
        model = fit([*train, *dev], c=c, context=meta)
        checked = "cross-validated agreement (classifier vs your labels, by query)"
    else:
        model = calibrate(fit(train, c=c, context=meta), dev)
        read = {ex.case: ex.reading for ex in dev}  # dev turns were read in context above
        labels, probs = predict(LearnedClassifier(model, reader=read.__getitem__).classify, dev)
        reference, checked = [ex.label for ex in dev], "dev agreement (classifier vs your labels)"
    result = evaluate(labels, reference, probs)
    if result.undefined():
        warnings.warn(f"{labelled}: {result.undefined()}", stacklevel=1)
    return Fitted(model, result, checked)


def context_meta_of(choice: ContextChoice) -> dict[str, Any] | None:
    """``meta["context"]`` of the parameters ``choice`` asks for (None: form alone)."""
    from userturn.labels.classifier import MODEL_FILE, LinearModel
    from userturn.labels.context import HIDDEN_SIZE, scorer_name
    from userturn.labels.training import context_meta

    if choice == "shipped":
        shipped = LinearModel.load(MODEL_FILE).context
        if not shipped:
            return None
        choice = "hidden" if shipped.get("embedding") else "ratios"
    if choice == "none":
        return None
    return context_meta(scorer_name(), HIDDEN_SIZE if choice == "hidden" else 0)


def read_in_context(train: list[Example], dev: list[Example], cache: Path,
                    progress: Progress | None = None) -> tuple[list[Example], list[Example]]:
    """Train and dev examples with their context readings: the corpus's from the shipped file,
    the others scored now (cached in ``cache``, so a kill resumes)."""
    from userturn.labels.context import scorer_name
    from userturn.labels.readings import corpus_readings, read_cases
    from userturn.labels.training import with_readings

    known, scorer = corpus_readings()
    if scorer != scorer_name():  # readings of another SmolLM2 file would not match
        known = {}
    readings = read_cases([ex.case for ex in [*train, *dev]], cache, known, progress=progress)
    return (with_readings(train, readings[:len(train)]),
            with_readings(dev, readings[len(train):]))
