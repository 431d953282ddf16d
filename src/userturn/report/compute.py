"""The numbers of the run report, computed once from a run's turns and answers: the summary rows,
the perturbation effects, accuracy vs follow-up panels and the right-vs-wrong tables.

``build_report`` computes; :mod:`.tables` writes the numbers as CSV and Parquet, :mod:`.page` lays
them out as one self-contained HTML file, :mod:`.figures` draws them for papers. The numbers are
the ones ``summarize`` and ``stats`` give: a turn counts towards a follow-up rate as
:attr:`~userturn.records.Turn.counts_toward_rate` says.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.labels.sources import OFFLINE
from userturn.probe.perturb import EXPECTED
from userturn.records import LABELS, STATUSES, Answer, Condition, Turn
from userturn.stats.agreement import Agreement, pairwise_agreement
from userturn.stats.rates import (
    Correlation,
    Difference,
    McNemar,
    Rate,
    direction,
    joint_table,
    paired_difference,
    rank_correlation,
    single_sample_mcnemar,
)
from userturn.stats.reliability import against_people
from userturn.stats.summary import SummaryRow, assistant_errors, summarize
from userturn.stats.variants import VariantComparison, variant_comparisons
from userturn.store.meta import RunMeta

# The stacked categories of the label plot and the browser's filter: labels, then statuses.
CATEGORIES = [(label, label.replace("_", " ")) for label in LABELS] + [
    (s, "generation failed" if s == "failed" else s) for s in STATUSES]


@dataclass(frozen=True)
class PerturbationEffect:
    """Perturbed vs original context of one model, answerer, dataset and temperature."""

    model: str
    answerer: str
    dataset: str
    perturbation: str
    temperature: float
    diff: Difference
    expected: str  # "up" or "down", from perturb.EXPECTED
    mcnemar: McNemar | None  # greedy: one outcome per item on each side

    @property
    def verdict(self) -> str:
        return direction(self.diff, self.expected)


@dataclass(frozen=True)
class Panel:
    """Task accuracy vs follow-up rate across models, at one dataset and temperature."""

    dataset: str
    temperature: float
    points: list[tuple[str, Rate, Rate]]  # (model, accuracy, follow-up rate)
    correlation: Correlation


Joint = tuple[Condition, dict[str, Any]]  # an unperturbed condition, its right-vs-wrong table


@dataclass
class Report:
    folder: Path
    meta: RunMeta
    sources: list[str]
    rows: list[SummaryRow]
    comparisons: list[PerturbationEffect]
    panels: list[Panel]
    joints: list[Joint]
    turns: list[Turn]
    models: list[str] = field(default_factory=list)
    assistant_failures: int = 0
    state: Any = None  # runstate.RunState: finished, in progress or incomplete
    # Each user-turn variant against the native opening (stats.variants).
    variants: list[VariantComparison] = field(default_factory=list)
    # Every pair of label sources that labelled at least two of the same turns.
    agreement: list[Agreement] = field(default_factory=list)
    # Each labeller against each person, beside the people's own range (stats.reliability).
    against_people: list[dict[str, Any]] = field(default_factory=list)

    def varies(self, name: str) -> bool:
        return len({getattr(r, name) for r in self.rows}) > 1

    def condition(self, model: str, answerer: str, dataset: str) -> str:
        parts = [model] + ([dataset] if self.varies("dataset") else [])
        return " · ".join(parts + ([f"answers: {answerer}"] if self.varies("answerer") else []))


def build_report(turns: Sequence[Turn], answers: Sequence[Answer], *, folder: Path,
                 meta: RunMeta, sources: Sequence[str],
                 inclusion: Mapping[str, float] | None = None, state: Any = None) -> Report:
    """Every number of the report. ``turns`` are read with ``sources`` (the label sources in
    priority order); ``meta`` is the run's stored metadata; ``inclusion`` the human-labelled
    turns' inclusion probabilities (as :func:`.summary.summarize` takes them); ``state`` the
    run's :class:`~userturn.store.runstate.RunState` for the header."""
    rows = summarize(turns, answers, inclusion, offline=OFFLINE)
    ordered = sorted(turns, key=_turn_order)
    models = list(dict.fromkeys(meta.config.get("models", [])))
    models += sorted({r.model for r in rows} - set(models))
    agreement = [r for r in pairwise_agreement(ordered) if r.n >= 2]
    return Report(Path(folder).resolve(), meta, list(sources), rows, _comparisons(ordered),
                  _panels(rows), _joints(ordered), ordered, models, assistant_errors(answers), state,
                  variant_comparisons(ordered), agreement, against_people(agreement))


def _turn_order(t: Turn) -> tuple[Any, ...]:
    """The store's order, with each condition's original context before its perturbations."""
    return (t.model, t.answerer, t.dataset, t.perturbation != "none", t.perturbation,
            t.temperature, t.item_id, t.sample_index)


def _comparisons(turns: Sequence[Turn]) -> list[PerturbationEffect]:
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
                                      EXPECTED.get(c.perturbation.split(":")[0], "up"),
                                      single_sample_mcnemar(before, after)))
    return sorted(out, key=lambda c: (c.model, c.answerer, c.dataset, c.perturbation,
                                      c.temperature))


def _panels(rows: list[SummaryRow]) -> list[Panel]:
    chosen = [r for r in rows if r.answerer == "self" and r.perturbation == "none"]
    panels = []
    for dataset, temperature in sorted({(r.dataset, r.temperature) for r in chosen}):
        points = [(r.model, r.accuracy, r.follow_up) for r in chosen
                  if (r.dataset, r.temperature) == (dataset, temperature)
                  and r.accuracy is not None and r.accuracy.n and r.follow_up.n]
        corr = rank_correlation([a.value for _, a, _ in points], [f.value for *_, f in points])
        panels.append(Panel(dataset, temperature, points, corr))  # type: ignore[arg-type]
    return panels


def _joints(turns: Sequence[Turn]) -> list[Joint]:
    groups: dict[Condition, list[tuple[str, bool, bool]]] = defaultdict(list)
    for t in turns:
        if t.perturbation == "none" and t.answer_correct is not None and t.counts_toward_rate:
            groups[Condition.of(t)].append(
                (t.item_id, t.answer_correct, t.follow_up))
    return [(key, joint_table(triples)) for key, triples in sorted(groups.items())]
