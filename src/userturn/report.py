"""The run report: one self-contained HTML file (tables, inline SVG plots, a sample browser) and
every table of it as CSV (and Parquet when pyarrow is installed).

``build_report`` computes everything once from the store; ``write_html_report`` and
``export_tables`` only lay it out. The numbers are the ones ``summarize`` and ``stats`` give: a
turn counts towards a follow-up rate when it was generated and a labeller could look at it
(undecided counts as not follow-up; invalid verdicts and failed generations are left out and
counted beside the rate). Everything a model wrote is untrusted: it reaches the page only as JSON
(every ``<``, ``>`` and ``&`` escaped as ``\\u003c`` etc., so no ``</script>`` or ``<!--`` can end
the block) and is put on screen with ``textContent`` only.
"""

from __future__ import annotations

import csv
import json
import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from . import plots
from .atomic import make_folder, refuse_to_replace, write_file, write_text
from .perturb import EXPECTED
from .records import LABELS
from .stats import Correlation, Difference, McNemar, Rate, direction, joint_table
from .stats import paired_difference, rank_correlation, single_sample_mcnemar
from .store import RunStore
from .summary import Row, assistant_errors, counts_toward_rate, summarize

STATUSES = ("undecided", "invalid", "failed")  # turns without a label, in plot 3 and the browser
CATEGORIES = [(label, label.replace("_", " ")) for label in LABELS] + [
    (s, "generation failed" if s == "failed" else s) for s in STATUSES]


@dataclass(frozen=True)
class Comparison:
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


@dataclass
class Report:
    folder: Path
    meta: dict[str, Any]
    sources: list[str]
    rows: list[Row]
    comparisons: list[Comparison]
    panels: list[Panel]
    joints: list[tuple[tuple[str, str, str, float], dict[str, Any]]]
    turns: list[dict[str, Any]]
    all_labels: dict[str, list[dict[str, Any]]]
    models: list[str] = field(default_factory=list)
    assistant_failures: int = 0
    state: Any = None  # runstate.RunState: finished, in progress or incomplete

    def varies(self, name: str) -> bool:
        return len({getattr(r, name) for r in self.rows}) > 1

    def condition(self, model: str, answerer: str, dataset: str) -> str:
        parts = [model] + ([dataset] if self.varies("dataset") else [])
        return " · ".join(parts + ([f"answers: {answerer}"] if self.varies("answerer") else []))


# -- computing -------------------------------------------------------------------------------------
def build_report(store: RunStore, labels: Sequence[str] | None = None) -> Report:
    sources = ([labels] if isinstance(labels, str) else list(labels)) if labels else (
        store.label_sources())
    rows = summarize(store, sources)
    turns = sorted(store.user_turns(sources), key=_turn_order)
    for turn in turns:
        turn["status"] = status(turn)
    models = list(dict.fromkeys(store.meta().get("config", {}).get("models", [])))
    models += sorted({r.model for r in rows} - set(models))
    from .runstate import run_state

    return Report(Path(store.folder).resolve(), store.meta(), sources, rows, _comparisons(turns),
                  _panels(rows), _joints(turns), turns, _all_labels(store), models,
                  assistant_errors(store), run_state(store))


def _turn_order(t: dict[str, Any]) -> tuple:
    """The store's order, with each condition's original context before its perturbations."""
    return (t["model"], t["answerer"], t["dataset"], t["perturbation"] != "none",
            t["perturbation"], t["temperature"], t["item_id"], t["sample_index"])


def status(turn: dict[str, Any]) -> str:
    """The decided label, or why there is none: undecided, invalid (a judge failed), failed."""
    if turn["error"] is not None:
        return "failed"
    return turn["label"] or ("invalid" if turn["label_error"] else "undecided")


def _all_labels(store: RunStore) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in store.db.execute("SELECT key, source, version, label, rationale, error FROM labels "
                              "ORDER BY source"):
        out[r["key"]].append(dict(r))
    return out


def _comparisons(turns: list[dict[str, Any]]) -> list[Comparison]:
    groups: dict[tuple, list[tuple[str, bool]]] = defaultdict(list)
    for t in turns:
        if counts_toward_rate(t):
            groups[(t["model"], t["answerer"], t["dataset"], t["temperature"],
                    t["perturbation"])].append((t["item_id"], t["label"] == "follow_up"))
    out = []
    for (model, answerer, dataset, temperature, spec), after in groups.items():
        before = groups.get((model, answerer, dataset, temperature, "none"))
        if spec == "none" or before is None:
            continue
        out.append(Comparison(model, answerer, dataset, spec, temperature,
                              paired_difference(before, after),
                              EXPECTED.get(spec.split(":")[0], "up"),
                              single_sample_mcnemar(before, after)))
    return sorted(out, key=lambda c: (c.model, c.answerer, c.dataset, c.perturbation,
                                      c.temperature))


def _panels(rows: list[Row]) -> list[Panel]:
    chosen = [r for r in rows if r.answerer == "self" and r.perturbation == "none"]
    panels = []
    for dataset, temperature in sorted({(r.dataset, r.temperature) for r in chosen}):
        points = [(r.model, r.accuracy, r.follow_up) for r in chosen
                  if (r.dataset, r.temperature) == (dataset, temperature)
                  and r.accuracy is not None and r.accuracy.n and r.follow_up.n]
        corr = rank_correlation([a.value for _, a, _ in points], [f.value for *_, f in points])
        panels.append(Panel(dataset, temperature, points, corr))
    return panels


def _joints(turns: list[dict[str, Any]]) -> list[tuple[tuple[str, str, str, float], dict]]:
    groups: dict[tuple[str, str, str, float], list[tuple[str, bool, bool]]] = defaultdict(list)
    for t in turns:
        if t["perturbation"] == "none" and t["correct"] is not None and counts_toward_rate(t):
            groups[(t["model"], t["answerer"], t["dataset"], t["temperature"])].append(
                (t["item_id"], bool(t["correct"]), t["label"] == "follow_up"))
    return [(key, joint_table(triples)) for key, triples in sorted(groups.items())]


# -- tables (CSV, Parquet, and the HTML tables) ----------------------------------------------------
def _rate_cols(prefix: str, rate: Rate | None) -> dict[str, Any]:
    if rate is None:
        return {f"{prefix}": None, f"{prefix}_low": None, f"{prefix}_high": None,
                f"{prefix}_hits": None, f"{prefix}_n": None}
    return {prefix: _num(rate.value), f"{prefix}_low": _num(rate.low),
            f"{prefix}_high": _num(rate.high), f"{prefix}_hits": rate.hits, f"{prefix}_n": rate.n}


def _num(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 6)


def tables(report: Report) -> dict[str, list[dict[str, Any]]]:
    """Every table of the report, as flat records (the CSV and Parquet files)."""
    return {"summary": [_summary_record(r) for r in report.rows],
            "labels": [{**_row_keys(r), "label": key, "count": _bar_counts(r).get(key, 0)}
                       for r in report.rows for key, _ in CATEGORIES],
            "accuracy_vs_follow_up": [
                {"dataset": p.dataset, "temperature": p.temperature, "model": model,
                 **_rate_cols("accuracy", acc), **_rate_cols("follow_up", rate)}
                for p in report.panels for model, acc, rate in p.points],
            "rank_correlation": [
                {"dataset": p.dataset, "temperature": p.temperature, "models": p.correlation.n,
                 "rho": _num(p.correlation.rho), "rho_low": _num(p.correlation.low),
                 "rho_high": _num(p.correlation.high)} for p in report.panels],
            "perturbations": [_comparison_record(c) for c in report.comparisons],
            "right_vs_wrong": [_joint_record(key, j) for key, j in report.joints],
            "user_turns": [_turn_record(t) for t in report.turns],
            "turn_labels": [label for key in sorted(report.all_labels)
                            for label in report.all_labels[key]]}


def _row_keys(row: Row) -> dict[str, Any]:
    return {"model": row.model, "answerer": row.answerer, "dataset": row.dataset,
            "perturbation": row.perturbation, "temperature": row.temperature}


def _summary_record(row: Row) -> dict[str, Any]:
    return {**_row_keys(row), "items": row.items, "turns": row.turns,
            **_rate_cols("follow_up", row.follow_up), "undecided": row.undecided,
            "invalid": row.invalid, "errors": row.errors, **_rate_cols("accuracy", row.accuracy),
            **{f"label_{label}": row.labels.get(label, 0) for label in LABELS}}


def _bar_counts(row: Row) -> dict[str, int]:
    return {**row.labels, "undecided": row.undecided, "invalid": row.invalid,
            "failed": row.errors}


def _comparison_record(c: Comparison) -> dict[str, Any]:
    d, m = c.diff, c.mcnemar
    return {"model": c.model, "answerer": c.answerer, "dataset": c.dataset,
            "perturbation": c.perturbation, "temperature": c.temperature, "items": d.items,
            **_rate_cols("original", d.a), **_rate_cols("perturbed", d.b),
            "difference": _num(d.delta), "difference_low": _num(d.low),
            "difference_high": _num(d.high), "expected": c.expected, "verdict": c.verdict,
            "mcnemar_p": None if m is None else _num(m.p_value),
            "discordant_up": None if m is None else m.b01,
            "discordant_down": None if m is None else m.b10,
            "dropped_original": d.dropped_a, "dropped_perturbed": d.dropped_b}


def _joint_record(key: tuple[str, str, str, float], j: dict[str, Any]) -> dict[str, Any]:
    model, answerer, dataset, temperature = key
    return {"model": model, "answerer": answerer, "dataset": dataset, "temperature": temperature,
            **_rate_cols("when_right", j["correct"]), **_rate_cols("when_wrong", j["wrong"]),
            "items_right": j["items_correct"], "items_wrong": j["items_wrong"],
            "items_mixed": j["items_mixed"], **j["counts"]}


TURN_COLUMNS = ("model", "answerer", "dataset", "perturbation", "temperature", "sample_index",
                "item_id", "query", "answer", "correct", "text", "raw_text", "thinking",
                "finish_reason",
                "error", "label", "label_source", "rationale", "label_error", "status", "prompt",
                "key")


def _turn_record(turn: dict[str, Any]) -> dict[str, Any]:
    record = {name: turn.get(name) for name in TURN_COLUMNS}
    record["correct"] = None if turn["correct"] is None else bool(turn["correct"])
    return record


def export_tables(store: RunStore, folder: Path, *, labels: Sequence[str] | None = None,
                  report: Report | None = None) -> list[Path]:
    """Write every table of the report to ``folder`` as CSV, and as Parquet when pyarrow is
    importable. Returns the paths written."""
    folder = Path(folder)
    make_folder(folder)
    written = []
    for name, records in tables(report or build_report(store, labels)).items():
        written.append(_write_csv(folder / f"{name}.csv", records))
        parquet = _write_parquet(folder / f"{name}.parquet", records)
        written += [parquet] if parquet else []
    return written


def _columns(records: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for record in records for k in record))


def _write_csv(path: Path, records: list[dict[str, Any]]) -> Path:
    def write(partial: Path) -> None:
        with partial.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=_columns(records) or ["empty"])
            writer.writeheader()
            writer.writerows(records)
    return write_file(path, write)


def _write_parquet(path: Path, records: list[dict[str, Any]]) -> Path | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    table = pa.Table.from_pylist(records) if records else pa.table({})
    return write_file(path, lambda partial: pq.write_table(table, partial))


# -- the page --------------------------------------------------------------------------------------
def write_html_report(store: RunStore, out: Path, *, labels: Sequence[str] | None = None,
                      tables_dir: Path | None = None) -> Path:
    """Write the report to ``out`` (one HTML file, no network). With ``tables_dir`` the tables
    are exported there too and linked from the page."""
    from .report_html import render_page

    report = build_report(store, labels)
    out = Path(out)
    refuse_to_replace(out, force=True)  # before the tables: never over a database or a folder
    make_folder(out.parent)
    files = export_tables(store, tables_dir, report=report) if tables_dir is not None else []
    links = [_relative(path, out.parent) for path in files]
    page = render_page(report, _template(), browser_data(report), links)
    return write_text(out, page)


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri()


def _template() -> str:
    return resources.files("userturn").joinpath("report_page.html").read_text(encoding="utf-8")


def browser_data(report: Report) -> dict[str, Any]:
    """The sample browser's data: long texts (queries, answers, prompts) are stored once."""
    texts: dict[str, int] = {}

    def ref(value: str | None) -> int:
        return texts.setdefault(value or "", len(texts))

    turns = [{"key": t["key"], "model": t["model"], "answerer": t["answerer"],
              "dataset": t["dataset"], "perturbation": t["perturbation"],
              "temperature": t["temperature"], "sample": t["sample_index"], "item": t["item_id"],
              "query": ref(t["query"]), "answer": ref(t["answer"]), "prompt": ref(t["prompt"]),
              "text": t["text"], "raw": t["raw_text"], "thinking": t.get("thinking"),
              "finish": t["finish_reason"],
              "error": t["error"], "status": t["status"], "source": t["label_source"],
              "correct": None if t["correct"] is None else bool(t["correct"]),
              "labels": [[lab["source"], lab["label"], lab["rationale"], lab["error"]]
                         for lab in report.all_labels.get(t["key"], [])]}
             for t in report.turns]
    return {"texts": list(texts), "turns": turns, "colours": plots.LABEL_COLOURS,
            "categories": [key for key, _ in CATEGORIES]}


def json_for_script(data: Any) -> str:
    """JSON that cannot end or re-open its ``<script>`` block: ``<``, ``>`` and ``&`` become
    unicode escapes (so ``</script>`` reads ``\\u003c/script\\u003e``), which JSON.parse undoes."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{{NAME}}`` placeholders in one pass (inserted text is never scanned again)."""
    return re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: values[m.group(1)], template)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def esc(value: Any) -> str:
    return escape(str(value), quote=True)
