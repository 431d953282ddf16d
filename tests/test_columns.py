"""The rate table's columns are one list (``userturn.report.columns.COLUMNS``) that the terminal
table, the HTML report and ``summary.csv`` render.

``fixtures/columns/`` holds what the renderers wrote before the list existed (each file made by
:func:`rendered` below from the release without it): summary rows that take every branch of the
table (human labels and corrected rates, an answerer and a perturbation that vary or stand alone,
two datasets, the data's real turns, failed turns), no rows at all, agreement with people, and the
two committed run folders. The list must write them byte for byte; and a column added to it must
show up on all three surfaces (or, when conditional, where a run has more than one value).
"""

from __future__ import annotations

import csv
import io
import shutil
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
from rich.console import Console

from userturn.records import HUMAN
from userturn.report import columns, sections
from userturn.report.agreement import print_against_people
from userturn.report.compute import Report
from userturn.report.summary import print_summary
from userturn.report.tables import export_tables
from userturn.report.terminal import print_run
from userturn.report.view import read_run
from userturn.stats.agreement import Agreement
from userturn.stats.correction import Corrected
from userturn.stats.effects import accuracy_panels
from userturn.stats.rates import Rate
from userturn.stats.reliability import against_people
from userturn.stats.summary import SummaryRow
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "columns"
RUNS = FIXTURES / "runs"
SOURCES = ["rules", "classifier"]
# The CSV tables the rate table and the statistics around it write.
CSV_TABLES = ("summary", "labels", "accuracy_vs_follow_up", "rank_correlation", "right_vs_wrong")


def _row(**fields) -> SummaryRow:
    base = dict(model="org/alpha", dataset="gsm_symbolic", temperature=0.0, items=40, turns=40,
                follow_up=Rate(4, 40, 0.04, 0.23),
                labels={"follow_up": 4, "generic": 10, "empty": 20, "meta": 6},
                accuracy=Rate(30, 40, 0.6, 0.86), deciding={"classifier": 40})
    return SummaryRow(**{**base, **fields})


def people_rows() -> list[SummaryRow]:
    """Human labels on some rows: corrected, short of labels, too few turns, read by people;
    answerer, dataset and perturbation vary; the data's real turns; failed turns."""
    return [
        _row(label_errors=2, similarity=0.31, human_labels=30,
             corrected=Corrected(0.12, 0.05, 0.2, 30, 40, 0.8),
             human_only=Corrected(0.13, 0.03, 0.3, 30, 40, 0.0)),
        _row(perturbation="truncate:0.5", temperature=0.7, turns=80,
             follow_up=Rate(10, 78, 0.07, 0.22), errors=2, undecided=3, human_labels=3,
             correction_note="3 human labels; a corrected rate needs 30"),
        _row(model="org/beta", answerer="reference", dataset="mt_bench", temperature=1.0,
             items=5, turns=10, follow_up=Rate(1, 10, 0.01, 0.4), accuracy=None,
             labels={"follow_up": 1, "new_query": 9}, deciding={"rules": 10}),
        _row(model=HUMAN, dataset="mt_bench", items=12, turns=12, follow_up=Rate(3, 12, 0.1, 0.5),
             accuracy=None, human_labels=12, read_by_people=True,
             correction_note="the rate is read with human labels, nothing to correct",
             labels={"follow_up": 3, "generic": 9}, deciding={"human:ann": 12}),
    ]


def single_rows() -> list[SummaryRow]:
    """No human labels; one answerer and one perturbation, neither the default; one dataset."""
    return [_row(model="tiny", user_variant="prefill:So", answerer="reference",
                 perturbation="truncate:0.5", deciding={"rules": 40}),
            _row(model="tiny", user_variant="prefill:So", answerer="reference",
                 perturbation="truncate:0.5",
                 temperature=1.0, turns=80, follow_up=Rate(0, 80, 0.0, 0.09), undecided=5,
                 deciding={"rules": 75})]


def agreements() -> list[Agreement]:
    matrix = [[3, 1], [0, 6]]
    return [Agreement("human:ann", "human:bo", 10, 0.7, 0.4, 0.9, 0.9, matrix, {}, 0,
                      ac1=0.8, pabak=0.8, baseline=0.6, baseline_label="empty"),
            Agreement("human:ann", "classifier", 10, 0.5, 0.2, 0.8, 0.8, matrix, {}, 1,
                      excluded_b=1, ac1=0.6, pabak=0.7, baseline=0.6, baseline_label="empty"),
            Agreement("human:bo", "rules", 4, float("nan"), float("nan"), float("nan"), 1.0,
                      matrix, {}, 0, ac1=float("nan"), pabak=1.0, baseline=1.0,
                      baseline_label="empty")]


def terminal(draw: Callable[[Console], None]) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    draw(console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def csv_files(report: Report, folder: Path) -> dict[str, str]:
    export_tables(report, folder)
    return {f"{name}.csv": (folder / f"{name}.csv").read_text(encoding="utf-8")
            for name in CSV_TABLES}


def of_rows(rows: list[SummaryRow], folder: Path) -> dict[str, str]:
    report = Report(folder=folder, meta=RunMeta(), sources=SOURCES, rows=rows, comparisons=[],
                    panels=accuracy_panels(rows), joints=[], turns=[], assistant_failures=1)
    return {"terminal.txt": terminal(lambda c: print_summary(rows, c, sources=SOURCES,
                                                             assistant_failures=1)),
            "summary.html": sections.summary(report),
            **csv_files(report, folder / "tables")}


def of_agreement(folder: Path) -> dict[str, str]:
    results = agreements()
    ratings = {"human:ann": {"a": "empty", "b": "generic"}, "human:bo": {"a": "empty", "b": None},
               "classifier": {"a": "empty", "b": "empty"}}
    report = Report(folder=folder, meta=RunMeta(), sources=SOURCES, rows=[], comparisons=[],
                    panels=[], joints=[], turns=[], agreement=results,
                    against_people=against_people(results))
    return {"terminal.txt": terminal(lambda c: print_against_people(results, ratings, c)),
            "agreement.html": sections.agreement(report)}


def of_run(name: str, folder: Path) -> dict[str, str]:
    run = folder / name
    shutil.copytree(RUNS / name, run)
    with closing(RunStore.read(run)) as store:
        view = read_run(store)
    report = view.report()
    html = [sections.summary(report), sections.accuracy_plot(report),
            sections.right_wrong(report), sections.agreement(report)]
    return {"terminal.txt": terminal(lambda c: print_run(view, c)),
            "report.html": "\n".join(html), **csv_files(report, folder / "tables")}


CASES: dict[str, Callable[[Path], dict[str, str]]] = {
    "people": lambda folder: of_rows(people_rows(), folder),
    "single": lambda folder: of_rows(single_rows(), folder),
    "no-rows": lambda folder: of_rows([], folder),
    "agreement": of_agreement,
    "before-redesign": lambda folder: of_run("before-redesign", folder),
    "static-batches": lambda folder: of_run("static-batches", folder),
}


def rendered(case: str, folder: Path) -> dict[str, str]:
    """What the renderers write for ``case``: file name -> text."""
    return CASES[case](folder)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_column_list_writes_what_the_tables_wrote_before_it(case, tmp_path):
    written = rendered(case, tmp_path)
    golden = GOLDEN / case
    assert sorted(written) == sorted(p.name for p in golden.iterdir())
    for name, text in written.items():
        assert text == (golden / name).read_text(encoding="utf-8"), f"{case}/{name} changed"


def _table_lines(text: str, title: str) -> list[str]:
    """The header and body lines of the terminal table under ``title``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("└"))
    return [line for line in lines[start + 1:end] if line.startswith(("┃", "│"))]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("┃│").replace("┃", "│").split("│")]


RATE_TITLE = "Genuine follow-up rate, 95% CI clustered by item"
LABELS_TITLE = "Labels of the generated user turns (counts)"


def test_a_column_added_to_the_list_shows_in_the_terminal_the_page_and_summary_csv(
        monkeypatch, tmp_path):
    added = columns.Column("samples", "samples per item", lambda r: r.turns // r.items,
                           columns.COUNT)
    monkeypatch.setattr(columns, "COLUMNS", [*columns.COLUMNS, added])
    written = of_rows(single_rows(), tmp_path)

    header, *rows = _table_lines(written["terminal.txt"], RATE_TITLE)
    assert _cells(header)[-1] == "samples per item"
    assert [_cells(row)[-1] for row in rows] == ["1", "2"]
    html = written["summary.html"]
    assert '<th class="num">samples per item</th>' in html
    assert html.count('<td class="num">1</td></tr>') == 1
    assert html.count('<td class="num">2</td></tr>') == 1
    records = list(csv.DictReader(io.StringIO(written["summary.csv"])))
    assert [record["samples"] for record in records] == ["1", "2"]
    # Nothing else moved: without the new column each file reads as before.
    golden = (GOLDEN / "single" / "summary.csv").read_text(encoding="utf-8")
    assert [{k: v for k, v in record.items() if k != "samples"} for record in records] == list(
        csv.DictReader(io.StringIO(golden)))


def test_the_arm_column_shows_where_a_row_is_not_the_opened_arm_and_is_always_in_the_csv(
        tmp_path):
    rows = [replace(row, arm="continuation") if row.temperature > 0 else row
            for row in single_rows()]
    both = of_rows(rows, tmp_path / "both")
    for title in (RATE_TITLE, LABELS_TITLE):
        header, *lines = _table_lines(both["terminal.txt"], title)
        where = _cells(header).index("arm")
        assert _cells(header)[where - 1] == "model"
        assert [_cells(line)[where] for line in lines] == ["opened", "continuation"]
    assert both["summary.html"].count('<th class="">arm</th>') == 2  # the rates and the counts
    assert both["summary.html"].count('<td class="">continuation</td>') == 2

    one = of_rows(single_rows()[:1], tmp_path / "one")
    for title in (RATE_TITLE, LABELS_TITLE):
        assert "arm" not in _cells(_table_lines(one["terminal.txt"], title)[0])
    assert ">arm<" not in one["summary.html"] and "opened" not in one["summary.html"]

    for written, values in ((both, ["opened", "continuation"]), (one, ["opened"])):
        summary = list(csv.DictReader(io.StringIO(written["summary.csv"])))
        assert list(summary[0])[:2] == ["model", "arm"]
        assert [record["arm"] for record in summary] == values
        labels = list(csv.DictReader(io.StringIO(written["labels.csv"])))
        assert list(labels[0])[:2] == ["model", "arm"]
        assert {record["arm"] for record in labels} == set(values)


def test_two_columns_writing_one_csv_field_are_refused_and_the_tables_written_stay(
        monkeypatch, tmp_path):
    report = Report(folder=tmp_path, meta=RunMeta(), sources=SOURCES, rows=single_rows(),
                    comparisons=[], panels=[], joints=[], turns=[])
    export_tables(report, tmp_path / "tables")
    before = (tmp_path / "tables" / "summary.csv").read_bytes()
    again = replace(next(c for c in columns.COLUMNS if c.name == "turns"), header="turns again")
    monkeypatch.setattr(columns, "COLUMNS", [*columns.COLUMNS, again])
    with pytest.raises(ValueError, match="^columns 'turns' and 'turns' both write the "
                                         "summary.csv field 'turns'; rename one$"):
        export_tables(report, tmp_path / "tables")
    assert (tmp_path / "tables" / "summary.csv").read_bytes() == before
