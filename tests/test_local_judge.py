"""A judge you run yourself: the verdict read from the seven labels' probabilities.

Scripted scores show the reading (the most likely label, its renormalised probability, an error
label where the scores cannot be trusted); the tiny real model shows the engine (one pass over
the prompt, the previous prompt's cache continued, the same numbers as a plain forward pass) and
the judge end to end inside a run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pytest
from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, plain_logprob, undecided_script

from userturn.backends.fake import ScriptedBackend, fake_template
from userturn.config import load_experiment
from userturn.errors import ConfigError
from userturn.labels.judges import judge_from_spec
from userturn.labels.local_judge import (
    ANSWER_PREFIX,
    OPTIONS,
    JudgeCalibration,
    LabelProbabilityJudge,
    label_prompt,
)
from userturn.labels.plan import JudgeSpec
from userturn.labels.stages import judge_with_all
from userturn.probe.pipeline import run_experiment
from userturn.records import LABELS, Case
from userturn.store.database import RunStore
from userturn.store.turns import read_turns

FIXTURES = Path(__file__).parent / "fixtures"
CASE = Case("Tom has 3 boxes of 12 pencils and gives away 10. How many are left?",
            "3 x 12 = 36; 36 - 10 = 26. Tom has 26 pencils left.",
            "Why did you multiply 3 by 12 first?")


class ScriptedScores:
    """A local model whose label scores are scripted: ``scores(prompt) -> seven log-probs``."""

    def __init__(self, scores, spec: str = "fake/scores") -> None:
        self.spec, self.template, self.scores = spec, fake_template(spec), scores
        self.revision = "scripted"
        self.prompts: list[str] = []

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        assert tuple(options) == OPTIONS
        self.prompts.append(prompt)
        return self.scores(prompt)


def logprobs(**probabilities: float) -> list[float]:
    return [math.log(probabilities.get(label, 1e-9)) for label in LABELS]


def test_the_most_likely_label_wins_with_its_probability_among_the_seven() -> None:
    judge = LabelProbabilityJudge(ScriptedScores(lambda p: logprobs(follow_up=0.6, generic=0.2)))
    label = judge.classify(CASE)
    assert label.label == "follow_up" and label.error is None
    # 0.6 of the 0.8 the labels carry: the stored probability is the share among the labels.
    assert label.probability == pytest.approx(0.75, abs=1e-6)
    assert label.source == "judge:fake/scores@rubric1-labels"
    assert "label mass 0.80" in label.rationale


def test_the_prompt_is_the_rubric_and_the_case_in_the_models_template_opened_on_label() -> None:
    backend = ScriptedScores(lambda p: logprobs(generic=0.9))
    LabelProbabilityJudge(backend).classify(CASE)
    (prompt,) = backend.prompts
    assert prompt.startswith("<|im_start|>system\nYou label one generated USER_TURN")
    assert prompt.endswith(f"<|im_start|>assistant\n{ANSWER_PREFIX}")
    assert f"<user_turn>\n{CASE.user_turn}\n</user_turn>" in prompt
    assert "Label: follow_up" in prompt  # the worked examples answer as the judge must


@pytest.mark.parametrize("scores, why", [
    (lambda p: logprobs(follow_up=0.05, generic=0.05), "carry 0.100"),  # it wants to say else
    (lambda p: logprobs()[:6], "6 label scores for 7 labels"),  # a label went missing
    (lambda p: [float("nan")] * 7, "not log-probabilities"),
    (lambda p: [0.5] * 7, "not log-probabilities"),  # a probability above one: not a log-prob
])
def test_scores_that_cannot_be_trusted_are_an_error_label_not_a_guess(scores, why) -> None:
    label = LabelProbabilityJudge(ScriptedScores(scores)).classify(CASE)
    assert label.label is None and label.probability is None
    assert label.error.startswith("invalid") and why in label.error


def test_a_failing_engine_is_an_error_label_and_the_batch_goes_on() -> None:
    def scores(prompt: str) -> list[float]:
        if "ZXQ broken turn" in prompt:
            raise RuntimeError("out of memory")
        return logprobs(new_query=0.9)

    judge = LabelProbabilityJudge(ScriptedScores(scores))
    thanks = Case(CASE.query, CASE.answer, "ZXQ broken turn")
    broken, fine = judge.classify_many([thanks, CASE])
    assert broken.label is None and broken.error == "request failed: RuntimeError: out of memory"
    assert fine.label == "new_query"


def test_thinking_only_is_empty_without_asking() -> None:
    backend = ScriptedScores(lambda p: logprobs(follow_up=1.0))
    label = LabelProbabilityJudge(backend).classify(
        Case(CASE.query, CASE.answer, "", thinking="let me think"))
    assert label.label == "empty" and backend.prompts == []


def test_long_answers_are_cut_in_the_middle_and_the_cut_is_shown() -> None:
    backend = ScriptedScores(lambda p: logprobs(generic=0.9))
    answer = "BEGIN " + "x" * 20_000 + " END"
    LabelProbabilityJudge(backend).classify(Case(CASE.query, answer, "ok"))
    (prompt,) = backend.prompts
    assert "BEGIN" in prompt and "END" in prompt and "characters cut ...]" in prompt
    assert len(prompt) < 12_000


# -- the tiny real model ------------------------------------------------------------------------

def test_tiny_model_scores_equal_a_plain_forward_pass_with_and_without_its_cache(tiny_backend):
    first = label_prompt(tiny_backend.template, CASE)
    second = label_prompt(tiny_backend.template, Case(CASE.query, CASE.answer, "Thanks!"))
    tiny_backend.context_length = 8192  # the rubric runs past its declared 2048 positions
    try:
        checked = (0, 3, 5)  # follow_up, restatement, meta: one and several tokens
        for prompt in (first, second):  # the second continues the first's rubric cache
            scores = tiny_backend.score_options(prompt, OPTIONS, whole=True)
            expected = [plain_logprob(tiny_backend, prompt, OPTIONS[i]) for i in checked]
            assert [scores[i] for i in checked] == pytest.approx(expected, abs=2e-4)
            assert len({round(s, 6) for s in scores}) == len(OPTIONS)  # the labels differ
        # By default an option is read from the first token that tells it apart: one pass.
        firsts = tiny_backend.score_options(second, OPTIONS)
        encoded = [tiny_backend.tokenizer(o, add_special_tokens=False)["input_ids"]
                   for o in OPTIONS]
        for i in checked:
            shared = sum(e[0] == encoded[i][0] for e in encoded) > 1
            target = OPTIONS[i] if shared else tiny_backend.tokenizer.decode(encoded[i][:1])
            assert firsts[i] == pytest.approx(plain_logprob(tiny_backend, second, target),
                                              abs=2e-4)
    finally:
        tiny_backend.context_length = 2048


def test_a_local_model_spec_is_a_label_probability_judge_and_too_long_is_an_error(tiny_backend):
    judge = judge_from_spec("tiny")
    assert isinstance(judge, LabelProbabilityJudge)
    assert judge.name == "judge:tiny@rubric1-labels"
    (label,) = judge.classify_many([CASE])  # the rubric does not fit 2048 positions
    assert label.label is None and "more than the model's context of 2048" in label.error
    judge.backend.context_length = 8192
    (label,) = judge.classify_many([CASE])
    # A random model's verdict: whatever it is, it is one of the labels or an error, never both.
    assert (label.label in LABELS) != (label.error is not None)
    if label.label is not None:
        assert 1 / len(LABELS) <= label.probability <= 1


def test_a_run_judged_by_label_probabilities_stores_them_where_the_rules_abstain(
        gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path, labeller="rules")
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    scores = ScriptedScores(lambda p: logprobs(new_query=0.7, meta=0.1))
    sent = judge_with_all(store, [LabelProbabilityJudge(scores)], "undecided")
    assert sent == GSM_ITEMS * GSM_SAMPLES == len(scores.prompts)
    judged = [t for t in read_turns(store) if t.label_source.startswith("judge:")]
    assert len(judged) == GSM_ITEMS * GSM_SAMPLES
    for turn in judged:
        (stored,) = [lab for lab in turn.labels if lab.source == turn.label_source]
        assert turn.label == "new_query" and stored.probability == pytest.approx(0.875)
    # Judged again: nothing is sent twice.
    assert judge_with_all(store, [LabelProbabilityJudge(scores)], "undecided") == 0


def shifted_calibration(revision: str, towards: str, by: float) -> JudgeCalibration:
    """The raw reading (identity weights) with ``towards`` raised by ``by`` in log space."""
    n = len(LABELS)
    return JudgeCalibration("judge:fake/scores@rubric1-labels", revision, "1-labels",
                            tuple(LABELS),
                            tuple(tuple(1.0 if i == j else 0.0 for j in range(n))
                                  for i in range(n)),
                            tuple(by if label == towards else 0.0 for label in LABELS))


def test_a_calibrated_judge_reads_the_calibrated_label_under_a_name_of_its_own() -> None:
    scores = ScriptedScores(lambda p: logprobs(meta=0.6, new_query=0.3))
    raw = LabelProbabilityJudge(scores)
    assert raw.classify(CASE).label == "meta"
    identity = JudgeCalibration.load(FIXTURES / "judge_calibration_identity.json")
    same = LabelProbabilityJudge(scores, calibration=identity)
    assert same.name == f"{raw.name}+cal:{identity.tag}" != raw.name
    label = same.classify(CASE)
    assert label.label == "meta" and label.source == same.name
    assert label.probability == pytest.approx(0.6 / 0.9, abs=1e-6)  # the renormalised raw one
    # A judge that under-says new_query, corrected: e^1 * 0.3 > 0.6.
    shifted = LabelProbabilityJudge(scores, calibration=shifted_calibration("scripted",
                                                                            "new_query", 1.0))
    label = shifted.classify(CASE)
    expected = 0.3 * math.e / (0.3 * math.e + 0.6 + 5 * 1e-9)
    assert label.label == "new_query" and label.probability == pytest.approx(expected, rel=1e-4)
    assert "judge said meta" in label.rationale
    # Scores that cannot be trusted stay an error label, calibrated or not.
    broken = LabelProbabilityJudge(ScriptedScores(lambda p: logprobs(meta=0.01)),
                                   calibration=identity)
    assert broken.classify(CASE).label is None and "probability" in broken.classify(CASE).error


def test_a_calibration_must_be_whole_and_fit_for_the_judge_it_calibrates(tmp_path) -> None:
    scores = ScriptedScores(lambda p: logprobs(meta=0.6))
    with pytest.raises(ConfigError, match="fit for model llamacpp:gguf-sha256:0123 and rubric "
                                          "1-labels, not scripted and 1-labels"):
        LabelProbabilityJudge(scores, calibration=shifted_calibration(
            "llamacpp:gguf-sha256:0123", "meta", 0.0))
    damaged = tmp_path / "cal.json"
    whole = '"judge": "j", "revision": "r", "rubric": "1-labels"'
    for text in ("{", '{' + whole + ', "labels": ["follow_up"], "weights": [[1]], "bias": [0]}',
                 '{' + whole + ', "labels": ["nope"], "weights": [[0,0,0,0,0,0,0]], '
                 '"bias": [0]}', '{"judge": "j", "labels": ["follow_up"], "weights": '
                 '[[0,0,0,0,0,0,0]], "bias": [0]}'):
        damaged.write_text(text)
        with pytest.raises(ConfigError, match="is not a judge calibration"):
            JudgeCalibration.load(damaged)
    with pytest.raises(ConfigError, match="writes its verdict: a calibration applies to a judge "
                                          "run here"):
        judge_from_spec("openai/gpt-5.4-mini", base_url="http://127.0.0.1:9/v1",
                        calibration=JudgeCalibration.load(FIXTURES /
                                                          "judge_calibration_identity.json"))
    with pytest.raises(ConfigError, match="judge_calibration calibrates one judge"):
        JudgeSpec(judge=["tiny", "smollm2"],
                  judge_calibration=FIXTURES / "judge_calibration_identity.json").build_judges()
    with pytest.raises(ConfigError, match=r"invalid config \(judge_calibration\): .*cal.json is "
                                          r"not a judge calibration"):
        load_experiment(None, {"judge": "tiny", "judge_calibration": str(damaged)})


def test_a_run_stopped_while_judging_keeps_its_sources_and_every_verdict(
        gsm_file, tmp_path, monkeypatch):
    """Ctrl-C on the judge's third turn: the verdicts received stay, and the run's label sources
    are recorded anyway (rules, the judge, the classifier), so the classifier's labels decide
    every turn the judge did not reach."""
    calls = []

    def scores(prompt: str) -> list[float]:
        calls.append(prompt)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return logprobs(new_query=0.9)

    judge = LabelProbabilityJudge(ScriptedScores(scores))
    monkeypatch.setattr("userturn.labels.judges.judge_from_spec", lambda spec, **_: judge)
    exp = experiment(gsm_file, tmp_path, judge="scripted")
    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    store = RunStore.open(exp.plan.output)
    assert store.meta().label_sources == ["rules", judge.name, "classifier"]
    turns = read_turns(store)
    assert sum(t.label_source == judge.name for t in turns) == 2  # received before the stop
    assert {t.label_source for t in turns} == {"rules", judge.name, "classifier"}
