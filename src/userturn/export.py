"""Export a run's user turns (with query, answer, labels, task score) for pandas or DuckDB users:
one row per :class:`~userturn.turns.Turn`, the columns of :data:`~userturn.turns.COLUMNS`."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Sequence

from .errors import UserturnError
from .turns import COLUMNS, Turn


def export_user_turns(turns: Sequence[Turn], out: Path, fmt: str) -> int:
    """Write one row per turn, with the columns of :data:`~userturn.turns.COLUMNS`, to ``out``
    atomically (a temporary file renamed into place). Returns the number of rows."""
    records = [turn.record() for turn in turns]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    if fmt == "jsonl":
        with partial.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        with partial.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(records)
    elif fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UserturnError("Parquet export needs pyarrow: pip install 'userturn[export]'") from None
        table = pa.Table.from_pylist(records) if records else pa.table({c: [] for c in COLUMNS})
        pq.write_table(table, partial)
    else:
        raise UserturnError(f"unknown export format {fmt!r}")
    os.replace(partial, out)
    return len(records)
