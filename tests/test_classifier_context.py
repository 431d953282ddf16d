"""Classifier parameters that read turns in context: their file, their version, their errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import userturn.labels.classifier as classifier_module
from userturn.errors import ConfigError
from userturn.labels.classifier import LearnedClassifier, LinearModel
from userturn.labels.context import CONTEXT_FEATURES, ContextReading
from userturn.labels.sources import labeller_named
from userturn.labels.training import Example, calibrate, context_meta, fit
from userturn.records import Case

# The shipped default labeller and its reader are what these tests are about (tests/conftest.py).
pytestmark = pytest.mark.context_reader

TURNS = {
    "follow_up": ["Why did you subtract 15 there?", "Can you show the 48 step again?",
                  "Where does the 33 come from?", "Why 4 times 12 and not 4 plus 12?"],
    "new_query": ["Write a poem about the sea.", "What is the capital of Peru?",
                  "How do I boil an egg?", "Tell me a joke about cats."],
}


def reading(label: str, index: int) -> ContextReading:
    """Made-up readings that separate the labels: the answer grounds a follow-up."""
    rng = np.random.default_rng(index)
    features = rng.normal(size=len(CONTEXT_FEATURES)).astype(np.float32)
    features[CONTEXT_FEATURES.index("answer_gain")] = 1.0 if label == "follow_up" else -1.0
    return ContextReading(features, rng.normal(size=8).astype(np.float32))


def examples(split: str) -> list[Example]:
    out = []
    for label, turns in TURNS.items():
        for index, turn in enumerate(turns):
            case = Case(f"Liam has {index} boxes; how many pencils?", "48 - 15 = 33.", turn, turn)
            out.append(Example(case, label, split, f"g{index}", "", reading(label, index)))
    return out


@pytest.fixture
def context_model() -> LinearModel:
    model = fit(examples("train"), context=context_meta("smollm2@test", 8))
    return calibrate(model, examples("dev"))


def test_a_context_model_round_trips_and_reads_each_turn(context_model, tmp_path):
    path = tmp_path / "ctx.npz"
    context_model.save(path)
    loaded = LinearModel.load(path)
    assert loaded.context == context_model.context
    assert loaded.dense_width == context_model.dense_width
    read: list[str] = []

    def reader(case: Case) -> ContextReading:
        read.append(case.user_turn)
        return reading("follow_up", 1)

    learned = LearnedClassifier(loaded, reader=reader)
    label = learned.classify(examples("test")[0].case)
    assert read == [examples("test")[0].case.user_turn]
    assert label.label in TURNS and label.error is None
    # Reading the turn in context is part of the labeller: other parameters, another version.
    plain = fit(examples("train"))
    assert LearnedClassifier(plain).version != learned.version


def test_without_a_reading_the_label_carries_the_error_not_a_guess(context_model):
    label = LearnedClassifier(context_model, reader=lambda case: None).classify(
        examples("test")[0].case)
    assert label.label is None and "ContextReading" in (label.error or "")


def test_parameters_for_features_this_version_does_not_compute_are_one_error(context_model,
                                                                             tmp_path):
    meta = {**context_model.meta, "context": {**context_model.meta["context"],
                                              "features": ["lp_after_answer", "something_new"]}}
    path = tmp_path / "future.npz"
    LinearModel(context_model.weights, context_model.bias, context_model.scale,
                context_model.temperature, context_model.labels, meta).save(path)
    with pytest.raises(ConfigError, match="context features this version of userturn"):
        LinearModel.load(path)


def test_the_default_parameters_missing_or_corrupt_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(classifier_module, "MODEL_FILE", tmp_path / "gone.npz")
    with pytest.raises(ConfigError, match="no classifier parameters at .*gone.npz"):
        LearnedClassifier()
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    monkeypatch.setattr(classifier_module, "MODEL_FILE", broken)
    with pytest.raises(ConfigError, match="not a classifier file"):
        LearnedClassifier()


@pytest.mark.slow
def test_parameters_from_another_scorer_refuse_to_label(context_model):
    """Readings from another SmolLM2 file would be other numbers: the classifier says so rather
    than label with them."""
    meta = {**context_model.meta, "context": {**context_model.meta["context"],
                                              "scorer": "smollm2@gguf-sha256:0000000000000000"}}
    model = LinearModel(context_model.weights, context_model.bias, context_model.scale,
                        context_model.temperature, context_model.labels, meta)
    with pytest.raises(ConfigError, match="trained with the context scorer"):
        LearnedClassifier(model).classify(examples("test")[0].case)


# Turns of the round-5 corpus's test split (tests/fixtures/pinned_turns.jsonl, with their source
# and adjudicated label), one or more per generator and from people, with the context
# classifier's label: each the adjudicated one, at probability >= 0.76 when pinned.
PINNED = {
    "t2c1aed7f14e6": ("smollm2", "follow_up"),
    "tb0bb2fb6e701": ("smollm2", "empty"),
    "t6205abc2ac97": ("smollm2", "assistant_drift"),
    "t86a1f56e44de": ("qwen2.5-coder-1.5b", "follow_up"),
    "t8fdae5c035e4": ("qwen2.5-coder-1.5b", "new_query"),
    "t5afa94a7b348": ("qwen2.5-coder-1.5b", "restatement"),
    "taf54cfec9d6c": ("human", "follow_up"),
    "t573270144f79": ("human", "new_query"),
}


def test_the_context_parameters_ship_by_name():
    assert LinearModel.load("context").context is not None  # type: ignore[arg-type]
    assert LinearModel.load("form").context is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_context_labeller_on_turns_of_each_generator_and_of_people():
    """The cascade over the context classifier as a run uses it (`--classifier context`): the
    rules, then the classifier reading each turn in context, with the turns read live by the
    embedded SmolLM2; and the same labels from the readings shipped for the corpus's turns,
    which its default reader takes instead."""
    from pathlib import Path

    from userturn.labels.classifier import MODEL_FILE
    from userturn.labels.context import ContextScorer

    fixture = Path(__file__).parent / "fixtures" / "pinned_turns.jsonl"
    rows = {row["id"]: row for row in map(json.loads, fixture.read_text().splitlines())}
    assert set(rows) == set(PINNED)
    scorer = ContextScorer()
    # All eight read in one batch (eight answers: padded and masked), as a run's turns are read.
    scorer.read_many([Case(row["query"], row["answer"], row["user_turn"], row["user_turn"])
                      for row in rows.values()])
    reading, shipped = LearnedClassifier(path=MODEL_FILE, reader=scorer.read), \
        LearnedClassifier(path=MODEL_FILE)
    cascade = labeller_named("cascade")
    live, default = cascade.case_labeller(learned=reading), cascade.case_labeller(learned=shipped)
    for key, (generator, expected) in PINNED.items():
        row = rows[key]
        source = row["source"]
        assert generator == source["kind"] or generator.split("2")[0] in source["model"].lower()
        assert row["label"] == expected
        case = Case(row["query"], row["answer"], row["user_turn"], row["user_turn"])
        # The cascade labels each right (the rules decide a query repeated word for word); the
        # classifier reading in context labels each right on its own too.
        assert live.classify(case).label == expected, key
        label = reading.classify(case)
        assert (label.label, label.source) == (expected, "classifier"), key
        assert label.probability is not None and label.probability > 0.5
        assert default.classify(case).label == expected, key
        stored = shipped.read(case)
        assert stored is not None
        assert np.allclose(scorer.read(case).features, stored.features, atol=2e-3)


def test_the_default_classifier_reads_turns_in_context():
    """The shipped default is the context classifier, trained with this machine's scorer; the
    form-only parameters are the named alternative."""
    from userturn.labels.classifier import FORM_MODEL_FILE, MODEL_FILE
    from userturn.labels.context import scorer_name

    default = LearnedClassifier()
    assert default.model.context is not None
    assert default.model.context["scorer"] == scorer_name()
    assert classifier_module.parameters_file("context") == MODEL_FILE
    assert classifier_module.parameters_file("form") == FORM_MODEL_FILE


def without_torch(monkeypatch):
    """This machine as one without torch: find_spec says so (nothing is imported by the check)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torch" else real(name, *args))


def test_without_the_scorer_a_run_is_refused_before_it_generates(gsm_file, tmp_path,
                                                                 monkeypatch):
    """On a machine that cannot run the context scorer the default labeller says what to
    install (or which labeller needs nothing) before any model is called."""
    from helpers import experiment, grounded_script, run_scripted

    from userturn.backends.fake import ScriptedBackend
    from userturn.store.sqlite import DB_NAME

    without_torch(monkeypatch)
    backend = ScriptedBackend(grounded_script)
    with pytest.raises(ConfigError, match=r"needs torch: .*--classifier form .*--labeller rules"):
        run_scripted(experiment(gsm_file, tmp_path), backend)
    assert backend.calls == 0
    assert not (tmp_path / "run" / DB_NAME).exists()  # no run store was written
    # The form-only classifier and the rules need no model: the same run goes through.
    store = run_scripted(experiment(gsm_file, tmp_path, classifier="form"), backend)
    assert store.meta().labeller == "cascade" and backend.calls > 0
