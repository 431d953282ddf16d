"""What the report pairs and crosses within a run: each perturbation against the original
context, task accuracy against the follow-up rate across models, and the follow-up rate after a
right answer against after a wrong one. Conditions are :class:`~userturn.records.Condition`
values; :mod:`userturn.report` draws and tabulates these.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping, NamedTuple, Sequence

from userturn.records import DEFAULT_THINKING, NATIVE, Condition, Turn, probed_name
from userturn.stats.rates import (
    Correlation,
    Difference,
    McNemar,
    Rate,
    RightWrong,
    direction,
    joint_table,
    paired_difference,
    rank_correlation,
    single_sample_mcnemar,
)
from userturn.stats.summary import SummaryRow


@dataclass(frozen=True)
class PerturbationEffect:
    """Perturbed vs original context of one model, answerer, dataset and temperature."""

    model: str
    answerer: str
    dataset: str
    perturbation: str
    temperature: float
    diff: Difference
    expected: str  # "up" or "down", from probe.perturb.EXPECTED
    mcnemar: McNemar | None  # greedy: one outcome per item on each side
    user_variant: str = NATIVE
    enable_thinking: str = DEFAULT_THINKING

    @property
    def probed(self) -> str:
        """The probed model's name as the tables print it (records.probed_name)."""
        return probed_name(self.model, self.user_variant, self.enable_thinking)

    @property
    def verdict(self) -> str:
        return direction(self.diff, self.expected)


class PanelPoint(NamedTuple):
    """One model of a panel: the accuracy of its answers and the follow-up rate after them."""

    model: str  # the probed model's name as the tables print it (records.probed_name)
    accuracy: Rate
    follow_up: Rate


@dataclass(frozen=True)
class Panel:
    """Task accuracy vs follow-up rate across models, at one dataset and temperature."""

    dataset: str
    temperature: float
    points: list[PanelPoint]
    correlation: Correlation


class Joint(NamedTuple):
    """An unperturbed condition and its follow-up rates after right and after wrong answers."""

    condition: Condition
    table: RightWrong


def perturbation_effects(turns: Sequence[Turn],
                         expected: Mapping[str, str]) -> list[PerturbationEffect]:
    """Each perturbed condition against its own original context (perturbation ``none``),
    paired over items. ``expected``: the direction each perturbation kind should move the rate
    (``probe.perturb.EXPECTED``; ``up`` where a kind is not in it)."""
    groups: dict[Condition, list[tuple[str, bool]]] = defaultdict(list)
    for t in turns:
        if t.counts_toward_rate:
            groups[Condition.of(t)].append((t.item_id, t.follow_up))
    out = []
    for c, after in groups.items():
        before = groups.get(replace(c, perturbation="none"))
        if c.perturbation == "none" or before is None:
            continue
        out.append(PerturbationEffect(c.model, c.answerer, c.dataset, c.perturbation,
                                      c.temperature, paired_difference(before, after),
                                      expected.get(c.perturbation.split(":")[0], "up"),
                                      single_sample_mcnemar(before, after),
                                      c.user_variant, c.enable_thinking))
    return sorted(out, key=lambda c: (c.probed, c.answerer, c.dataset, c.perturbation,
                                      c.temperature))


def accuracy_panels(rows: Sequence[SummaryRow]) -> list[Panel]:
    """Task accuracy against the follow-up rate across models, one panel per dataset and
    temperature (the models' own answers, unperturbed), with Spearman's rank correlation."""
    chosen = [r for r in rows if r.answerer == "self" and r.perturbation == "none"]
    panels = []
    for dataset, temperature in sorted({(r.dataset, r.temperature) for r in chosen}):
        points = [PanelPoint(r.probed, r.accuracy, r.follow_up) for r in chosen
                  if (r.dataset, r.temperature) == (dataset, temperature)
                  and r.accuracy is not None and r.accuracy.n and r.follow_up.n]
        corr = rank_correlation([p.accuracy.value for p in points],
                                [p.follow_up.value for p in points])
        panels.append(Panel(dataset, temperature, points, corr))
    return panels


def right_wrong_tables(turns: Sequence[Turn]) -> list[Joint]:
    """Per unperturbed condition with scored answers, the follow-up rate after a right answer
    and after a wrong one (:func:`~userturn.stats.rates.joint_table`), in condition order."""
    groups: dict[Condition, list[tuple[str, bool, bool]]] = defaultdict(list)
    for t in turns:
        if t.perturbation == "none" and t.answer_correct is not None and t.counts_toward_rate:
            groups[Condition.of(t)].append(
                (t.item_id, t.answer_correct, t.follow_up))
    return [Joint(key, joint_table(triples)) for key, triples in sorted(groups.items())]
