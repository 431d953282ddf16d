"""``userturn agreement`` in the terminal: the agreement between label sources as rich tables.

The numbers come from :mod:`userturn.stats.agreement` and :mod:`userturn.stats.reliability`
(over a run folder's turns, read once by :func:`run_agreement`); this module lays them out.
"""

from __future__ import annotations

import math
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from userturn.report.numbers import decimal, label_header, percent
from userturn.stats.agreement import Agreement, pairwise_agreement, source_rank
from userturn.stats.reliability import against_people, alpha, ratings_of
from userturn.store.database import RunStore
from userturn.store.turns import check_label_sources
from userturn.store.view import read_stored_run

_NAN = float("nan")

NOTHING_TO_COMPARE = ("no two label sources share labelled turns: annotate with `userturn annotate "
                      "RUN` or judge with `userturn judge RUN --judge SPEC`")


@dataclass(frozen=True)
class RunAgreement:
    """The agreement of a run's label sources: every pair, and each source's labels by turn."""

    pairs: list[Agreement]
    ratings: dict[str, dict[str, str | None]]


def run_agreement(folder: Path, sources: Sequence[str] | None = None) -> RunAgreement:
    """The agreement between the label sources of the run in ``folder`` (read only): all of
    them, or ``sources`` (``--sources``, the first the reference), which the run must hold."""
    with closing(RunStore.read(folder)) as store:
        check_label_sources(store, sources, "--sources")
        turns = read_stored_run(store).turns
    ratings = ratings_of(turns)
    if sources:
        ratings = {s: r for s, r in ratings.items() if s in sources}
    return RunAgreement(pairwise_agreement(turns, sources=sources), ratings)


def _num(value: float, digits: int = 2) -> str:
    return decimal(value, digits)


def _pct(value: float) -> str:
    return percent(value, 0, "-")


def _kappa_cell(result: Agreement) -> str:
    if math.isnan(result.kappa):
        return "-"
    if math.isnan(result.low):
        return _num(result.kappa)
    return f"{_num(result.kappa)} [{_num(result.low)}, {_num(result.high)}]"


def _short(label: str) -> str:
    return label_header(label)


def print_agreement(results: Sequence[Agreement], console: Console) -> None:
    """A summary table of every pair, then per compared pair its confusion matrix with per-label
    precision, recall and support (rater ``a`` as the reference)."""
    compared = [r for r in results if r.n > 0]
    if not compared:
        console.print(NOTHING_TO_COMPARE, style="yellow", markup=False)
        return
    summary = Table(title="Agreement between label sources (Cohen's kappa, 95% CI bootstrapped "
                          "over items)")
    for name in ("a", "b", "n", "items", "kappa [95% CI]", "AC1", "PABAK", "agreement",
                 "constant a", "excluded"):
        summary.add_column(name, justify="left" if name in ("a", "b") else "right")
    for r in results:
        excluded = f"{r.excluded} (a: {r.excluded_a}, b: {r.excluded_b})" if r.excluded else "0"
        summary.add_row(r.a, r.b, str(r.n), str(r.items), _kappa_cell(r), _num(r.ac1),
                        _num(r.pabak), _pct(r.raw), _pct(r.baseline), excluded)
    console.print(summary)
    console.print("constant a: the agreement of always giving a's most common label (kappa "
                  "0), the floor to beat; AC1 and PABAK stay informative when one label is rare, "
                  "where kappa drops", style="dim")
    for r in compared:
        used = [i for i, _ in enumerate(r.labels)
                if sum(r.matrix[i]) or sum(row[i] for row in r.matrix)]
        table = Table(title=f"{r.a} (rows, reference) vs {r.b} (columns)",
                      caption="recall: diagonal / row total; precision: diagonal / column total")
        table.add_column(f"{r.a} \\ {r.b}", justify="left")
        for j in used:
            table.add_column(_short(r.labels[j]), justify="right")
        for name in ("precision", "recall", "F1", "support"):
            table.add_column(name, justify="right")
        for i in used:
            stats = r.per_label.get(r.labels[i], {"precision": _NAN, "recall": _NAN,
                                                   "f1": _NAN, "support": 0})
            table.add_row(_short(r.labels[i]), *(str(r.matrix[i][j]) for j in used),
                          _num(stats["precision"]), _num(stats["recall"]),
                          _num(stats["f1"]), str(stats["support"]))
        console.print(table)
    notes = []
    if any(r.n < 2 for r in results):
        notes.append("pairs with fewer than 2 shared labelled turns have no kappa")
    if any(r.excluded for r in results):
        notes.append("excluded: turns both sources labelled where one gave none (rules undecided, "
                     "judge answer invalid); a / b: by which side")
    if any(r.n and math.isnan(r.kappa) and r.n >= 2 for r in results):
        notes.append("kappa is undefined (-) when both sources gave one and the same label to "
                     "every turn")
    if any(source_rank(r.a)[0] + source_rank(r.b)[0] == 1 for r in compared):
        notes.append("for reference, the paper's judge agreed with blind human labels at kappa "
                     "0.726")
    for note in notes:
        console.print(note, style="dim", markup=False)


def print_against_people(results: Sequence[Agreement],
                         ratings: Mapping[str, Mapping[str, str | None]],
                         console: Console) -> None:
    """Each labeller against each person beside the people's own range, then Krippendorff's
    alpha over the people and over every source."""
    rows = against_people(results)
    people = {s: r for s, r in ratings.items() if s.startswith("human:")}
    if rows:
        table = Table(title="Labellers against people (kappa; the people's range beside it)")
        for name in ("labeller", "human", "n", "kappa", "AC1", "human vs human kappa",
                     "at least as good as a person"):
            table.add_column(name, justify="left" if name in ("labeller", "human") else "right")
        for row in rows:
            human_range = ("-" if row.human_low != row.human_low else
                           f"{decimal(row.human_low)} to {decimal(row.human_high)}")
            verdict = "-" if row.in_range is None else ("yes" if row.in_range else "no")
            table.add_row(row.labeller, row.human, str(row.n), decimal(row.kappa),
                          decimal(row.ac1), human_range, verdict)
        console.print(table)
    lines = []
    try:
        if len(people) >= 2:
            lines.append(f"Krippendorff's alpha (nominal), people only: {decimal(alpha(people))}")
        if len(ratings) >= 2:
            lines.append("Krippendorff's alpha (nominal), every source: "
                         f"{decimal(alpha(ratings))}")
    except ImportError:
        lines.append("Krippendorff's alpha needs the krippendorff package (pip install "
                     "'userturn[stats]')")
    for line in lines:
        console.print(line)
