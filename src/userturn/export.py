"""Export a run's user turns (with query, answer, labels, task score) for pandas or DuckDB users."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from .atomic import refuse_to_replace, write_file
from .errors import UserturnError
from .store import RunStore

COLUMNS = ("model", "dataset", "item_id", "context", "temperature", "sample_index", "query",
           "answer", "answer_correct", "user_turn", "raw_user_turn", "thinking", "finish_reason",
           "error", "label", "label_source", "rationale", "prompt", "key")


def user_turn_records(store: RunStore) -> list[dict[str, Any]]:
    records = []
    for turn in store.user_turns():
        records.append({
            **{k: turn[k] for k in ("model", "dataset", "item_id", "context", "temperature",
                                    "sample_index", "answer", "finish_reason", "error", "label",
                                    "rationale", "label_source", "prompt", "key", "query",
                                    "thinking")},
            "answer_correct": None if turn["correct"] is None else bool(turn["correct"]),
            "user_turn": turn["text"], "raw_user_turn": turn["raw_text"],
        })
    return [{column: record[column] for column in COLUMNS} for record in records]


def export_user_turns(store: RunStore, out: Path, fmt: str, *, force: bool = False) -> int:
    """Write the records to ``out`` atomically (a temporary file renamed into place); an
    existing ``out`` is replaced only with ``force``, a run's database never."""
    if fmt not in ("jsonl", "csv", "parquet"):
        raise UserturnError(f"unknown export format {fmt!r}")
    refuse_to_replace(Path(out), force)
    records = user_turn_records(store)

    def write(path: Path) -> None:
        if fmt == "jsonl":
            with path.open("w", encoding="utf-8") as handle:
                for record in records:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        elif fmt == "csv":
            with path.open("w", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=COLUMNS)
                writer.writeheader()
                writer.writerows(records)
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise UserturnError("Parquet export needs pyarrow: pip install "
                                    "'userturn[export]'") from None
            table = pa.Table.from_pylist(records) if records else pa.table(
                {c: [] for c in COLUMNS})
            pq.write_table(table, path)

    write_file(Path(out), write, force=force)
    return len(records)
