"""Reasoning models end to end, with scripted outputs that think: what is stored (thinking apart,
raw text as is), what is scored and labelled (the visible text), the policy for the answer's
thinking, and enable_thinking variants as models of their own. Plus the tiny real model."""

from __future__ import annotations

import pytest
from conftest import QUESTIONS
from helpers import THINKING_ITEMS, load_family, thinking_experiment

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.errors import ConfigError
from userturn.labels.judge import Judge
from userturn.probe.pipeline import run_experiment
from userturn.records import Case, Request
from userturn.report.compare import compare_runs
from userturn.report.page import browser_data
from userturn.store.database import RunStore
from userturn.store.turns import read_answers, read_turns

BOXES, APPLES, PAGES = (q for q, _ in QUESTIONS[:THINKING_ITEMS])
REFERENCE = {q: a for q, a in QUESTIONS}
# Thinking that would mislead the scorer ("#### N" is tried first) and the rules (it reads as meta)
# if it were not split off.
ANSWER_THOUGHT = "Maybe it is #### 99"
USER_THOUGHT = "The user is asking something."
LONG_THOUGHT = ("The user wants me to write what they would say next, so let me consider the "
                "numbers in the answer and what a curious student might ask about them")


def question(prompt: str) -> str:
    return next(q for q in REFERENCE if q in prompt)


def qwen3_script(request: Request) -> str:
    prompt = request.prompt
    if prompt.endswith("<|im_start|>user\n"):  # the probe's open user turn
        asked = question(prompt.rsplit("<|im_start|>assistant", 1)[0])
        if asked == BOXES:
            return f"<think>\n{USER_THOUGHT}\n</think>\n\nThanks!"
        if asked == APPLES:
            return f"<think>\n{LONG_THOUGHT}"  # runs out of tokens inside the block
        return "Why did you multiply 20 by 6?"
    answer = f"The answer is {REFERENCE[question(prompt)]}."
    if prompt.endswith("</think>\n\n"):  # enable_thinking false: the template closed the block
        return answer
    return f"<think>\n{ANSWER_THOUGHT}\n</think>\n\n{answer}"


def qwen3_backend(**changes) -> ScriptedBackend:
    template = load_family("qwen3")
    template = template.__class__(template.source, "fake/qwen3", None, "<|im_end|>")
    return ScriptedBackend(qwen3_script, spec="fake/qwen3", template=template, **changes)


def turns_by_question(store: RunStore) -> dict[str, dict]:
    return {question(t.prompt.rsplit("<|im_start|>assistant", 1)[0]): t
            for t in read_turns(store)}


def test_thinking_is_stored_apart_and_the_visible_text_is_scored_and_labelled(gsm_file, tmp_path):
    store = run_experiment(thinking_experiment(gsm_file, tmp_path / "run"),
                           backends={"fake/qwen3": qwen3_backend()})
    answers = read_answers(store)
    assert [a.thinking for a in answers] == [ANSWER_THOUGHT] * THINKING_ITEMS
    assert all(a.text.startswith("The answer is") for a in answers)
    assert all(a.correct == 1 for a in answers)  # the thinking's "#### 99" was not scored

    turns = turns_by_question(store)
    thanked = turns[BOXES]
    assert (thanked.user_turn, thanked.thinking) == ("Thanks!", USER_THOUGHT)
    assert thanked.raw_user_turn.startswith(f"<think>\n{USER_THOUGHT}")  # raw text as generated
    assert thanked.label == "generic"  # the visible "Thanks!", not the thinking (meta)

    only = turns[APPLES]
    assert only.user_turn == "" and only.finish_reason == "length"
    assert only.thinking.startswith("The user wants me to write")
    assert only.label == "empty" and "thinking only" in only.rationale

    plain = turns[PAGES]
    assert plain.thinking is None and plain.user_turn == "Why did you multiply 20 by 6?"

    # drop (the default): the prober sees the answer as the template shows it, without thinking
    assert all(ANSWER_THOUGHT not in t.prompt for t in turns.values())
    assert store.meta().config["thinking"] == "drop"

    records = {t.key: t.record() for t in read_turns(store)}
    assert records[only.key]["thinking"] == only.thinking
    shown = {t["key"]: t for t in browser_data(load_run(store).report())["turns"]}
    assert shown[thanked.key]["thinking"] == USER_THOUGHT and shown[plain.key]["thinking"] is None


def test_keep_policy_shows_the_thinking_and_is_part_of_the_key(gsm_file, tmp_path):
    out = tmp_path / "run"
    dropped = run_experiment(thinking_experiment(gsm_file, out), backends={"fake/qwen3": qwen3_backend()})
    drop_keys = {t.key for t in read_turns(dropped)}
    dropped.close()

    backend = qwen3_backend()
    kept = run_experiment(thinking_experiment(gsm_file, out, thinking="keep"),
                          backends={"fake/qwen3": backend})
    # The answers are reused; every user turn is generated again, under its own keys.
    assert backend.calls == THINKING_ITEMS and all(r.prompt.endswith("user\n") for r in backend.requests)
    turns = read_turns(kept)
    assert {t.key for t in turns}.isdisjoint(drop_keys) and len(turns) == THINKING_ITEMS
    for turn in turns:
        assert f"<|im_start|>assistant\n<think>\n{ANSWER_THOUGHT}\n</think>\n\nThe answer is" \
            in turn.prompt
    assert kept.meta().config["thinking"] == "keep"

    again = qwen3_backend()
    run_experiment(thinking_experiment(gsm_file, out, thinking="keep"), backends={"fake/qwen3": again})
    assert again.calls == 0  # a finished keep run re-run makes no model calls


def test_enable_thinking_variants_are_models_of_their_own(gsm_file, tmp_path):
    on, off = "fake/qwen3[thinking=on]", "fake/qwen3[thinking=off]"
    backend = qwen3_backend()
    store = run_experiment(thinking_experiment(gsm_file, tmp_path / "a", enable_thinking=[True, False]),
                           backends={"fake/qwen3": backend})
    # Each value is its own prober: the model's spec with enable_thinking typed beside it, its
    # own answers, its own rows, printed under the name the tables give it.
    answers = {(a.model, a.enable_thinking, a.item_id): a for a in read_answers(store)}
    assert {(model, value) for model, value, _ in answers} == {("fake/qwen3", "on"),
                                                               ("fake/qwen3", "off")}
    assert all((a.thinking is None) is (value == "off")
               for (_, value, _), a in answers.items())
    assert len(backend.requests) == 2 * (THINKING_ITEMS + THINKING_ITEMS)  # answers and user turns, per variant
    rows = load_run(store).summary()
    assert {(row.model, row.enable_thinking) for row in rows if row.model != "human"} == {
        ("fake/qwen3", "on"), ("fake/qwen3", "off")}
    assert {row.probed for row in rows} >= {on, off}
    assert all(row.accuracy is not None for row in rows if row.model != "human")
    turns = read_turns(store)
    assert {(t.model, t.enable_thinking) for t in turns if t.model != "human"} == {
        ("fake/qwen3", "on"), ("fake/qwen3", "off")}
    variables = {m: v.template_variables for m, v in store.meta().models.items()}
    assert variables == {on: {"enable_thinking": True}, off: {"enable_thinking": False}}

    other = run_experiment(thinking_experiment(gsm_file, tmp_path / "b", enable_thinking=[True, False],
                                      thinking="keep"), backends={"fake/qwen3": qwen3_backend()})
    comparisons, accuracy = compare_runs(store, other)
    assert {c.model_a for c in comparisons} == {on, off}
    assert {a.model_a for a in accuracy} == {on, off}


def test_enable_thinking_on_a_template_that_ignores_it_is_refused(gsm_file, tmp_path):
    out = tmp_path / "run"
    backend = ScriptedBackend(lambda request: "Thanks!")  # ChatML without enable_thinking
    with pytest.raises(ConfigError, match="enable_thinking has no effect on the chat template "
                                          "of fake/scripted"):
        run_experiment(thinking_experiment(gsm_file, out, models=["fake/scripted"],
                                  enable_thinking=[True]), backends={"fake/scripted": backend})
    assert backend.calls == 0 and not out.exists()


# ------------------------------------------------------------------ gpt-oss harmony

HARMONY_ANALYSIS = "We need the total. 48 and 24."


def harmony_script(request: Request) -> str:
    if request.prompt.endswith("<|start|>assistant"):
        answer = REFERENCE[question(request.prompt)]
        return (f"<|channel|>analysis<|message|>{HARMONY_ANALYSIS}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>The answer is {answer}.<|return|>")
    if BOXES in request.prompt:  # reasons in the user's seat and stops at <|end|>
        return "<|channel|>analysis<|message|>The user would probably ask about it.<|end|>"
    return "Why did you multiply?<|end|>"


def test_gpt_oss_harmony_end_to_end(gsm_file, tmp_path):
    template = load_family("gpt_oss")
    backend = ScriptedBackend(harmony_script, spec="fake/gpt-oss", template=template)
    store = run_experiment(thinking_experiment(gsm_file, tmp_path / "run", models=["fake/gpt-oss"]),
                           backends={"fake/gpt-oss": backend})
    answers = read_answers(store)
    assert {a.thinking for a in answers} == {HARMONY_ANALYSIS}
    assert all(a.text.startswith("The answer is") and a.correct for a in answers)
    turns = {question(t.prompt): t for t in read_turns(store)}
    for turn in turns.values():  # history: the final message only, closed with <|end|>
        assert HARMONY_ANALYSIS not in turn.prompt
        assert turn.prompt.endswith(".<|end|><|start|>user<|message|>")
    assert turns[BOXES].user_turn == "" and turns[BOXES].label == "empty"
    assert turns[BOXES].thinking == "The user would probably ask about it."
    assert "thinking only" in turns[BOXES].rationale
    assert turns[APPLES].user_turn == "Why did you multiply?" and turns[APPLES].thinking is None


def test_the_judge_is_not_asked_about_a_turn_that_is_thinking_only():
    class Refusing:
        name = "refusing"

        def chat(self, messages, *, max_tokens, json_schema=None):
            raise AssertionError("the judge was asked")

    label = Judge(Refusing()).classify(Case("q", "a", "", "", "", thinking="Let me think."))
    assert label.label == "empty" and "thinking only" in label.rationale


# ------------------------------------------------------------------ the tiny real model


def test_tiny_model_policy_in_the_key_and_enable_thinking_refused(tiny_backend, gsm_file, tmp_path):
    out = tmp_path / "run"
    exp = thinking_experiment(gsm_file, out, models=["tiny"], limit=2, user_max_tokens=8, max_tokens=8)
    with pytest.raises(ConfigError, match="no effect on the chat template of tiny"):
        run_experiment(thinking_experiment(gsm_file, out, models=["tiny"], limit=2,
                                           user_max_tokens=8, max_tokens=8,
                                           enable_thinking=[True, False]),
                       backends={"tiny": tiny_backend})
    dropped = run_experiment(exp, backends={"tiny": tiny_backend})
    before = {t.key: t for t in read_turns(dropped)}
    dropped.close()
    kept = run_experiment(thinking_experiment(gsm_file, out, models=["tiny"], limit=2,
                                              user_max_tokens=8, max_tokens=8, thinking="keep"),
                          backends={"tiny": tiny_backend})
    after = {t.key: t for t in read_turns(kept)}
    # The random tiny model does not think, so the prompts are the same, but a resumed run with
    # another policy never reuses the other policy's generations.
    assert sorted(t.prompt for t in before.values()) == sorted(t.prompt for t in after.values())
    assert set(before).isdisjoint(after)
    for turn in after.values():  # what was not split stays exactly as the backend returned it
        assert turn.thinking is None or "<think>" in turn.raw_user_turn
