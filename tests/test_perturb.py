"""Perturbations of the assistant turn, alone and inside a run (paired with the original)."""

from __future__ import annotations

import pytest
from helpers import (
    GSM_ITEMS,
    GSM_SAMPLES,
    experiment,
    grounded_script,
    is_user_turn,
    run_scripted,
)

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.errors import ConfigError
from userturn.probe.perturb import (
    GENERIC_QUESTION,
    REFUSAL,
    parse_perturbation,
    parse_perturbations,
)
from userturn.store.turns import read_turns

ANSWER = "He had 3 * 12 = 36 pencils. After giving away 10 he has 36 - 10 = 26.\n#### 26"
OTHERS = {"a": "answer A", "b": ANSWER, "c": "answer C"}


def apply(spec: str, answer: str = ANSWER, item: str = "b") -> str | None:
    return parse_perturbation(spec).apply(answer, item, OTHERS)


def test_truncate_cuts_the_last_fraction_of_words():
    words = ANSWER.split(" ")
    assert apply("truncate") == " ".join(words[: len(words) // 2])
    assert apply("truncate:0.25") == " ".join(words[: int(len(words) * 0.75)])
    assert apply("truncate", answer="Yes") is None  # nothing to cut: not applicable


def test_append_question_generic_and_specific():
    assert apply("append_question") == f"{ANSWER}\n\n{GENERIC_QUESTION}"
    specific = apply("append_question:specific")
    assert specific.startswith(ANSWER) and "how I got 26" in specific
    assert apply("append_question:specific", answer="No numbers here.") is None


def test_wrong_answer_changes_every_occurrence_of_the_final_number():
    wrong = apply("wrong_answer")
    assert "26" not in wrong and wrong.count("36") == 2  # other numbers untouched
    final = wrong.rsplit("#### ", 1)[1]
    assert final != "26" and f"= {final}." in wrong
    assert apply("wrong_answer") == wrong  # deterministic per item
    assert apply("wrong_answer", answer="I do not know.") is None


def test_swap_empty_refusal():
    assert apply("swap", item="b") == "answer C" and apply("swap", item="c") == "answer A"
    assert apply("empty") == "" and apply("refusal") == REFUSAL


@pytest.mark.parametrize("spec, message", [
    ("shuffle", "unknown perturbation"), ("truncate:2", "between 0 and 1"),
    ("truncate:half", "fraction"), ("append_question:rude", "generic or specific")])
def test_bad_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_perturbation(spec)
    with pytest.raises(ConfigError, match="twice"):
        parse_perturbations(["empty", "empty"])


def test_run_pairs_each_perturbed_context_with_the_original(gsm_file, tmp_path):
    backend = ScriptedBackend(grounded_script)
    specs = ["truncate", "append_question:specific", "wrong_answer"]
    store = run_scripted(experiment(gsm_file, tmp_path, perturbations=specs), backend)
    assistant_calls = [r for r in backend.requests if not is_user_turn(r)]
    assert len(assistant_calls) == GSM_ITEMS  # one answer per item, shared by every context
    turns = read_turns(store)
    by_item: dict[str, dict[str, set[str]]] = {}
    for turn in turns:
        by_item.setdefault(turn.item_id, {}).setdefault(turn.perturbation, set()).add(
            turn.answer)
    for contexts in by_item.values():
        assert "none" in contexts  # every perturbed context has its original
        (original,) = contexts["none"]
        for spec in set(contexts) - {"none"}:
            (changed,) = contexts[spec]
            assert changed != original
        if "truncate" in contexts:
            (cut,) = contexts["truncate"]
            assert original.startswith(cut)
    prompts = {t.perturbation: t.prompt for t in turns if t.item_id == turns[0].item_id}
    assert "Do you want me to walk you through" in prompts["append_question:specific"]
    rows = load_run(store).summary()
    assert {row.perturbation for row in rows} == {"none", *specs}
    assert all(row.turns in (row.items, row.items * GSM_SAMPLES) for row in rows)


def test_reference_and_other_model_answerers(gsm_file, tmp_path):
    prober = ScriptedBackend(grounded_script, spec="fake/prober")
    other = ScriptedBackend(lambda r: "The answer is 7." if not is_user_turn(r) else "Why 7?",
                            spec="fake/other")
    exp = experiment(gsm_file, tmp_path, models=["fake/prober"],
                     answerers=["self", "reference", "fake/other"])
    from userturn.probe.pipeline import run_experiment

    store = run_experiment(exp, backends={"fake/prober": prober, "fake/other": other})
    turns = read_turns(store)
    answers = {(t.answerer, t.item_id): t.answer for t in turns}
    first = turns[0].item_id
    assert answers[("fake/other", first)] == "The answer is 7."
    assert answers[("reference", first)].endswith("#### 26")  # the dataset's own solution
    assert all(not is_user_turn(r) for r in other.requests)  # the other model only answers
    assert all(t.model == "fake/prober" for t in turns)
    rows = load_run(store).summary()
    accuracy = {row.answerer: row.accuracy for row in rows}
    assert accuracy["reference"] is None and accuracy["fake/other"].n == GSM_ITEMS
