"""The user's own data files (CSV, TSV, JSONL, JSON, Parquet), and the row reading and collecting
that the conversation loaders share.

``file_items`` turns rows into single-turn items: a ``query`` (required), an optional reference
``answer``, ``id`` and ``system`` prompt, each read from a column that ``fields`` names (by default:
query <- ``query`` | ``question`` | ``prompt``; answer <- ``answer`` | ``target`` | ``reference``;
id <- ``id``; system <- ``system``).

Row numbers in messages and in ``Skipped`` follow the GSM8K loader: a JSONL or CSV row by its
1-based line (what an editor shows; for CSV the line its record starts on, the header being line 1),
a JSON or Parquet row by its 0-based index (what ``data[i]`` and pandas show). Generated ids count
data rows from 0 (``<name>-0000``), skipped rows included, so skipping a row never renames the ones
after it.

Malformed rows (a missing field, a wrong type, empty text, bytes that are not UTF-8, a line that is
not JSON) raise ``DatasetError`` naming the file, the row and the field; with ``skip_invalid`` they
are recorded in ``LoadResult.skipped`` and counted instead. A file none of whose rows is valid is an
error either way: nothing is half-loaded silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from userturn.data.reading import (
    LoadResult,
    Recovery,
    Row,
    RowCollector,
    RowError,
    Skipped,
    check_file,
    columns_of,
    is_missing,
    read_rows,
    recover_json_list,
    text_value,
    type_name,
)
from userturn.data.rows import (
    FILE_SUFFIXES,
)
from userturn.errors import ConfigError, DatasetError
from userturn.records import Item
from userturn.settings import bad_text_path

# userturn's fields and the columns tried, in order, when ``fields`` does not name one.
FIELD_DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "query": ("query", "question", "prompt"),
    "answer": ("answer", "target", "reference"),
    "id": ("id",),
    "system": ("system",),
}
REQUIRED_FIELDS = ("query",)
SUFFIXES = FILE_SUFFIXES

# --- the user's own files ----------------------------------------------------------------------

def parse_field_mappings(pairs: Iterable[str]) -> dict[str, str]:
    """CLI ``--field`` values to a mapping: ``["query=question", "answer=target"]`` ->
    ``{"query": "question", "answer": "target"}``."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not name or not column:
            raise ConfigError(
                f"bad field mapping {pair!r}: write FIELD=COLUMN, e.g. query=question "
                f"(fields: {', '.join(FIELD_DEFAULTS)})"
            )
        if name not in FIELD_DEFAULTS:
            raise ConfigError(
                f"bad field mapping {pair!r}: unknown field {name!r}; use one of "
                f"{', '.join(FIELD_DEFAULTS)}"
            )
        if name in mapping and mapping[name] != column:
            raise ConfigError(
                f"field {name!r} mapped twice: to {mapping[name]!r} and to {column!r}"
            )
        mapping[name] = column
    return mapping


def resolve_fields(
    fields: Mapping[str, str] | None, columns: Sequence[str], path: Path
) -> tuple[dict[str, str], set[str]]:
    """The column of each userturn field, and which of them the caller named explicitly."""
    explicit = dict(fields or {})
    unknown = sorted(set(explicit) - set(FIELD_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(map(repr, unknown))} in the field mapping; use one of "
            f"{', '.join(FIELD_DEFAULTS)}"
        )
    bad = [name for name, column in explicit.items() if not isinstance(column, str) or not column]
    if bad:
        raise ConfigError(f"field mapping for {bad[0]!r} must be a column name")
    resolved = dict(explicit)
    available = set(columns)
    for name, candidates in FIELD_DEFAULTS.items():
        if name not in resolved:
            column = next((c for c in candidates if c in available), None)
            if column is not None:
                resolved[name] = column
    if "query" not in resolved:
        raise DatasetError(
            f"{path}: no query column: none of {', '.join(FIELD_DEFAULTS['query'])} is present "
            f"(columns: {', '.join(columns[:12]) or 'none'}); name it, e.g. "
            f"fields={{'query': 'COLUMN'}} or --field query=COLUMN"
        )
    return resolved, set(explicit)


def file_items(
    path: str | Path,
    *,
    fields: Mapping[str, str] | None = None,
    skip_invalid: bool = False,
    name: str | None = None,
    limit: int | None = None,
) -> LoadResult:
    """Single-turn items from the user's own CSV/TSV, JSONL, JSON or Parquet file.

    A field named in ``fields`` is required in every row; a field found by its default column name
    (``answer``, ``id``, ``system``) may be missing or empty in a row. ``query`` is always required.
    ``limit`` keeps the first N valid items; rows after the Nth are not checked.
    """
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    resolved_path = check_file(path)
    rows = list(read_rows(resolved_path)[0])
    columns = columns_of(rows)
    unreadable = next((row for row in rows if row.error is not None), None)
    if not columns and unreadable is not None:  # no row could be read: say why, not "no column"
        raise DatasetError(f"{resolved_path} {unreadable.unit} {unreadable.number}: "
                           f"{unreadable.error}")
    mapping, explicit = resolve_fields(fields, columns, resolved_path)
    stem = name or resolved_path.stem
    collector = RowCollector(resolved_path, skip_invalid, limit)
    collector.collect(rows, lambda row: _file_item(row, mapping, explicit,
                                                   f"{stem}-{row.index:04d}"))
    return collector.finish(stem, fields=mapping)


def _file_item(row: Row, mapping: Mapping[str, str], explicit: set[str], default_id: str) -> Item:
    data = row.data
    if not isinstance(data, Mapping):
        raise RowError(None, f"expected an object with a {mapping['query']!r} column, "
                             f"got {type_name(data)}")
    values: dict[str, Any] = {}
    for name, column in mapping.items():
        required = name in REQUIRED_FIELDS or name in explicit
        convert = {"answer": _answer_value, "id": _id_value}.get(name, text_value)
        try:
            values[name] = convert(data.get(column), name, required=required)
        except RowError as error:
            where = "" if column == name else f" (column '{column}')"
            raise RowError(error.field, error.reason + where) from None
    # Bytes that were not UTF-8 in any other column still make the row invalid: say where.
    bad = bad_text_path(data)
    if bad is not None:
        raise RowError(bad, "invalid UTF-8 (a column userturn does not read)")
    system, query = values.get("system"), values["query"]
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": query}]
    item_id = values.get("id") or default_id
    return Item(item_id, tuple(messages), values.get("answer"), {row.unit: row.number})


def _answer_value(value: Any, name: str, *, required: bool) -> str | None:
    """A reference answer may be a number (GSM8K-style targets, numeric Parquet columns)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_missing(value):
        return str(value)
    return text_value(value, name, required=required)


def _id_value(value: Any, name: str, *, required: bool) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return text_value(value, name, required=required)


__all__ = [
    "FIELD_DEFAULTS", "LoadResult", "Recovery", "Skipped", "file_items", "parse_field_mappings",
    "recover_json_list",
]
