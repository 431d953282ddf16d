"""The numbers of the run report, gathered once from a run's turns and answers: the summary rows,
the perturbation effects, accuracy vs follow-up panels, the right-vs-wrong tables, the user-turn
variants and the agreement between labellers, each computed in ``stats/``.

``build_report`` gathers them; :mod:`.tables` writes the numbers as CSV and Parquet, :mod:`.page`
lays them out as one self-contained HTML file, :mod:`.figures` draws them for papers. A turn
counts towards a follow-up rate as :attr:`~userturn.records.Turn.counts_toward_rate` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.errors import ConfigError
from userturn.labels.sources import is_offline
from userturn.probe.perturb import EXPECTED, Perturbation, Unapplied, unapplied
from userturn.probe.plan import ProbePlan
from userturn.records import LABELS, STATUSES, Answer, Turn
from userturn.stats.agreement import Agreement, pairwise_agreement
from userturn.stats.effects import (
    Joint,
    Panel,
    PerturbationEffect,
    accuracy_panels,
    perturbation_effects,
    right_wrong_tables,
)
from userturn.stats.reliability import AgainstPeople, against_people
from userturn.stats.summary import SummaryRow, assistant_errors, summarize
from userturn.stats.variants import VariantComparison, variant_comparisons
from userturn.store.meta import RunMeta
from userturn.store.runstate import RunState

# The stacked categories of the label plot and the browser's filter: labels, then statuses.
CATEGORIES = [(label, label.replace("_", " ")) for label in LABELS] + [
    (s, "generation failed" if s == "failed" else s) for s in STATUSES]
ONLY_WITH_CONTINUATIONS = "no user turn"  # a status only the continuation arm's turns have


def categories(rows: Sequence[SummaryRow]) -> list[tuple[str, str]]:
    """The categories of ``rows``' label tables, plot and browser: every label and status,
    ``no user turn`` only where a row has the continuation arm."""
    arms = any(row.arm != "opened" for row in rows)
    return [(key, name) for key, name in CATEGORIES if arms or key != ONLY_WITH_CONTINUATIONS]


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
    state: RunState | None = None  # finished, in progress or incomplete
    # Each user-turn variant against the native opening (stats.variants).
    variants: list[VariantComparison] = field(default_factory=list)
    # Every pair of label sources that labelled at least two of the same turns.
    agreement: list[Agreement] = field(default_factory=list)
    # Each labeller against each person, beside the people's own range (stats.reliability).
    against_people: list[AgainstPeople] = field(default_factory=list)
    # Each perturbation that could not change some answers: those items are left out of it.
    unapplied: list[Unapplied] = field(default_factory=list)

    def varies(self, name: str) -> bool:
        return len({getattr(r, name) for r in self.rows}) > 1

    def condition(self, model: str, answerer: str, dataset: str) -> str:
        parts = [model] + ([dataset] if self.varies("dataset") else [])
        return " · ".join(parts + ([f"answers: {answerer}"] if self.varies("answerer") else []))


def build_report(turns: Sequence[Turn], answers: Sequence[Answer], *, folder: Path,
                 meta: RunMeta, sources: Sequence[str],
                 inclusion: Mapping[str, float] | None = None,
                 state: RunState | None = None) -> Report:
    """Every number of the report. ``turns`` are read with ``sources`` (the label sources in
    priority order); ``meta`` is the run's stored metadata; ``inclusion`` the human-labelled
    turns' inclusion probabilities (as :func:`userturn.stats.summary.summarize` takes them); ``state`` the
    run's :class:`~userturn.store.runstate.RunState` for the header."""
    rows = summarize(turns, answers, inclusion,
                     offline=[source for source in sources if is_offline(source)])
    ordered = sorted(turns, key=_turn_order)
    models = list(dict.fromkeys(_planned_models(meta)))
    models += sorted({r.probed for r in rows} - set(models))
    agreement = [r for r in pairwise_agreement(ordered) if r.n >= 2]
    return Report(Path(folder).resolve(), meta, list(sources), rows,
                  perturbation_effects(ordered, EXPECTED), accuracy_panels(rows),
                  right_wrong_tables(ordered), ordered, models, assistant_errors(answers), state,
                  variant_comparisons(ordered), agreement, against_people(agreement),
                  unapplied(ordered, planned_perturbations(meta)))


def _planned_models(meta: RunMeta) -> list[str]:
    """The models the run planned, in its order (none where it stored no plan this version
    reads: the turns then give the models)."""
    try:
        return meta.stored(ProbePlan).models if meta.config else []
    except ConfigError:
        return []


def planned_perturbations(meta: RunMeta) -> list[Perturbation]:
    """The perturbations the run planned (none where it stored no plan this version reads)."""
    try:
        return meta.stored(ProbePlan).perturbations if meta.config else []
    except ConfigError:
        return []


def _turn_order(t: Turn) -> tuple[Any, ...]:
    """The store's order, with each condition's original context before its perturbations."""
    return (t.probed, t.answerer, t.dataset, t.perturbation != "none", t.perturbation,
            t.temperature, t.item_id, t.sample_index)
