"""The columns of the rate table, in one list: the terminal table (:mod:`.summary`), the HTML
report's summary (:mod:`.sections`) and ``summary.csv`` (:mod:`.tables`) each render
:data:`COLUMNS`, in its order.

A :class:`Column` is a name (its field in ``summary.csv``), a header, how its value is read from a
:class:`~userturn.stats.summary.SummaryRow`, and a :class:`Format` that writes that value on each
surface: a terminal cell, the page's cells, the CSV fields. Whether the terminal and the page
show a column is decided from the run's rows (:data:`Shown`: a key the run does not vary, the
corrected rate where no person labelled a turn, stay out of the way); ``summary.csv`` writes
every column it holds whatever the run, so a script that reads the file finds the same fields in
every run. The columns that name a row's condition (``condition=True``) lead the label-count
tables too (the terminal's, the page's and ``labels.csv``).

CONTRIBUTING.md ("How to add a column") walks through adding one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rich.text import Text

from userturn.records import LABELS
from userturn.report.markup import count, esc, rate_html
from userturn.report.numbers import (
    f1,
    interval_text,
    rate_interval,
    temperature,
    temperature_axis,
)
from userturn.stats.correction import MIN_HUMAN_LABELS, Corrected
from userturn.stats.rates import Rate
from userturn.stats.summary import SummaryRow

NA = '<span class="na">–</span>'  # a missing value on the page


# -- formats: how a value is written on each surface ---------------------------------------------
def csv_number(value: float | None) -> float | None:
    """A number as the CSV files hold it: rounded to 6 places, empty when missing or infinite."""
    return None if value is None or not math.isfinite(value) else round(float(value), 6)


def rate_fields(prefix: str, rate: Rate | None) -> dict[str, Any]:
    """A rate as CSV fields: the value, its interval, its hits and its n."""
    if rate is None:
        return {prefix: None, f"{prefix}_low": None, f"{prefix}_high": None,
                f"{prefix}_hits": None, f"{prefix}_n": None}
    return {prefix: csv_number(rate.value), f"{prefix}_low": csv_number(rate.low),
            f"{prefix}_high": csv_number(rate.high), f"{prefix}_hits": rate.hits,
            f"{prefix}_n": rate.n}


def _one_field(name: str, value: Any) -> dict[str, Any]:
    return {name: value}


def _one_header(header: str) -> tuple[str, ...]:
    return (header,)


@dataclass(frozen=True)
class Format:
    """How a column's value is written: ``text`` a terminal cell; ``html`` the page's cells, one
    per header that ``page_headers`` makes of the column's header (a rate has its n beside it);
    ``fields`` the ``summary.csv`` fields named from the column's name; ``numeric`` right-aligns
    it."""

    text: Callable[[Any], str | Text]
    html: Callable[[Any], list[str]]
    fields: Callable[[str, Any], dict[str, Any]] = _one_field
    page_headers: Callable[[str], tuple[str, ...]] = _one_header
    numeric: bool = True


# A name (a model, a dataset, an answerer): literal text in the terminal, never rich markup (a
# variant's printed name, MODEL[user=...], would read as a style tag).
NAME = Format(text=Text, html=lambda v: [esc(v)], numeric=False)
TEMPERATURE = Format(text=temperature, html=lambda v: [temperature_axis(v)])
COUNT = Format(text=str, html=lambda v: [str(v)])
# A count that should be zero (failed turns): highlighted on the page when it is not.
WARNING_COUNT = Format(text=str, html=lambda v: [count(v)])
# A short text among the numbers ("3 of 30"), aligned with them.
WORDS = Format(text=str, html=lambda v: [esc(v)])
RATE = Format(text=rate_interval,
              html=lambda v: [rate_html(v), str(v.n) if v else "–"],
              fields=rate_fields, page_headers=lambda h: (f"{h} [95% CI]", "n"))
F1 = Format(text=f1, html=lambda v: [NA if v is None else esc(f1(v))],
            fields=lambda name, v: {name: csv_number(v)})


def _estimate_text(value: Corrected | str | None) -> str:
    if isinstance(value, Corrected):
        return interval_text(value.value, value.low, value.high)
    return "-" if value is None else f"- ({value})"


def _estimate_html(value: Corrected | str | None) -> list[str]:
    if isinstance(value, Corrected):
        return [rate_html(Rate(0, value.n, value.low, value.high), value=value.value)]
    return [NA if value is None else f'<span class="na">– ({esc(value)})</span>']


def _estimate_fields(name: str, value: Corrected | str | None) -> dict[str, Any]:
    given = value if isinstance(value, Corrected) else None
    return {f"{name}_rate": csv_number(given.value) if given else None,
            f"{name}_low": csv_number(given.low) if given else None,
            f"{name}_high": csv_number(given.high) if given else None}


# A rate estimated from human labels (userturn.stats.correction), or why there is none (a str)
# or nothing (None).
ESTIMATE = Format(text=_estimate_text, html=_estimate_html, fields=_estimate_fields,
                  page_headers=lambda h: (f"{h} [95% CI]",))
# Turns per label: the label-count tables show them; summary.csv writes one field per label.
LABEL_COUNTS = Format(text=lambda v: ", ".join(f"{k} {n}" for k, n in v.items()),
                      html=lambda v: [esc(", ".join(f"{k} {n}" for k, n in v.items()))],
                      fields=lambda name, v: {f"{name}_{label}": v.get(label, 0)
                                              for label in LABELS})


# -- when the terminal and the page show a column ------------------------------------------------
Shown = Callable[[Sequence[SummaryRow], "Column"], bool]
"""Whether the terminal or the page shows ``column`` for a run's rows."""


def always(rows: Sequence[SummaryRow], column: Column) -> bool:
    return True


def never(rows: Sequence[SummaryRow], column: Column) -> bool:
    return False


def varies(rows: Sequence[SummaryRow], column: Column) -> bool:
    """The rows hold more than one value of the column: a key the run does not vary is left
    out of the tables (it is in the run's settings, and in summary.csv)."""
    return len({column.read(row) for row in rows}) > 1


def departs(default: Any) -> Shown:
    """Shown where a row's value is not ``default``: the run set it, even to one value."""
    def shown(rows: Sequence[SummaryRow], column: Column) -> bool:
        return any(column.read(row) != default for row in rows)
    return shown


def with_people(rows: Sequence[SummaryRow], column: Column) -> bool:
    """A person labelled turns of the run: the corrected rate leads, the raw rate beside it."""
    return any(row.human_labels for row in rows)


def without_people(rows: Sequence[SummaryRow], column: Column) -> bool:
    return not with_people(rows, column)


def any_value(rows: Sequence[SummaryRow], column: Column) -> bool:
    """Some row has a value (not None)."""
    return any(column.read(row) is not None for row in rows)


@dataclass(frozen=True)
class Column:
    """One column of the rate table. ``name``: its field in ``summary.csv`` (a rate's fields
    start with it) and its name in code; ``header``: its heading in the terminal (the page adds
    what its format adds, such as ``[95% CI]``); ``read``: its value in a summary row;
    ``shown``: whether the page shows it, and the terminal too unless ``terminal`` says
    otherwise; ``csv``: whether ``summary.csv`` writes it (always, then); ``condition``: it names
    the row's condition, so the label-count tables lead with it too."""

    name: str
    header: str
    read: Callable[[SummaryRow], Any]
    format: Format
    shown: Shown = always
    terminal: Shown | None = None
    csv: bool = True
    condition: bool = False

    def on_terminal(self, rows: Sequence[SummaryRow]) -> bool:
        return (self.terminal or self.shown)(rows, self)

    def on_page(self, rows: Sequence[SummaryRow]) -> bool:
        return self.shown(rows, self)

    def text(self, row: SummaryRow) -> str | Text:
        return self.format.text(self.read(row))

    def html(self, row: SummaryRow) -> list[str]:
        return self.format.html(self.read(row))

    def page_headers(self) -> tuple[str, ...]:
        return self.format.page_headers(self.header)

    def fields(self, row: SummaryRow) -> dict[str, Any]:
        return self.format.fields(self.name, self.read(row))


# -- what the correction columns read -------------------------------------------------------------
def missing_correction(row: SummaryRow) -> str:
    """Why a row has no corrected rate, in a few words: how many more labels it needs, or that
    none can be had."""
    more = row.labels_to_correct
    if row.read_by_people:
        return "read by people"
    if more is None:
        return f"none: {row.follow_up.n} turns"
    return f"{more} more labels"


def labels_text(row: SummaryRow) -> str:
    """The human labels a corrected rate rests on, or how far the row is from one."""
    if row.corrected is not None or row.labels_to_correct is None:
        return str(row.human_labels)
    return f"{row.human_labels} of {MIN_HUMAN_LABELS}"


def _corrected(row: SummaryRow) -> Corrected | str:
    return row.corrected if row.corrected is not None else missing_correction(row)


# -- the list --------------------------------------------------------------------------------------
# Where the terminal and the page differ (the order of dataset and perturbation, the answerer
# shown when set rather than when varied, dataset always in the terminal, the data's real turns
# in the terminal only), a column says so for one surface: the tables read as they did before
# the list.
COLUMNS: list[Column] = [
    # The terminal and the page print the probed model's name with its variants
    # (records.probed_name: MODEL[thinking=on][user=SPEC], as before the typed fields);
    # summary.csv has the model's spec and each variant in a field of its own.
    Column("probed", "model", lambda r: r.probed, NAME, csv=False, condition=True),
    Column("model", "model", lambda r: r.model, NAME, shown=never, condition=True),
    # How the user turn was asked for (records.ARMS): shown once a row is not the opened arm.
    Column("arm", "arm", lambda r: r.arm, NAME, shown=departs("opened"), condition=True),
    Column("user_variant", "user-turn variant", lambda r: r.user_variant, NAME, shown=never,
           condition=True),
    Column("enable_thinking", "enable_thinking", lambda r: r.enable_thinking, NAME,
           shown=never, condition=True),
    Column("answerer", "answerer", lambda r: r.answerer, NAME, shown=varies,
           terminal=departs("self"), condition=True),
    # The terminal lists the perturbation before the dataset, the page and CSV after it.
    Column("perturbation", "perturbation", lambda r: r.perturbation, NAME, shown=never,
           terminal=departs("none"), csv=False, condition=True),
    Column("dataset", "dataset", lambda r: r.dataset, NAME, shown=varies, terminal=always,
           condition=True),
    Column("perturbation", "perturbation", lambda r: r.perturbation, NAME, shown=varies,
           terminal=never, condition=True),
    Column("temperature", "T", lambda r: r.temperature, TEMPERATURE, condition=True),
    Column("items", "items", lambda r: r.items, COUNT),
    Column("turns", "turns", lambda r: r.turns, COUNT),
    Column("follow_up", "follow-up", lambda r: r.follow_up, RATE, shown=without_people),
    # With human labels the corrected rate leads, the labeller's raw rate beside it.
    Column("corrected", "corrected", _corrected, ESTIMATE, shown=with_people),
    Column("raw_follow_up", "raw follow-up", lambda r: r.follow_up, RATE, shown=with_people,
           csv=False),
    Column("human_labels_progress", "human labels", labels_text, WORDS, shown=with_people,
           csv=False),
    Column("human_only", "human only", lambda r: r.human_only, ESTIMATE, shown=with_people),
    Column("human_labels", "human labels", lambda r: r.human_labels, COUNT, shown=never),
    # How many more human labels the row needs for a corrected rate (0: it has one; empty: it
    # cannot have one), and why it has none.
    Column("human_labels_more", "more human labels", lambda r: r.labels_to_correct, COUNT,
           shown=never),
    Column("correction_note", "correction", lambda r: r.correction_note, WORDS, shown=never),
    Column("undecided", "undecided", lambda r: r.undecided, COUNT),
    # Continuations that had another role speak: in the rate as no follow-up, with no label.
    Column("no_user_turn", "no user turn", lambda r: r.no_user_turn, COUNT, shown=departs(0)),
    Column("label_errors", "label errors", lambda r: r.label_errors, WARNING_COUNT),
    Column("errors", "errors", lambda r: r.errors, WARNING_COUNT),
    Column("accuracy", "accuracy", lambda r: r.accuracy, RATE),
    Column("similarity", "vs real turn", lambda r: r.similarity, F1, shown=never,
           terminal=any_value, csv=False),
    Column("label", "labels", lambda r: r.labels, LABEL_COUNTS, shown=never),
]


# -- what the renderers take -----------------------------------------------------------------------
def terminal_columns(rows: Sequence[SummaryRow], *, conditions: bool = False) -> list[Column]:
    """The columns the terminal shows for ``rows`` (``conditions``: those naming the condition)."""
    return [c for c in COLUMNS if (c.condition or not conditions) and c.on_terminal(rows)]


def page_columns(rows: Sequence[SummaryRow], *, conditions: bool = False) -> list[Column]:
    """The columns the page shows for ``rows`` (``conditions``: those naming the condition)."""
    return [c for c in COLUMNS if (c.condition or not conditions) and c.on_page(rows)]


def csv_record(row: SummaryRow, *, conditions: bool = False) -> dict[str, Any]:
    """A row as ``summary.csv`` writes it: every CSV column's fields, in the list's order
    (``conditions``: only those naming the condition, as ``labels.csv`` starts its rows)."""
    record: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for column in COLUMNS:
        if not column.csv or (conditions and not column.condition):
            continue
        for field, value in column.fields(row).items():
            if field in owner:
                raise ValueError(f"columns {owner[field]!r} and {column.name!r} both write the "
                                 f"summary.csv field {field!r}; rename one")
            owner[field] = column.name
            record[field] = value
    return record
