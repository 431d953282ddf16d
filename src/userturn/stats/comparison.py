"""Two runs' turns compared on the items they share, B minus A: the follow-up rate per condition
and the task accuracy per dataset, paired over items, with the difference corrected with human
labels where the runs have them. :mod:`userturn.report.compare` reads the runs and prints this.

Units (a :class:`~userturn.records.Condition` whose model is the pairing, ``A → B``, or the one
name both runs share) are matched by dataset, answerer, perturbation and temperature; within a
unit, items are matched by id. A run with one model is compared with the other run's one model
whatever their names (the usual base-vs-checkpoint case); with several models, models pair by
name. Differences are B minus A, with paired score intervals over shared items (clustered by
item), and an exact McNemar test where each item has a single greedy sample. Where the runs hold
human labels, the difference corrected for the labeller's errors is given beside it
(:mod:`userturn.stats.correction`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Hashable, Iterable, Mapping, Sequence

from userturn.errors import StoreError
from userturn.records import (
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
from userturn.stats.correction import CorrectedDifference, Observation, corrected_difference
from userturn.stats.rates import (
    Difference,
    McNemar,
    mcnemar_exact,
    paired_difference,
    single_sample_mcnemar,
)


@dataclass(frozen=True)
class Comparison:
    model_a: str
    model_b: str
    dataset: str
    answerer: str
    perturbation: str
    temperature: float
    follow_up: Difference
    mcnemar: McNemar | None  # greedy, one sample per item on both sides
    # Corrected for the labeller's errors with each run's human labels (None: no human labels
    # on either side; a string: why it is not shown).
    corrected: CorrectedDifference | str | None = None
    arm: str = "opened"  # the probe arm both sides' turns were asked for with


@dataclass(frozen=True)
class AccuracyComparison:
    model_a: str
    model_b: str
    dataset: str
    accuracy: Difference
    mcnemar: McNemar


def compare_turns(turns_a: Sequence[Turn], answers_a: Sequence[Answer],
                  turns_b: Sequence[Turn], answers_b: Sequence[Answer],
                  inclusion: tuple[Mapping[str, float], Mapping[str, float]] = ({}, {}),
                  ) -> tuple[list[Comparison], list[AccuracyComparison]]:
    """B minus A on shared items, from each run's turns and answers (``inclusion``: each run's
    human-labelled turns' inclusion probabilities, by key, for the corrected difference)."""
    _check_same_items(turns_a, turns_b)
    pairs = _model_pairs(_models(turns_a), _models(turns_b))
    by_unit_a, by_unit_b = _by_unit(turns_a, pairs, 0), _by_unit(turns_b, pairs, 1)
    shared = sorted(set(by_unit_a) & set(by_unit_b))
    if not shared:
        raise StoreError("the two runs share no model pairing, dataset, perturbation and "
                         "temperature: nothing to compare")
    comparisons = [_compare_unit(unit, by_unit_a[unit], by_unit_b[unit], inclusion)
                   for unit in shared]
    return comparisons, _compare_accuracy(answers_a, answers_b, pairs)


def _models(turns: Iterable[Turn]) -> list[str]:
    """The probed models by the names the tables print (a variant is a model of its own here,
    paired with the same variant of the other run); the data's own human turns are the same in
    both runs."""
    return sorted({t.probed for t in turns} - {HUMAN})


def _model_pairs(models_a: Sequence[str], models_b: Sequence[str]) -> list[tuple[str, str]]:
    if len(models_a) == 1 and len(models_b) == 1:
        return [(models_a[0], models_b[0])]
    pairs = [(m, m) for m in models_a if m in models_b]
    if not pairs:
        raise StoreError(f"the runs' models do not pair: {list(models_a)} vs {list(models_b)} "
                         "(runs with one model each pair whatever the names)")
    return pairs


def _by_unit(turns: Iterable[Turn], pairs: Sequence[tuple[str, str]],
             side: int) -> dict[Condition, list[Turn]]:
    names = {pair[side]: f"{pair[0]} → {pair[1]}" if pair[0] != pair[1] else pair[0]
             for pair in pairs}
    units: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        if turn.probed in names and turn.counts_toward_rate:
            # The unit's model is the pairing of printed names, which hold the variants.
            units[replace(Condition.of(turn), model=names[turn.probed], user_variant=NATIVE,
                          enable_thinking=DEFAULT_THINKING)].append(turn)
    return units


def _compare_unit(unit: Condition, a: list[Turn], b: list[Turn],
                  inclusion: tuple[Mapping[str, float], Mapping[str, float]]) -> Comparison:
    model_a, _, model_b = unit.model.partition(" → ")
    hits_a = [(t.item_id, t.follow_up) for t in a]
    hits_b = [(t.item_id, t.follow_up) for t in b]
    return Comparison(model_a, model_b or model_a, unit.dataset, unit.answerer,
                      unit.perturbation, unit.temperature,
                      paired_difference(hits_a, hits_b),
                      single_sample_mcnemar(hits_a, hits_b), _corrected(a, b, inclusion),
                      arm=unit.arm)


def _corrected(a: list[Turn], b: list[Turn], inclusion: tuple[Mapping[str, float], ...]
               ) -> CorrectedDifference | str | None:
    sides = []
    for turns, probability in zip((a, b), inclusion):
        labelled = [t for t in turns if human_label(t)[0] is not None]
        if any(is_human(t.label_source) for t in turns):
            return "read with human labels, nothing to correct"
        fallback = len(labelled) / len(turns) if turns else 1.0
        sides.append([Observation(t.item_id, t.follow_up, human_label(t)[0],
                                  probability.get(t.key, fallback)) for t in turns])
    if not any(o.human is not None for side in sides for o in side):
        return None
    return corrected_difference(*sides)


def _compare_accuracy(a: Sequence[Answer], b: Sequence[Answer],
                      pairs: Sequence[tuple[str, str]]) -> list[AccuracyComparison]:
    out = []
    for model_a, model_b in pairs:
        scored_a, scored_b = _scores(a, model_a), _scores(b, model_b)
        for dataset in sorted(set(scored_a) & set(scored_b)):
            hits_a, hits_b = scored_a[dataset], scored_b[dataset]
            out.append(AccuracyComparison(
                model_a, model_b, dataset,
                paired_difference(hits_a.items(), hits_b.items()),
                mcnemar_exact(hits_a, hits_b)))
    return out


def _scores(answers: Sequence[Answer], model: str) -> dict[str, dict[Hashable, bool]]:
    scores: dict[str, dict[Hashable, bool]] = defaultdict(dict)
    for answer in answers:
        if probed_name(answer.model, NATIVE, answer.enable_thinking) == model \
                and answer.correct is not None:
            scores[answer.dataset][answer.item_id] = answer.correct
    return scores


def _check_same_items(a: Sequence[Turn], b: Sequence[Turn]) -> None:
    """Items shared by id must be the same items: a paired difference on different questions
    that happen to share ids would be meaningless."""
    conversations = {(t.dataset, t.item_id): t.messages for t in a}
    for turn in b:
        seen = conversations.get((turn.dataset, turn.item_id))
        if seen is not None and tuple(seen) != tuple(turn.messages):
            raise StoreError(f"the runs disagree on item {turn.item_id} of {turn.dataset}: same "
                             "id, different conversation; they cannot be compared item by item")
