"""Every table of the run report as flat records, written as CSV (and Parquet when pyarrow is
installed). The ``summary`` table has the fields of the rate table's columns
(:data:`userturn.report.columns.COLUMNS`); the ``user_turns`` table has the columns of
:data:`userturn.records.COLUMNS`, as the export and the sample browser do."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from userturn.report.columns import csv_number, csv_record, rate_fields
from userturn.report.compute import Report, categories
from userturn.stats.effects import Joint, PerturbationEffect
from userturn.store.atomic import write_folder


def tables(report: Report) -> dict[str, list[dict[str, Any]]]:
    """Every table of the report, as flat records (the CSV and Parquet files)."""
    return {"summary": [csv_record(r) for r in report.rows],
            "labels": [{**csv_record(r, conditions=True), "label": key,
                        "count": r.status_counts().get(key, 0)}
                       for r in report.rows for key, _ in categories(report.rows)],
            "accuracy_vs_follow_up": [
                {"dataset": p.dataset, "temperature": p.temperature, "model": point.model,
                 **rate_fields("accuracy", point.accuracy),
                 **rate_fields("follow_up", point.follow_up)}
                for p in report.panels for point in p.points],
            "rank_correlation": [
                {"dataset": p.dataset, "temperature": p.temperature, "models": p.correlation.n,
                 "rho": csv_number(p.correlation.rho), "rho_low": csv_number(p.correlation.low),
                 "rho_high": csv_number(p.correlation.high)} for p in report.panels],
            "perturbations": [_comparison_record(c) for c in report.comparisons],
            "user_turn_variants": [
                {"model": v.model, "enable_thinking": v.enable_thinking,
                 "variant": v.variant, "dataset": v.dataset,
                 "answerer": v.answerer, "perturbation": v.perturbation,
                 "temperature": v.temperature, "items": v.follow_up.items,
                 **rate_fields("native_follow_up", v.follow_up.a),
                 **rate_fields("variant_follow_up", v.follow_up.b),
                 "difference": csv_number(v.follow_up.delta),
                 "difference_low": csv_number(v.follow_up.low),
                 "difference_high": csv_number(v.follow_up.high)} for v in report.variants],
            "right_vs_wrong": [_joint_record(joint) for joint in report.joints],
            "user_turns": [t.record() for t in report.turns],
            "turn_labels": [label.record(t.key) for t in sorted(report.turns, key=lambda t: t.key)
                            for label in t.labels]}


def _comparison_record(c: PerturbationEffect) -> dict[str, Any]:
    d, m = c.diff, c.mcnemar
    return {"model": c.model, "user_variant": c.user_variant,
            "enable_thinking": c.enable_thinking, "answerer": c.answerer, "dataset": c.dataset,
            "perturbation": c.perturbation, "temperature": c.temperature, "items": d.items,
            **rate_fields("original", d.a), **rate_fields("perturbed", d.b),
            "difference": csv_number(d.delta), "difference_low": csv_number(d.low),
            "difference_high": csv_number(d.high), "expected": c.expected, "verdict": c.verdict,
            "mcnemar_p": None if m is None else csv_number(m.p_value),
            "discordant_up": None if m is None else m.b01,
            "discordant_down": None if m is None else m.b10,
            "dropped_original": d.dropped_a, "dropped_perturbed": d.dropped_b}


def _joint_record(joint: Joint) -> dict[str, Any]:
    c, j = joint.condition, joint.table
    return {"model": c.model, "user_variant": c.user_variant,
            "enable_thinking": c.enable_thinking, "answerer": c.answerer, "dataset": c.dataset,
            "temperature": c.temperature,
            **rate_fields("when_right", j.correct), **rate_fields("when_wrong", j.wrong),
            "items_right": j.items_correct, "items_wrong": j.items_wrong,
            "items_mixed": j.items_mixed, "correct_hit": j.correct_hit,
            "correct_miss": j.correct_miss, "wrong_hit": j.wrong_hit, "wrong_miss": j.wrong_miss}


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
