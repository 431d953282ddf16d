"""The numbers of a run's headline table: per condition, the genuine follow-up rate with a 95%
interval clustered by item, the label distribution, n, errors, task accuracy, the rate corrected
with human labels, and the generated turns' overlap with the data's real next turn.
:mod:`userturn.report.summary` prints them."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from userturn.records import (
    DEFAULT_ARM,
    DEFAULT_THINKING,
    HUMAN,
    NATIVE,
    Answer,
    Condition,
    Turn,
    human_label,
    is_human,
    probed_name,
)
from userturn.stats.correction import MIN_HUMAN_LABELS, Corrected, Observation, corrected_rate
from userturn.stats.planning import condition_order
from userturn.stats.rates import Rate, clustered_rate


@dataclass(frozen=True)
class SummaryRow:
    model: str
    dataset: str
    temperature: float
    items: int
    turns: int
    follow_up: Rate  # over labelled and undecided turns; failed generations are beside it
    labels: dict[str, int] = field(default_factory=dict)
    undecided: int = 0  # no labeller decided (the rules leave hard cases to a judge)
    # Turns where a label source's verdict failed (a judge request that failed, a reply outside
    # the label set): each kept the next source's label, so the rate did not move.
    label_errors: int = 0
    errors: int = 0  # the generation itself failed
    accuracy: Rate | None = None
    answerer: str = "self"
    perturbation: str = "none"
    # Mean word-overlap F1 between the generated turns and the data's real next user turn, where
    # the data has one (None otherwise).
    similarity: float | None = None
    # The follow-up rate corrected for the labeller's errors with the human labels among the
    # row's turns (PPI++, userturn.stats.correction); None with the reason in ``correction_note``
    # when there are too few, and both None when no person labelled a turn of the row.
    corrected: Corrected | None = None
    correction_note: str | None = None
    human_labels: int = 0
    # The same rate from the human labels alone (PPI with the labeller's weight 0), shown beside
    # the corrected one: what the labeller's verdicts add is the difference in width.
    human_only: Corrected | None = None
    # Every counted turn was labelled by the rules or the classifier alone, and no person labelled
    # any: the rate carries the offline labeller's error on an unseen model (labels.offline_error).
    offline_only: bool = False
    # The counted turns each label source decided (a rate rests on these sources, in these
    # shares); turns no source decided are not in it.
    deciding: dict[str, int] = field(default_factory=dict)
    # The rate is read with human labels (--labels human:NAME): there is nothing to correct.
    read_by_people: bool = False
    arm: str = DEFAULT_ARM
    # Continuations that opened no user turn (another role spoke, or nobody): in the rate's
    # denominator as no follow-up (the unforced rate), with no label.
    no_user_turn: int = 0
    user_variant: str = NATIVE
    enable_thinking: str = DEFAULT_THINKING

    @property
    def probed(self) -> str:
        """The probed model's name as the tables print it (records.probed_name)."""
        return probed_name(self.model, self.user_variant, self.enable_thinking)

    @property
    def labels_to_correct(self) -> int | None:
        """How many more human labels the row needs before its rate is corrected: 0 where it is,
        None where it cannot be (fewer turns than a corrected rate needs labels, or the rate is
        read with human labels). Per row: labels elsewhere in the run do not count."""
        if self.corrected is not None:
            return 0
        if self.read_by_people or self.follow_up.n < MIN_HUMAN_LABELS:
            return None
        return max(0, MIN_HUMAN_LABELS - self.human_labels)

    def status_counts(self) -> dict[str, int]:
        """Turns per label and per status of the turns without one (undecided, failed): every
        turn of the row is counted once."""
        return {**self.labels, "undecided": self.undecided, "failed": self.errors,
                **({"no user turn": self.no_user_turn} if self.arm != DEFAULT_ARM else {})}


def summarize(turns: Sequence[Turn], answers: Sequence[Answer],
              inclusion: Mapping[str, float] | None = None, *,
              offline: Collection[str]) -> list[SummaryRow]:
    """One row per condition, from a run's turns (read with the label sources that should
    decide) and its answers (task accuracy).
    ``inclusion``: each human-labelled turn's inclusion probability in its calibration sample
    (:func:`~userturn.labels.calibration.inclusion_probabilities`); a turn missing from it counts
    as drawn by simple random sampling from the run's turns. ``offline``: the label sources that
    read turns offline (``labels.sources.is_offline``): a row whose every counted turn they alone
    labelled is marked :attr:`SummaryRow.offline_only`."""
    accuracy = _accuracy(answers)
    probability = _inclusion(turns, inclusion or {})
    groups: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        groups[Condition.of(turn)].append(turn)
    rows = []
    # In condition order, each condition's original context before its perturbations.
    for c, group in sorted(groups.items(), key=lambda kv: condition_order(kv[0])):
        status = Counter(t.status for t in group)
        rows.append(SummaryRow(
            model=c.model, dataset=c.dataset, temperature=c.temperature,
            items=len({t.item_id for t in group}), turns=len(group),
            follow_up=clustered_rate((t.item_id, t.follow_up) for t in group
                                     if t.counts_toward_rate),
            labels=dict(Counter(t.label for t in group if t.error is None and t.label)),
            undecided=status["undecided"], errors=status["failed"],
            label_errors=sum(1 for t in group if t.error is None and t.label_error),
            accuracy=_accuracy_of(accuracy, c),
            answerer=c.answerer, perturbation=c.perturbation,
            similarity=_similarity(group) if c.model != HUMAN else None,
            offline_only=_offline_only(group, offline),
            deciding=dict(Counter(t.label_source for t in group
                                  if t.counts_toward_rate and t.label_source)),
            arm=c.arm, no_user_turn=status["no user turn"], user_variant=c.user_variant,
            enable_thinking=c.enable_thinking,
            **_correction(group, probability),
        ))
    return rows


def _offline_only(group: Sequence[Turn], offline: Collection[str]) -> bool:
    counted = [t for t in group if t.counts_toward_rate]
    return bool(counted) and all((t.label_source is None or t.label_source in offline)
                                 and human_label(t)[0] is None for t in counted)


def _inclusion(turns: Sequence[Turn], given: Mapping[str, float]) -> dict[str, float]:
    eligible = [t for t in turns if t.counts_toward_rate]
    labelled = [t.key for t in eligible if human_label(t)[0] is not None]
    fallback = len(labelled) / len(eligible) if eligible else 1.0
    return {key: given.get(key, fallback) for key in labelled}


def _correction(group: Sequence[Turn], inclusion: Mapping[str, float]) -> dict[str, Any]:
    """The corrected rate of a row's turns, or why there is none."""
    counted = [t for t in group if t.counts_toward_rate]
    humans = sum(1 for t in counted if human_label(t)[0] is not None)
    if not humans:
        return {}
    if any(is_human(t.label_source) for t in counted):
        return {"human_labels": humans, "read_by_people": True,
                "correction_note": "the rate is read with human labels, nothing to correct"}
    observations = [Observation(t.item_id, t.follow_up, human_label(t)[0],
                                inclusion.get(t.key, 1.0)) for t in counted]
    result = corrected_rate(observations)
    if isinstance(result, str):
        return {"human_labels": humans, "correction_note": result}
    alone = corrected_rate(observations, lam=0.0)
    return {"human_labels": humans, "corrected": result,
            "human_only": alone if isinstance(alone, Corrected) else None}


def _similarity(turns: Sequence[Turn]) -> float | None:
    scores = [word_f1(t.user_turn, t.next_user_turn) for t in turns
              if t.error is None and t.next_user_turn]
    return sum(scores) / len(scores) if scores else None


def word_f1(generated: str, reference: str) -> float:
    """Bag-of-words F1 (as in SQuAD): how much of the real turn's wording the model's turn has."""
    a, b = Counter(generated.lower().split()), Counter(reference.lower().split())
    common = sum((a & b).values())
    if not common:
        return 0.0
    precision, recall = common / sum(a.values()), common / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def _accuracy(answers: Sequence[Answer]) -> dict[tuple[str, str, str], Rate]:
    scored: dict[tuple[str, str, str], list[tuple[str, bool]]] = defaultdict(list)
    for answer in answers:
        if answer.correct is not None:
            scored[(answer.model, answer.enable_thinking, answer.dataset)].append(
                (answer.item_id, answer.correct))
    return {key: clustered_rate(pairs) for key, pairs in scored.items()}


def _accuracy_of(accuracy: Mapping[tuple[str, str, str], Rate], c: Condition) -> Rate | None:
    """The task accuracy of the answers a condition's turns follow: its own model's (under its
    thinking) or its answerer's. A user-turn variant's row leaves it to native's row, whose
    answers it shares: the accuracy is shown once, as when the variant was a model of its own."""
    if c.answerer != "self":
        return accuracy.get((c.answerer, DEFAULT_THINKING, c.dataset))
    if c.user_variant != NATIVE:
        return None
    return accuracy.get((c.model, c.enable_thinking, c.dataset))


def assistant_errors(answers: Sequence[Answer]) -> int:
    return sum(1 for answer in answers if answer.error is not None)
