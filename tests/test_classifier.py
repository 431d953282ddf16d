"""The learned classifier: shipped predictions, `classify` on files, the labelling cascade and its
routing to the judge, relabelling a stored run, and retraining on a user's own labels."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, undecided_script
from openai_fake import FakeOpenAI

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.labels.classifier import LearnedClassifier, LinearModel
from userturn.labels.corpus import corpus_examples
from userturn.probe.pipeline import run_experiment
from userturn.records import LABELS, Case
from userturn.store.database import RunStore
from userturn.store.turns import read_turns

GSM_QUERY = ("Liam buys 4 boxes of pencils with 12 pencils in each box. He gives 15 pencils to "
             "his friends. How many pencils does he have left?")
GSM_ANSWER = ("Liam has 4 x 12 = 48 pencils. After giving away 15, he has 48 - 15 = 33 "
              "pencils left.\n#### 33")
CLEAR = {
    "follow_up": "Wait, why did you subtract 15 from 48? I thought he gave away 15 boxes.",
    "restatement": ("Liam buys 4 boxes of pencils with 12 pencils in each box. He gives 15 "
                    "pencils to his friends. How many pencils does he have left?"),
    "assistant_drift": ("Let's solve this step by step. Liam has 4 x 12 = 48 pencils. Then 48 - "
                        "15 = 33. So the answer is 33.\n#### 33"),
    "empty": "the the the the the the the the the the the the the the the the",
}


def case(turn: str) -> Case:
    return Case(GSM_QUERY, GSM_ANSWER, turn, turn)


@pytest.mark.parametrize("expected", sorted(CLEAR))
def test_the_shipped_classifier_labels_clear_cases(expected):
    label = LearnedClassifier().classify(case(CLEAR[expected]))
    assert (label.label, label.source) == (expected, "classifier")
    assert 0.0 < label.probability <= 1.0


def test_probabilities_are_a_distribution_over_the_labels():
    classifier = LearnedClassifier()
    turn = case("Thanks, that makes sense!")
    probs = classifier.model.probabilities(turn, reading=classifier.read(turn))
    assert set(classifier.model.labels) == set(LABELS)
    assert np.isclose(probs.sum(), 1.0) and (probs > 0).all()


def test_the_shipped_corpus_has_disjoint_splits_by_query():
    splits: dict[str, set[str]] = {}
    for example in corpus_examples():
        splits.setdefault(example.group, set()).add(example.split)
    assert all(len(s) == 1 for s in splits.values())
    assert {s for group in splits.values() for s in group} == {"train", "dev", "test"}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_classify_labels_a_file_and_never_overwrites(tmp_path, capsys):
    rows = [{"query": GSM_QUERY, "answer": GSM_ANSWER, "user_turn": CLEAR[k], "mine": k}
            for k in sorted(CLEAR)]
    source, out = write_jsonl(tmp_path / "turns.jsonl", rows), tmp_path / "out.jsonl"
    assert main(["classify", str(source), "-o", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["mine"] for r in written] == sorted(CLEAR)  # every field kept, order kept
    assert all(r["label"] == r["mine"] for r in written)
    assert all(r["source"] in ("rules", "classifier") for r in written)
    assert all(r["probability"] is None or 0 < r["probability"] <= 1 for r in written)
    assert "4 turn(s) labelled (cascade)" in capsys.readouterr().err
    before = out.read_text()
    assert main(["classify", str(source), "-o", str(out), "--labeller", "rules"]) == 2
    assert "exists: give --force" in capsys.readouterr().err and out.read_text() == before


@pytest.mark.parametrize("bad, message", [
    ({"query": "q", "answer": "a"}, "line 2: field 'user_turn' is missing"),
    ({"query": "q", "answer": 7, "user_turn": "u"}, "line 2: field 'answer' is not text"),
    ("{not json", "line 2: invalid JSON"),
])
def test_classify_names_the_bad_line_and_writes_nothing(tmp_path, capsys, bad, message):
    good = {"query": "q", "answer": "a", "user_turn": "Thanks!"}
    source = write_jsonl(tmp_path / "turns.jsonl", [good, bad])
    out = tmp_path / "out.jsonl"
    assert main(["classify", str(source), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


def generations(folder: Path) -> int:
    with sqlite3.connect(folder / "userturn.db") as db:
        return db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]


def test_the_cascade_labels_every_turn_and_says_by_whom(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    turns = read_turns(store)
    assert all(t.label is not None for t in turns)
    by = {t.temperature: t.label_source for t in turns}
    assert by == {0.0: "rules", 1.0: "classifier"}  # "Thanks!" is the rules' clear case
    assert store.label_sources() == ["rules", "classifier"]


def test_rules_alone_stay_selectable_and_relabelling_generates_nothing(gsm_file, tmp_path, capsys):
    exp = experiment(gsm_file, tmp_path, labeller="rules")
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    assert store.label_sources() == ["rules"]
    assert sum(t.label is None for t in read_turns(store)) == GSM_ITEMS * GSM_SAMPLES
    before = generations(exp.plan.output)
    store.close()
    assert main(["label", str(exp.plan.output)]) == 0
    assert generations(exp.plan.output) == before
    store = RunStore.open(exp.plan.output)
    assert store.label_sources() == ["rules", "classifier"]
    assert all(t.label is not None for t in read_turns(store))


def test_judge_scope_uncertain_asks_only_below_the_threshold(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    store = RunStore.open(exp.plan.output)
    turns = read_turns(store)
    labels = {(t.key, lab.source): lab for t in turns for lab in t.labels}
    undecided = sorted(labels[t.key, "classifier"].probability for t in turns
                       if labels[t.key, "rules"].label is None)
    threshold = (undecided[0] + undecided[-1]) / 2 if undecided[0] < undecided[-1] else 1.0
    expected = sum(p < threshold for p in undecided)
    assert 0 < expected <= GSM_ITEMS * GSM_SAMPLES
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "meta", "rationale": "Narrates."}
        assert main(["judge", str(exp.plan.output), "--judge", "openai/j", "--base-url", fake.url,
                     "--scope", "uncertain", "--threshold", str(threshold)]) == 0
        assert len(fake.requests) == expected
    store = RunStore.open(exp.plan.output)
    assert store.label_sources() == ["rules", "judge:openai/j@rubric1", "classifier"]
    judged = [t for t in read_turns(store) if t.label_source == "judge:openai/j@rubric1"]
    assert len(judged) == expected and {t.label for t in judged} == {"meta"}


def small_labelled_file(path: Path) -> Path:
    rows = []
    for i in range(24):
        query = f"Tom has {i + 3} apples and buys {i + 2} more. How many apples does he have?"
        answer = f"{i + 3} + {i + 2} = {2 * i + 5}. #### {2 * i + 5}"
        rows.append({"query": query, "answer": answer, "label": "follow_up",
                     "user_turn": f"Why did you add {i + 2} to {i + 3}?"})
        rows.append({"query": query, "answer": answer, "label": "generic",
                     "user_turn": "Thanks a lot, that was helpful!"})
        rows.append({"query": query, "answer": answer, "label": "restatement",
                     "user_turn": query})
    return write_jsonl(path, rows)


def test_train_classifier_reports_dev_agreement_then_writes(tmp_path, capsys):
    labelled, out = small_labelled_file(tmp_path / "mine.jsonl"), tmp_path / "mine.npz"
    assert main(["train-classifier", str(labelled), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    # 72 turns leave about 10 for a dev split: every turn is checked by cross-validation
    assert "cross-validated agreement" in printed and "n=72  kappa 7-way" in printed
    model = LinearModel.load(out)
    assert model.labels == ("follow_up", "generic", "restatement")
    classifier = LearnedClassifier(model)
    query = "Ann has 40 apples and buys 3 more. How many apples does she have?"
    assert classifier.classify(Case(query, "40 + 3 = 43. #### 43",
                                    "Why did you add 3 to 40?")).label == "follow_up"
    # the new parameters label a file through --classifier
    turns = write_jsonl(tmp_path / "t.jsonl", [{"query": query, "answer": "43",
                                                "user_turn": "Thanks a lot, that was helpful!"}])
    assert main(["classify", str(turns), "--labeller", "classifier", "--classifier",
                 str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["label"] == "generic"
    assert main(["train-classifier", str(labelled), "-o", str(out)]) == 2  # exists
    assert "--force" in capsys.readouterr().err


def test_train_classifier_on_a_handful_of_rows_checks_every_row_and_says_so(tmp_path, capsys):
    kinds = [("follow_up", "Why did you add {a} to {b}?"), ("generic", "Thanks, that helps!"),
             ("new_query", "Write me a poem about the sea."), ("empty", "")]
    rows = [{"query": f"What is {i} + {i + 1}?", "answer": f"{i} + {i + 1} = {2 * i + 1}.",
             "label": label, "user_turn": turn.format(a=i, b=i + 1)}
            for i, (label, turn) in enumerate(kinds * 2)]
    labelled, out = write_jsonl(tmp_path / "eight.jsonl", rows), tmp_path / "eight.npz"
    with pytest.warns(UserWarning, match="8 labelled turn") as said:
        assert main(["train-classifier", str(labelled), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    # Not 7 to train and 1 to check with "kappa nan": all 8 train, each checked by a model fit
    # without its query, and the reader is told why.
    assert "training on 8 turn(s), checked by cross-validation by query" in printed
    assert "cross-validated agreement (classifier vs your labels, by query): n=8 " in printed
    assert "nan" not in printed
    (warning,) = [str(w.message) for w in said]
    assert warning.startswith(f"{labelled}: 8 labelled turn(s) leave ")
    assert "cross-validation by query" in warning
    assert LinearModel.load(out).labels == ("follow_up", "generic", "new_query", "empty")


def test_an_undefined_kappa_is_said_in_words_not_nan():
    from userturn.labels.training import evaluate

    result = evaluate(["generic", "generic"], ["generic", "generic"])
    assert "nan" not in result.line() and "kappa 7-way undefined" in result.line()
    assert "labels (or the classifier's) are all one kind" in (result.undefined() or "")
    assert evaluate(["generic", "follow_up"], ["generic", "follow_up"]).undefined() is None


def test_train_classifier_names_a_bad_label(tmp_path, capsys):
    labelled = write_jsonl(tmp_path / "bad.jsonl", [
        {"query": "q", "answer": "a", "user_turn": "u", "label": "follow_up"},
        {"query": "q", "answer": "a", "user_turn": "u", "label": "followup"}])
    assert main(["train-classifier", str(labelled), "-o", str(tmp_path / "x.npz")]) == 2
    assert "line 2: field 'label' is 'followup'" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_relabelling_with_retrained_parameters_labels_under_their_own_source(
        gsm_file, tmp_path, capsys):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    before = generations(exp.plan.output)
    assert main(["label", str(exp.plan.output)]) == 0
    printed = capsys.readouterr().out
    assert "0 label(s) added" in printed  # the same parameters: nothing to redo
    assert "in progress" not in printed  # the command does not report its own lock
    mine = tmp_path / "mine.npz"
    assert main(["train-classifier", str(small_labelled_file(tmp_path / "mine.jsonl")),
                 "-o", str(mine)]) == 0
    capsys.readouterr()
    assert main(["label", str(exp.plan.output), "--classifier", str(mine)]) == 0
    store = RunStore.open(exp.plan.output)
    turns = read_turns(store)
    # The cascade's classifier labels the turns the rules leave: here every sampled turn.
    undecided = [t for t in turns if t.temperature > 0]
    assert f"{len(undecided)} label(s) added" in capsys.readouterr().out
    # other parameters are another source, named by the file and its parameters; the shipped
    # classifier's labels stay stored under its own name
    mine_source = LearnedClassifier(path=mine).name
    assert mine_source.startswith("classifier:mine-")
    assert store.label_sources() == ["rules", mine_source]
    learned = [lab for t in turns for lab in t.labels if lab.source == mine_source]
    assert len(learned) == len(undecided) == GSM_ITEMS * GSM_SAMPLES
    assert {lab.version for lab in learned} == {LearnedClassifier(path=mine).version}
    assert len([lab for t in turns for lab in t.labels if lab.source == "classifier"]) == len(
        undecided)
    assert {lab.label for lab in learned} <= {"follow_up", "generic", "restatement"}
    assert generations(exp.plan.output) == before  # only labels changed
