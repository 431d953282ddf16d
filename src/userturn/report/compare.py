"""Paired comparison of two runs on the items they share (base vs post-trained, model A vs B).

Units (a :class:`~userturn.records.Condition` whose model is the pairing, ``A → B``, or the one
name both runs share) are matched by dataset, answerer, perturbation and temperature; within a
unit, items are
matched by id. A run with one model is compared with the other run's one model whatever their
names (the usual base-vs-checkpoint case); with several models, models pair by name. Differences
are B minus A, with paired score intervals over shared items (clustered by item), and an exact
McNemar test where each item has a single greedy sample. Where the runs hold human labels, the
difference corrected for the labeller's errors is given beside it (:mod:`userturn.stats.correction`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Hashable, Iterable, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from userturn.errors import StoreError
from userturn.labels.calibration import inclusion_probabilities
from userturn.records import HUMAN, Answer, Condition, Turn, human_label, is_human
from userturn.report import markup
from userturn.report.numbers import difference, percent, temperature, temperature_label
from userturn.stats.correction import CorrectedDifference, Observation, corrected_difference
from userturn.stats.rates import (
    Difference,
    McNemar,
    direction,
    mcnemar_exact,
    paired_difference,
    single_sample_mcnemar,
)
from userturn.store.database import RunStore
from userturn.store.turns import read_answers, read_turns


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


@dataclass(frozen=True)
class AccuracyComparison:
    model_a: str
    model_b: str
    dataset: str
    accuracy: Difference
    mcnemar: McNemar


def compare_runs(a: RunStore, b: RunStore, *,
                 labels: Sequence[str] | None = None) -> tuple[list[Comparison],
                                                               list[AccuracyComparison]]:
    """B minus A on shared items, each run read once. ``labels``: the label sources, in priority
    order, that both runs are read with (default: each run's own)."""
    turns_a, turns_b = read_turns(a, labels), read_turns(b, labels)
    # Per run: the same generation (same key) can be in both runs, labelled by different samples.
    inclusion = (inclusion_probabilities(a, turns_a), inclusion_probabilities(b, turns_b))
    return compare_turns(turns_a, read_answers(a), turns_b, read_answers(b), inclusion)


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
    """The probed models; the data's own human turns are the same in both runs."""
    return sorted({t.model for t in turns} - {HUMAN})


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
        if turn.model in names and turn.counts_toward_rate:
            units[replace(Condition.of(turn), model=names[turn.model])].append(turn)
    return units


def _compare_unit(unit: Condition, a: list[Turn], b: list[Turn],
                  inclusion: tuple[Mapping[str, float], Mapping[str, float]]) -> Comparison:
    model_a, _, model_b = unit.model.partition(" → ")
    hits_a = [(t.item_id, t.follow_up) for t in a]
    hits_b = [(t.item_id, t.follow_up) for t in b]
    return Comparison(model_a, model_b or model_a, unit.dataset, unit.answerer,
                      unit.perturbation, unit.temperature,
                      paired_difference(hits_a, hits_b),
                      single_sample_mcnemar(hits_a, hits_b), _corrected(a, b, inclusion))


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
        if answer.model == model and answer.correct is not None:
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


def print_comparison(comparisons: Sequence[Comparison],
                     accuracy: Sequence[AccuracyComparison], console: Console,
                     names: tuple[str, str]) -> None:
    table = Table(title=f"Follow-up rate, B minus A on shared items (A = {names[0]}, "
                        f"B = {names[1]}; paired 95% CI)")
    for column in ("A", "B", "dataset", "answerer", "perturbation", "T", "items", "A rate",
                   "B rate", "difference [95% CI]", "McNemar p", "dropped A/B"):
        table.add_column(column, justify="left" if column in ("A", "B", "dataset", "answerer",
                                                              "perturbation") else "right")
    for c in comparisons:
        d = c.follow_up
        table.add_row(c.model_a, c.model_b, c.dataset, c.answerer, c.perturbation,
                      temperature(c.temperature), str(d.items),
                      _pct(d.a.value), _pct(d.b.value), difference(d),
                      "-" if c.mcnemar is None else f"{c.mcnemar.p_value:.3g}",
                      f"{d.dropped_a}/{d.dropped_b}")
    console.print(table)
    corrected = [c for c in comparisons if c.corrected is not None]
    if corrected:
        fixed = Table(title="Corrected for the labeller's errors with each run's human labels "
                            "(PPI++, clustered by item, paired)")
        for column in ("A", "B", "dataset", "perturbation", "T", "A corrected", "B corrected",
                       "difference [95% CI]"):
            fixed.add_column(column, justify="left" if column in ("A", "B", "dataset",
                                                                  "perturbation") else "right")
        for c in corrected:
            fixed.add_row(c.model_a, c.model_b, c.dataset, c.perturbation,
                          temperature(c.temperature), *corrected_cells(c))
        console.print(fixed)
    if accuracy:
        acc = Table(title="Task accuracy of the greedy answer, B minus A on shared items")
        for column in ("A", "B", "dataset", "items", "A", "B", "difference [95% CI]",
                       "McNemar p"):
            acc.add_column(column, justify="right")
        for ac in accuracy:
            d = ac.accuracy
            acc.add_row(ac.model_a, ac.model_b, ac.dataset, str(d.items), _pct(d.a.value),
                        _pct(d.b.value), difference(d), f"{ac.mcnemar.p_value:.3g}")
        console.print(acc)


def corrected_cells(c: Comparison) -> tuple[str, str, str]:
    """A's and B's corrected rates and their difference, or the reason there are none."""
    if c.corrected is None:
        return "-", "-", "-"
    if isinstance(c.corrected, str):
        return "-", "-", f"not shown: {c.corrected}"
    d = c.corrected
    return (f"{_pct(d.a.value)} ({d.a.human_labels} labels)",
            f"{_pct(d.b.value)} ({d.b.human_labels} labels)",
            f"{100 * d.delta:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}]")


def _pct(value: float) -> str:
    return percent(value, 1, "-")


COMPARE_LEGEND = {"expected": "B higher, interval excludes 0",
                  "expected_ns": "B higher, interval includes 0",
                  "opposite": "B lower, interval excludes 0",
                  "opposite_ns": "B lower, interval includes 0"}
PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>userturn compare</title><style>
body {{ font-family: system-ui, sans-serif; color: #1f2328; max-width: 1180px; margin: 24px auto;
       padding: 0 24px; line-height: 1.5; }}
p {{ color: #5f6670; max-width: 880px; }} table {{ border-collapse: collapse; margin: 12px 0 28px; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #e4e6ea; text-align: right; }}
th:nth-child(-n+5), td:nth-child(-n+5) {{ text-align: left; }} svg {{ max-width: 100%; }}
</style></head><body>
<h1>userturn compare</h1><p>A = {a}<br>B = {b}</p>{note}
<h2>Follow-up rate: B minus A on shared items</h2>
<p>Paired 95% intervals (clustered score intervals) over the items both runs share; for greedy decoding (one turn
per item) McNemar's exact p. Items present in one run only are dropped and counted.</p>
{forest}{table}
<h2>Task accuracy of the greedy answer</h2>{accuracy}
</body></html>"""


def comparison_html(comparisons: Sequence[Comparison], accuracy: Sequence[AccuracyComparison],
                    names: tuple[str, str], note: str = "") -> str:
    """One self-contained page: a forest plot of the differences and both tables. ``note`` is
    plain text shown under the run names (escaped)."""
    from html import escape

    from userturn.report import plots

    rows = [plots.ForestRow(
        group=f"{c.model_a} → {c.model_b} · {c.dataset}" + (
            f" · answerer {c.answerer}" if c.answerer != "self" else ""),
        name=f"{c.perturbation} · {temperature_label(c.temperature)}",
        delta=c.follow_up.delta, low=c.follow_up.low, high=c.follow_up.high,
        verdict=direction(c.follow_up), note=difference(c.follow_up)) for c in comparisons]
    forest = plots.forest(rows, x_label="B minus A, follow-up rate (percentage points)",
                          legend=COMPARE_LEGEND) if rows else ""
    header = ("A", "B", "dataset", "answerer", "perturbation", "T", "items", "A rate", "B rate",
              "difference [95% CI]", "McNemar p", "dropped A/B")
    body = [(c.model_a, c.model_b, c.dataset, c.answerer, c.perturbation,
             temperature(c.temperature), c.follow_up.items,
             _pct(c.follow_up.a.value), _pct(c.follow_up.b.value), difference(c.follow_up),
             "-" if c.mcnemar is None else f"{c.mcnemar.p_value:.3g}",
             f"{c.follow_up.dropped_a}/{c.follow_up.dropped_b}") for c in comparisons]
    acc_body = [(c.model_a, c.model_b, c.dataset, c.accuracy.items, _pct(c.accuracy.a.value),
                 _pct(c.accuracy.b.value), difference(c.accuracy), f"{c.mcnemar.p_value:.3g}")
                for c in accuracy]
    note_html = "".join(f"<p><strong>{escape(line)}</strong></p>"
                        for line in note.splitlines() if line.strip())
    return PAGE.format(a=escape(names[0]), b=escape(names[1]), note=note_html, forest=forest,
                       table=_escaped_table(header, body, numeric_from=5),
                       accuracy=_escaped_table(("A", "B", "dataset", "items", "A", "B",
                                                "difference [95% CI]", "McNemar p"), acc_body,
                                               numeric_from=3))


def _escaped_table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int
                   ) -> str:
    """The report's table of plain values: every cell is run metadata or a number, escaped."""
    return markup.table([markup.esc(h) for h in header],
                        [[markup.esc(v) for v in row] for row in rows], numeric_from=numeric_from)
