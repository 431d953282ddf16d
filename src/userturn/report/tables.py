"""Every table of the run report as flat records, written as CSV (and Parquet when pyarrow is
installed). The ``user_turns`` table has the columns of :data:`userturn.records.COLUMNS`, as the
export and the sample browser do."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from userturn.records import LABELS, Condition
from userturn.report.compute import CATEGORIES, Report
from userturn.stats.effects import PerturbationEffect
from userturn.stats.rates import Rate
from userturn.stats.summary import SummaryRow
from userturn.store.atomic import write_folder


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
            "labels": [{**_row_keys(r), "label": key, "count": r.status_counts().get(key, 0)}
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
            "user_turn_variants": [
                {"model": v.native, "variant": v.variant, "dataset": v.dataset,
                 "answerer": v.answerer, "perturbation": v.perturbation,
                 "temperature": v.temperature, "items": v.follow_up.items,
                 **_rate_cols("native_follow_up", v.follow_up.a),
                 **_rate_cols("variant_follow_up", v.follow_up.b),
                 "difference": _num(v.follow_up.delta), "difference_low": _num(v.follow_up.low),
                 "difference_high": _num(v.follow_up.high)} for v in report.variants],
            "right_vs_wrong": [_joint_record(key, j) for key, j in report.joints],
            "user_turns": [t.record() for t in report.turns],
            "turn_labels": [label.record(t.key) for t in sorted(report.turns, key=lambda t: t.key)
                            for label in t.labels]}


def _row_keys(row: SummaryRow) -> dict[str, Any]:
    return {"model": row.model, "answerer": row.answerer, "dataset": row.dataset,
            "perturbation": row.perturbation, "temperature": row.temperature}


def _summary_record(row: SummaryRow) -> dict[str, Any]:
    return {**_row_keys(row), "items": row.items, "turns": row.turns,
            **_rate_cols("follow_up", row.follow_up),
            "corrected_rate": _num(row.corrected.value) if row.corrected else None,
            "corrected_low": _num(row.corrected.low) if row.corrected else None,
            "corrected_high": _num(row.corrected.high) if row.corrected else None,
            "human_only_rate": _num(row.human_only.value) if row.human_only else None,
            "human_only_low": _num(row.human_only.low) if row.human_only else None,
            "human_only_high": _num(row.human_only.high) if row.human_only else None,
            "human_labels": row.human_labels,
            # How many more human labels the row needs for a corrected rate (0: it has one;
            # empty: it cannot have one), and why it has none.
            "human_labels_more": row.labels_to_correct, "correction_note": row.correction_note,
            "undecided": row.undecided,
            "label_errors": row.label_errors, "errors": row.errors, **_rate_cols("accuracy", row.accuracy),
            **{f"label_{label}": row.labels.get(label, 0) for label in LABELS}}


def _comparison_record(c: PerturbationEffect) -> dict[str, Any]:
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


def _joint_record(c: Condition, j: dict[str, Any]) -> dict[str, Any]:
    return {"model": c.model, "answerer": c.answerer, "dataset": c.dataset,
            "temperature": c.temperature,
            **_rate_cols("when_right", j["correct"]), **_rate_cols("when_wrong", j["wrong"]),
            "items_right": j["items_correct"], "items_wrong": j["items_wrong"],
            "items_mixed": j["items_mixed"], **j["counts"]}


def export_tables(report: Report, folder: Path) -> list[Path]:
    """Write every table of the report to ``folder`` as CSV, and as Parquet when pyarrow is
    importable, as one set (a full disk leaves the earlier set, not part of a new one).
    Returns the paths written."""
    folder = Path(folder)
    names: list[str] = []

    def write(staging: Path) -> None:
        for name, records in tables(report).items():
            _write_csv(staging / f"{name}.csv", records)
            names.append(f"{name}.csv")
            if _write_parquet(staging / f"{name}.parquet", records):
                names.append(f"{name}.parquet")

    write_folder(folder, write)
    return [folder / name for name in names]


def _columns(records: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for record in records for k in record))


def _write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_columns(records) or ["empty"])
        writer.writeheader()
        writer.writerows(records)


def _write_parquet(path: Path, records: list[dict[str, Any]]) -> bool:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    table = pa.Table.from_pylist(records) if records else pa.table({})
    pq.write_table(table, path)
    return True
