"""Our labels as an Inspect scorer: ``user_turn_label()`` labels the last user message of a
sample (a simulated user's turn) after the assistant message before it, and its metric is the
follow-up rate. Public as ``userturn.inspect`` (docs/integrations.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

from inspect_ai.scorer import (
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    metric,
    scorer,
)
from inspect_ai.solver import TaskState

from userturn.labels.sources import DEFAULT_LABELLER
from userturn.records import Case, Labeller, is_follow_up

UNDECIDED, INVALID = "undecided", "invalid"


# Each epoch's turn is an observation of its own (a user turn sampled again): the metric takes
# the scores unreduced, so Inspect never averages a label (a string) into a number.
@metric(scores="unreduced")
def follow_up_rate() -> Metric:
    """The share of labels that count as a follow-up (``follow_up``) among the labelled and
    undecided turns (an invalid verdict is out of the denominator, as in ``userturn report``),
    each epoch's turn counted."""
    def rate(scores: list[SampleScore]) -> float:
        labels = [_label_of(s.score) for s in scores]
        counted = [label for label in labels if label != INVALID]
        return sum(is_follow_up(label) for label in counted) / len(counted) if counted else 0.0
    return rate


def _label_of(score: Score) -> str:
    """The label a score carries. Inspect reduces the epochs of a sample (its mean, by default)
    before the metric sees them, which turns a string value into a number: the label is also in
    the metadata, which the reduction keeps."""
    return str((score.metadata or {}).get("label", score.value))


@scorer(metrics=[follow_up_rate()])
def user_turn_label(labeller: Labeller = DEFAULT_LABELLER, judge: str | None = None,
                    judge_base_url: str | None = None,
                    classifier: str | Path | None = None) -> Scorer:
    """Label the last user message of each sample with userturn's labeller.

    ``labeller``: ``cascade`` (the rules, then the offline classifier: the default),
    ``rules`` (undecided where they do not decide) or ``classifier``. ``judge``: a judge spec
    (``openai/MODEL`` or a local model, as ``userturn judge --judge``) that labels what the rules
    leave undecided, in place of the classifier. The score's value is the label
    (``undecided`` / ``invalid`` where there is none), its explanation the rationale and its
    metadata the source and, for the classifier, the probability. ``classifier``: its
    parameters, as ``userturn classify --classifier`` takes them (a file, or ``form`` for the
    shipped form-only set); default the shipped context classifier."""
    label = _labeller(labeller, judge, judge_base_url, classifier)

    async def score(state: TaskState, target: Target) -> Score:
        case = last_user_turn([(m.role, m.text) for m in state.messages])
        if isinstance(case, str):
            return Score(value=INVALID, explanation=case, metadata={"label": INVALID})
        found = await asyncio.to_thread(label, case)
        value = found.label or (INVALID if found.error else UNDECIDED)
        return Score(value=value, answer=case.user_turn,
                     explanation=found.rationale or found.error or None,
                     metadata={"label": value, "source": found.source,
                               "probability": found.probability})

    return score


def last_user_turn(messages: Sequence[tuple[str, str]]) -> Case | str:
    """The case of the last user message: the assistant message before it is the answer and
    the user message before that the query. A string says why there is none."""
    roles = [role for role, _ in messages]
    if "user" not in roles:
        return "no user message to label"
    last = len(roles) - 1 - roles[::-1].index("user")
    answers = [i for i in range(last) if roles[i] == "assistant"]
    if not answers:
        return "no assistant message before the last user message"
    queries = [i for i in range(answers[-1]) if roles[i] == "user"]
    query = messages[queries[-1]][1] if queries else ""
    text = messages[last][1]
    return Case(query, messages[answers[-1]][1], text.strip(), text)


def _labeller(labeller: Labeller, judge: str | None, base_url: str | None,
              classifier: str | Path | None) -> Any:
    """case -> Label: the rules first where they take part; then the judge, or the classifier."""
    from userturn.labels.cascade import Cascade, Step
    from userturn.labels.classifier import parameters_file
    from userturn.labels.rules import RulesClassifier
    from userturn.labels.sources import labeller_named

    offline = labeller_named(labeller)
    if not judge:  # the run's offline labeller, as a run would label the case
        return offline.case_labeller(parameters_file(classifier) if classifier else None).classify
    from userturn.labels.judges import judge_from_spec

    # The judge is asked what the rules leave undecided: the cascade, with the judge last.
    return Cascade([Step(RulesClassifier(), "all"),
                    Step(judge_from_spec(judge, base_url=base_url), "undecided")]).classify
