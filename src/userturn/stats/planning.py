"""How many human labels a corrected rate needs, and where a budget of them goes.

The corrected rate of a condition (:mod:`.correction`, PPI++) rests on its human-labelled turns.
Its printed variance, in expectation over which turns a person labels, is

    V(n) = V_items + k/(k-1) * sum_j r_j^2 (1/pi_j - 1) / N^2,      r_j = y_j - lambda f_j

the between-item variance of the people's rate (what labelling every turn would leave) plus the
labelling noise: a turn drawn with probability ``pi`` stands for ``1/pi`` turns. The labelled
turns of a condition are taken as a random sample within each of two strata, the labeller's
predicted follow-ups and its other turns (``userturn annotate --calibration`` draws them so, half
of a condition's new labels on its predicted follow-ups, all of them when fewer, and labels
given before count in: :mod:`userturn.labels.calibration`), so ``pi = u_h / N_h`` with ``u_h``
the stratum's labelled turns. With ``q1`` = P(a person says follow-up | the labeller does) and
``q0`` = P(a person says follow-up | the labeller does not),

    E r^2 = q1 (1 - lambda)^2 + (1 - q1) lambda^2   on predicted follow-ups: q1 (1 - q1) at best
    E r^2 = q0                                       on the other turns

(power tuning picks the best ``lambda``, which is ``q1``), and ``V_items = p (1 - p) deff / N`` at
the people's expected rate ``p`` with the design effect ``deff`` of the labeller's verdicts
between items. The half-width is that of the interval the correction prints: Wilson's at
``n_eff = p (1 - p) / V``, with t on ``k - 1`` degrees of freedom. tests/test_sample_plan.py
checks it against the mean half-width of simulated calibration samples.

- :func:`plan`: the fewest labels that give one condition a target half-width; a condition with
  fewer turns than :data:`~.correction.MIN_HUMAN_LABELS` can have no corrected rate, and one that
  cannot reach the target even with every turn labelled is planned at all of them.
- :func:`allocate`: a budget of new labels shared between conditions so the widest expected
  interval is as narrow as it can be (each funded condition first brought to the minimum, then
  one label at a time to the widest: for widths that shrink with each label this greedy
  water-filling is optimal).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Literal, Sequence

import numpy as np

from userturn.records import Condition, Turn, human_label, is_human
from userturn.stats.correction import MIN_HUMAN_LABELS
from userturn.stats.intervals import wilson

# ((people follow_up & labeller follow_up, people follow_up & labeller not),
#  (people not & labeller follow_up, people not & labeller not)): the judge check's layout.
Confusion = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class LabellerError:
    """How a labeller's follow-up verdicts stood against people's where it was measured."""

    confusion: Confusion
    source: str  # where it was measured, for the plan's note
    checked: bool = True  # False: not measured for this labeller; another's error stands in
    # How far the rate people give can be from what the table predicts in one condition (a
    # fraction): the labeller's errors vary between conditions of a model it never saw.
    gap: float = 0.0

    def human_rates(self, predicted: float) -> tuple[float, float]:
        """``(q1, q0)`` in a condition where the labeller calls ``predicted`` of the turns
        follow-ups. Two readings of the table: its predictive values as measured (they hold
        where the condition's rate is like the table's), and its sensitivity and specificity
        carried to this rate (Rogan-Gladen; they hold where the errors do not depend on the
        rate). On a model the labeller never saw either can be the truer, so each stratum takes
        the one that asks for more labels (the larger ``q (1 - q)`` on predicted follow-ups, the
        larger ``q0`` on the rest). Then the rate people give is taken ``gap`` nearer 50% than
        that (more spread, more labels), the difference as follow-ups the labeller missed.
        Half a count is added to every cell, so a small table with an empty cell still plans
        some noise there."""
        (a, b), (c, d) = ((x + 0.5 for x in row) for row in self.confusion)
        by_value = (a / (a + c), b / (b + d))
        sensitivity, specificity = a / (a + b), d / (c + d)
        youden = sensitivity + specificity - 1
        human = (min(1.0, max(0.0, (predicted + specificity - 1) / youden)) if youden > 0
                 else by_value[0] * predicted + by_value[1] * (1 - predicted))
        by_error = (min(1.0, sensitivity * human / predicted) if predicted > 0 else by_value[0],
                    min(1.0, (1 - sensitivity) * human / (1 - predicted)) if predicted < 1
                    else by_value[1])
        q1 = max(by_value[0], by_error[0], key=lambda q: q * (1 - q))
        q0 = max(by_value[1], by_error[1])
        rate = predicted * q1 + (1 - predicted) * q0
        if rate < 0.5 and predicted < 1:
            q0 = min(1.0, q0 + (min(0.5, rate + self.gap) - rate) / (1 - predicted))
        return q1, q0


@dataclass(frozen=True)
class Design:
    """One condition as the plan sees it."""

    turns: int  # N: the turns of its rate
    items: int  # k
    predicted: int  # the turns the labeller calls follow-ups
    q1: float  # P(a person says follow-up | the labeller does)
    q0: float  # P(a person says follow-up | the labeller does not)
    design_effect: float = 1.0  # of the rate between items: 1 for independent turns
    given: int = 0  # turns a person labelled already: part of the sample, they count
    given_predicted: int = 0  # of those, the labeller's predicted follow-ups
    read_by_people: bool = False  # the rate is read with human labels: nothing to correct

    @property
    def rate(self) -> float:
        """The rate people are expected to give (what the corrected rate estimates)."""
        if not self.turns:
            return float("nan")
        return (self.predicted * self.q1 + (self.turns - self.predicted) * self.q0) / self.turns

    def remainder(self) -> tuple[int, int]:
        """The unlabelled turns of each stratum: predicted follow-ups, the rest."""
        return (self.predicted - self.given_predicted,
                self.turns - self.predicted - (self.given - self.given_predicted))

    def correctable(self, minimum: int = MIN_HUMAN_LABELS) -> bool:
        return self.turns >= minimum and not self.read_by_people


def split(remainder: tuple[int, int], new: int) -> tuple[int, int]:
    """New labels per stratum: half on predicted follow-ups (all of them when fewer), the rest on
    the other turns (so two or more new labels reach both strata where both have turns)."""
    have_f, have_o = remainder
    new = min(new, have_f + have_o)
    take_f = min(have_f, (new + 1) // 2)
    take_o = min(have_o, new - take_f)
    return min(have_f, new - take_o), take_o


def expected_variance(design: Design, labels: int) -> float:
    """The corrected rate's expected printed variance with ``labels`` human labels in all
    (those given included)."""
    n = design.turns
    if labels < design.given or not n:
        raise ValueError(f"{labels} labels: fewer than the {design.given} already given")
    drawn = split(design.remainder(), labels - design.given)
    sizes = (design.predicted, n - design.predicted)
    labelled = (design.given_predicted + drawn[0], design.given - design.given_predicted + drawn[1])
    spread = (design.q1 * (1 - design.q1), design.q0)
    noise = 0.0
    for size, u, s in zip(sizes, labelled, spread):
        if size and s > 0:  # a stratum no person labelled is missing from the estimate
            noise += math.inf if not u else size * (size / u - 1) * s
    k = design.items
    p = design.rate
    between = p * (1 - p) * design.design_effect / n
    return between + (k / (k - 1) if k > 1 else 1.0) * noise / n ** 2


def half_width(design: Design, labels: int, level: float = 0.95) -> float:
    """The expected half-width of the corrected interval with ``labels`` human labels in all."""
    variance = expected_variance(design, labels)
    if not math.isfinite(variance):
        return math.inf
    p = design.rate
    # As the correction prints it: with no spread (or a rate of 0 or 1) n_eff is the label count.
    n_eff = (float(labels) if variance <= 0 or p <= 0 or p >= 1
             else min(max(p * (1 - p) / variance, 1.0), float(design.turns)))
    low, high = wilson(np.array(p), np.array(n_eff), level, df=np.array(design.items - 1.0))
    return float(high - low) / 2


Status = Literal["ok", "unreachable", "too_few_turns", "read_by_people"]


@dataclass(frozen=True)
class Planned:
    """The plan of one condition: ``labels`` human labels in all (``more`` of them new), with
    the expected ``half_width``. ``unreachable``: even every turn labelled leaves the interval
    wider than asked (planned at every turn); ``too_few_turns``: fewer turns than a corrected
    rate needs labels, so none can be promised; ``read_by_people``: nothing to correct."""

    labels: int
    more: int
    half_width: float
    status: Status


def plan(design: Design, target: float, level: float = 0.95,
         minimum: int = MIN_HUMAN_LABELS) -> Planned:
    """The fewest human labels that give ``design``'s corrected interval a half-width of at most
    ``target`` (the labels already given count toward it)."""
    if not 0 < target < 1:
        raise ValueError(f"the half-width must be between 0 and 1, got {target}")
    if design.read_by_people:
        return Planned(design.given, 0, math.nan, "read_by_people")
    if design.turns < minimum:
        return Planned(design.given, 0, math.nan, "too_few_turns")
    low, high = max(minimum, design.given), design.turns
    if half_width(design, high, level) > target:
        return Planned(high, high - design.given, half_width(design, high, level), "unreachable")
    while low < high:  # the width shrinks with every label: bisect for the first that is enough
        middle = (low + high) // 2
        if half_width(design, middle, level) <= target:
            high = middle
        else:
            low = middle + 1
    return Planned(low, low - design.given, half_width(design, low, level), "ok")


def allocate(designs: Sequence[Design], budget: int, level: float = 0.95,
             minimum: int = MIN_HUMAN_LABELS) -> list[int]:
    """New labels per condition, ``budget`` in all at most, so the widest expected interval is
    as narrow as it can be. Conditions that can be corrected are first brought to ``minimum``
    labels in their order while the budget lasts (a condition below it has no interval at all);
    then each label goes to the widest; what is left when the funded conditions are fully
    labelled goes toward the minimum of the next unfunded one, so a later sample can finish it.
    Conditions with fewer turns than ``minimum`` get none: no corrected rate can come of them."""
    new = [0] * len(designs)
    left = budget
    funded, waiting = [], []
    for i, design in enumerate(designs):
        if not design.correctable(minimum):
            continue
        need = max(0, minimum - design.given)
        if need <= left:
            new[i], left = need, left - need
            funded.append(i)
        else:
            waiting.append(i)
    heap = [(-half_width(designs[i], designs[i].given + new[i], level), i) for i in funded
            if new[i] < sum(designs[i].remainder())]
    heapq.heapify(heap)
    while left and heap:
        _, i = heapq.heappop(heap)
        new[i], left = new[i] + 1, left - 1
        if new[i] < sum(designs[i].remainder()):
            heapq.heappush(heap, (-half_width(designs[i], designs[i].given + new[i], level), i))
    for i in waiting:
        take = min(left, sum(designs[i].remainder()))
        new[i], left = take, left - take
    return new


# -- from a run's turns --------------------------------------------------------------------------
ErrorOf = Callable[[str | None], LabellerError]
"""The measured error of the label source that decided a turn (None: no source decided)."""


@dataclass(frozen=True)
class PlanRow:
    condition: Condition
    design: Design
    planned: Planned
    errors: tuple[LabellerError, ...]  # the error tables the plan rests on


def design_of(turns: Sequence[Turn], error_of: ErrorOf) -> tuple[Design, tuple[LabellerError, ...]]:
    """One condition's design from its turns: the labeller's verdicts, which source decided each
    (its measured error gives ``q1`` and ``q0``, at the predicted rate of the turns it decided),
    the human labels already given, the spread of the verdicts between items."""
    counted = [t for t in turns if t.counts_toward_rate]
    groups: dict[LabellerError, list[Turn]] = defaultdict(list)
    for turn in counted:
        groups[error_of(turn.label_source)].append(turn)
    weighted = [0.0, 0.0]
    for error, group in groups.items():
        hits = sum(t.follow_up for t in group)
        q1, q0 = error.human_rates(hits / len(group))
        weighted[0] += q1 * hits
        weighted[1] += q0 * (len(group) - hits)
    predicted = sum(t.follow_up for t in counted)
    given = [t for t in counted if human_label(t)[0] is not None]
    design = Design(
        turns=len(counted), items=len({t.item_id for t in counted}), predicted=predicted,
        q1=weighted[0] / predicted if predicted else 0.0,
        q0=weighted[1] / (len(counted) - predicted) if len(counted) > predicted else 0.0,
        design_effect=design_effect([(t.item_id, t.follow_up) for t in counted]),
        given=len(given), given_predicted=sum(t.follow_up for t in given),
        read_by_people=any(is_human(t.label_source) for t in counted))
    return design, tuple(groups)


def design_effect(pairs: Sequence[tuple[Hashable, bool]]) -> float:
    """The design effect of a rate of ``(item, hit)`` turns: the ratio-estimator variance over
    the binomial one, between 1 and the most turns of an item. With no hit or only hits it
    cannot be estimated and is the mean turns per item (the cautious end)."""
    hits: Counter[Hashable] = Counter()
    sizes: Counter[Hashable] = Counter()
    for item, hit in pairs:
        sizes[item] += 1
        hits[item] += hit
    n, k = sum(sizes.values()), len(sizes)
    if not n:
        return 1.0
    p = sum(hits.values()) / n
    if p <= 0 or p >= 1 or k < 2:
        return n / k
    residual = sum((hits[i] - p * sizes[i]) ** 2 for i in sizes)
    variance = k / (k - 1) * residual / n ** 2
    return min(max(variance * n / (p * (1 - p)), 1.0), float(max(sizes.values())))


def condition_order(condition: Condition) -> tuple[object, ...]:
    """The summary's row order: by the probed model's printed name, the opened arm before the
    continuation arm, each condition's original context before its perturbations."""
    c = condition
    return (c.probed, c.arm != "opened", c.arm, c.answerer, c.dataset,
            c.perturbation != "none", c)


def plan_run(turns: Sequence[Turn], error_of: ErrorOf, target: float, level: float = 0.95,
             minimum: int = MIN_HUMAN_LABELS) -> list[PlanRow]:
    """The plan of every condition of a run, in the summary's order."""
    by_condition: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        by_condition[Condition.of(turn)].append(turn)
    rows = []
    for condition in sorted(by_condition, key=condition_order):
        design, errors = design_of(by_condition[condition], error_of)
        if design.turns:
            rows.append(PlanRow(condition, design, plan(design, target, level, minimum), errors))
    return rows
