"""Export a run's user turns (with query, answer, labels, task score) for pandas or DuckDB users:
one row per :class:`~userturn.records.Turn`, the columns of :data:`~userturn.records.COLUMNS`
and every label source's label and probability (:func:`~userturn.store.turns.flat_records`)."""

from __future__ import annotations

import csv
import json
from contextlib import closing
from pathlib import Path
from typing import Sequence

from userturn.errors import UserturnError
from userturn.records import Turn
from userturn.store.atomic import refuse_to_replace, write_file
from userturn.store.database import RunStore
from userturn.store.turns import flat_records, read_turns


def export_run(folder: Path, fmt: str, out: Path | None = None, *,
               force: bool = False) -> tuple[Path, int]:
    """``userturn export``: the user turns of the run in ``folder`` (read only) to ``out``,
    default ``RUN/user_turns.FORMAT``. A file the user names is theirs: replaced only with
    ``force``. The default file in the run folder is userturn's own and is rewritten. Returns
    the file written and its number of rows."""
    with closing(RunStore.read(folder)) as store:
        target = out or folder / f"user_turns.{fmt}"
        return target, export_user_turns(read_turns(store), target, fmt,
                                         force=force or out is None)


def export_user_turns(turns: Sequence[Turn], out: Path, fmt: str, *, force: bool = False) -> int:
    """Write one row per turn, with the columns of :data:`~userturn.records.COLUMNS`, to ``out``
    atomically (a temporary file renamed into place); an existing ``out`` is replaced only with
    ``force``, a run's database never. Returns the number of rows."""
    if fmt not in ("jsonl", "csv", "parquet"):
        raise UserturnError(f"unknown export format {fmt!r}")
    refuse_to_replace(Path(out), force)
    columns, records = flat_records(turns)

    def write(path: Path) -> None:
        if fmt == "jsonl":
            with path.open("w", encoding="utf-8") as handle:
                for record in records:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        elif fmt == "csv":
            with path.open("w", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
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
                {c: [] for c in columns})
            pq.write_table(table, path)

    write_file(Path(out), write, force=force)
    return len(records)
