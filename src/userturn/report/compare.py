"""Paired comparison of two runs on the items they share (base vs post-trained, model A vs B):
each run read once, compared by :func:`userturn.stats.comparison.compare_turns` (which says how
units and items pair), printed as tables or laid out as one HTML page.
"""

from __future__ import annotations

import re
from contextlib import closing
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from userturn.errors import ConfigError
from userturn.report import markup
from userturn.report.numbers import difference, percent, temperature, temperature_label
from userturn.report.view import RunView, read_run
from userturn.stats.comparison import AccuracyComparison, Comparison, compare_turns
from userturn.stats.rates import direction
from userturn.store.database import RunStore
from userturn.store.turns import check_label_sources


def compare_runs(a: RunStore, b: RunStore, *,
                 labels: Sequence[str] | None = None) -> tuple[list[Comparison],
                                                               list[AccuracyComparison]]:
    """B minus A on shared items, each run read once. ``labels``: the label sources, in priority
    order, that both runs are read with (default: each run's own)."""
    return compare_views(read_run(a, labels), read_run(b, labels))


def compare_views(a: RunView, b: RunView) -> tuple[list[Comparison], list[AccuracyComparison]]:
    """B minus A on shared items, of two runs already read. Each run's human labels stand for
    their own run: the same generation (same key) can be in both, labelled by different samples."""
    return compare_turns(a.turns, a.answers, b.turns, b.answers, (a.inclusion, b.inclusion))


def compare_folders(a: Path, b: Path, *, labels: Sequence[str] | None = None
                    ) -> tuple[list[Comparison], list[AccuracyComparison]]:
    """:func:`compare_runs` of the runs in two folders, each opened to read only. ``labels``
    (``--labels``) must name sources both runs hold; one folder given twice is refused, as every
    difference would be zero by construction: a mistyped second run, not a result."""
    if _same_folder(a, b):
        raise ConfigError(f"compare: {a} and {b} are the same run; give two different run "
                          "folders")
    with closing(RunStore.read(a)) as run_a, closing(RunStore.read(b)) as run_b:
        check_label_sources(run_a, labels)
        check_label_sources(run_b, labels)
        return compare_runs(run_a, run_b, labels=labels)


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:  # one does not exist: RunStore.read says so
        return False


def print_comparison(comparisons: Sequence[Comparison],
                     accuracy: Sequence[AccuracyComparison], console: Console,
                     names: tuple[str, str]) -> None:
    # Where people labelled turns the corrected rates lead, the labeller's raw rates beside them.
    corrected = [c for c in comparisons if c.corrected is not None]
    if corrected:
        fixed = Table(title="Corrected for the labeller's errors with each run's human labels "
                            f"(PPI++, clustered by item, paired; A = {names[0]}, B = {names[1]})")
        for column in CORRECTED_COLUMNS:
            fixed.add_column(column, justify="left" if column in ("A", "B", "dataset",
                                                                  "perturbation") else "right")
        for c in corrected:
            fixed.add_row(c.model_a, c.model_b, c.dataset, c.perturbation,
                          temperature(c.temperature), *corrected_row(c))
        console.print(fixed)
    table = Table(title=f"Follow-up rate{', raw' if corrected else ''}, B minus A on shared "
                        f"items (A = {names[0]}, B = {names[1]}; paired 95% CI)")
    arms = _arms(comparisons)
    for column in ("A", "B", *(["arm"] if arms else []), "dataset", "answerer", "perturbation",
                   "T", "items", "A rate", "B rate", "difference [95% CI]", "McNemar p",
                   "dropped A/B"):
        table.add_column(column, justify="left" if column in ("A", "B", "arm", "dataset",
                                                              "answerer", "perturbation")
                         else "right")
    for c in comparisons:
        d = c.follow_up
        table.add_row(c.model_a, c.model_b, *([c.arm] if arms else []), c.dataset, c.answerer,
                      c.perturbation,
                      temperature(c.temperature), str(d.items),
                      _pct(d.a.value), _pct(d.b.value), difference(d),
                      "-" if c.mcnemar is None else f"{c.mcnemar.p_value:.3g}",
                      f"{d.dropped_a}/{d.dropped_b}")
    console.print(table)
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


CORRECTED_COLUMNS = ("A", "B", "dataset", "perturbation", "T", "A corrected", "B corrected",
                     "difference [95% CI]", "A raw", "B raw", "raw difference")


def corrected_cells(c: Comparison) -> tuple[str, str, str]:
    """A's and B's corrected rates and their difference, or the reason there are none (with
    how many more human labels the short side needs, where it can have enough)."""
    if c.corrected is None:
        return "-", "-", "-"
    if isinstance(c.corrected, str):
        return "-", "-", f"not shown: {c.corrected}{_more(c, c.corrected)}"
    d = c.corrected
    return (f"{_pct(d.a.value)} ({d.a.human_labels} labels)",
            f"{_pct(d.b.value)} ({d.b.human_labels} labels)",
            f"{100 * d.delta:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}]")


def corrected_row(c: Comparison) -> tuple[str, ...]:
    """The corrected table's cells of one comparison: corrected first, then raw."""
    d = c.follow_up
    return (*corrected_cells(c), _pct(d.a.value), _pct(d.b.value), difference(d))


_SHORT = re.compile(r"^(A|B): (\d+) human label\(s\), fewer than (\d+)$")


def _more(c: Comparison, reason: str) -> str:
    """``reason`` (``A: 12 human label(s), fewer than 30``) read for how many more labels the
    short side needs on the shared items; a side with fewer turns than that can have none."""
    short = _SHORT.match(reason)
    if short is None:
        return ""
    side, labelled, needed = short.group(1), int(short.group(2)), int(short.group(3))
    turns = (c.follow_up.a if side == "A" else c.follow_up.b).n
    if turns < needed:
        return f" ({side} has {turns} turns on the shared items: it cannot have {needed})"
    return f" ({needed - labelled} more on {side})"


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
<h1>userturn compare</h1><p>A = {a}<br>B = {b}</p>{note}{corrected}
<h2>Follow-up rate{raw}: B minus A on shared items</h2>
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
        name=f"{c.perturbation} · {temperature_label(c.temperature)}"
             + (f" · {c.arm}" if c.arm != "opened" else ""),
        delta=c.follow_up.delta, low=c.follow_up.low, high=c.follow_up.high,
        verdict=direction(c.follow_up), note=difference(c.follow_up)) for c in comparisons]
    forest = plots.forest(rows, x_label="B minus A, follow-up rate (percentage points)",
                          legend=COMPARE_LEGEND) if rows else ""
    arms = _arms(comparisons)
    header = ("A", "B", *(["arm"] if arms else []), "dataset", "answerer", "perturbation", "T",
              "items", "A rate", "B rate", "difference [95% CI]", "McNemar p", "dropped A/B")
    body = [(c.model_a, c.model_b, *([c.arm] if arms else []), c.dataset, c.answerer,
             c.perturbation,
             temperature(c.temperature), c.follow_up.items,
             _pct(c.follow_up.a.value), _pct(c.follow_up.b.value), difference(c.follow_up),
             "-" if c.mcnemar is None else f"{c.mcnemar.p_value:.3g}",
             f"{c.follow_up.dropped_a}/{c.follow_up.dropped_b}") for c in comparisons]
    acc_body = [(c.model_a, c.model_b, c.dataset, c.accuracy.items, _pct(c.accuracy.a.value),
                 _pct(c.accuracy.b.value), difference(c.accuracy), f"{c.mcnemar.p_value:.3g}")
                for c in accuracy]
    note_html = "".join(f"<p><strong>{escape(line)}</strong></p>"
                        for line in note.splitlines() if line.strip())
    fixed = [c for c in comparisons if c.corrected is not None]
    corrected = ("<h2>Corrected for the labeller's errors with each run's human labels</h2><p>"
                 "PPI++ on each run's human-labelled turns, clustered by item and paired; the "
                 "labeller's raw rates beside them.</p>" + _escaped_table(
                     CORRECTED_COLUMNS, [(c.model_a, c.model_b, c.dataset, c.perturbation,
                                          temperature(c.temperature), *corrected_row(c))
                                         for c in fixed], numeric_from=4)) if fixed else ""
    return PAGE.format(a=escape(names[0]), b=escape(names[1]), note=note_html,
                       corrected=corrected, raw=", raw" if fixed else "", forest=forest,
                       table=_escaped_table(header, body, numeric_from=5),
                       accuracy=_escaped_table(("A", "B", "dataset", "items", "A", "B",
                                                "difference [95% CI]", "McNemar p"), acc_body,
                                               numeric_from=3))


def _escaped_table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int
                   ) -> str:
    """The report's table of plain values: every cell is run metadata or a number, escaped."""
    return markup.table([markup.esc(h) for h in header],
                        [[markup.esc(v) for v in row] for row in rows], numeric_from=numeric_from)


def _arms(comparisons: Sequence[Comparison]) -> bool:
    """Whether the comparisons name a probe arm other than the opened one (then an arm column)."""
    return any(c.arm != "opened" for c in comparisons)
