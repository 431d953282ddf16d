"""Rows read strictly from a benchmark's data file (GSM8K, MATH, IFEval formats), and the items
made from them.

The first problem ends loading with a ``DatasetError`` that names the file and the row: bytes that
are not UTF-8, a JSONL line that is not JSON, a JSON file that is not a list, a malformed row, a
duplicate id. Rows come as ``(number, data)``: a JSONL row numbered by its 1-based line, a JSON or
Parquet row by its 0-based index. (The user's own files, whose bad rows may be skipped instead,
are read by ``userturn.data.files``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from userturn.errors import DatasetError
from userturn.records import Item


def existing_file(path: Path) -> Path:
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    return path


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise DatasetError(f"cannot read dataset file {path}: {error.strerror}") from None


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """The non-blank lines of a JSONL file, parsed, each with its 1-based line number."""
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path} line {number}: invalid JSON ({error.msg})") from None


def json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON file holding a list, each with its 0-based index."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise invalid_json(path, error) from None
    return enumerate(row_list(path, data))


def invalid_json(path: Path, error: json.JSONDecodeError) -> DatasetError:
    return DatasetError(f"{path} line {error.lineno}: invalid JSON ({error.msg})")


def row_list(path: Path, data: Any) -> list[Any]:
    """``data`` when it is a list of rows; an error naming the file otherwise."""
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of rows, found {type(data).__name__}")
    return data


def parquet_records(path: Path) -> list[dict[str, Any]]:
    """The rows of a Parquet file as dictionaries (pyarrow imported lazily)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DatasetError(f"{path}: cannot read Parquet ({error})") from None
    return table.to_pylist()


def required(row: Mapping[str, Any], field: str) -> Any:
    """A row's value for ``field``; an error when it is missing (or null)."""
    if row.get(field) is None:
        raise DatasetError(f"missing field '{field}'")
    return row[field]


def required_text(row: Mapping[str, Any], field: str) -> str:
    """A row's value for ``field``, unstripped; an error unless it is text with a non-space."""
    value = required(row, field)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"field '{field}' is empty or not text")
    return value


def items_from_rows(
    rows: Iterable[tuple[int, Any]], where: str, unit: str,
    build: Callable[[Any, int, int], Item],
) -> tuple[Item, ...]:
    """``build(data, index, number)`` for each row (``index`` counts rows from 0), with the row's
    ``DatasetError`` prefixed by ``where``, ``unit`` and its number; ids must be unique."""
    items: list[Item] = []
    seen: set[str] = set()
    for index, (number, row) in enumerate(rows):
        try:
            item = build(row, index, number)
        except DatasetError as error:
            raise DatasetError(f"{where} {unit} {number}: {error}") from None
        if item.id in seen:
            raise DatasetError(f"{where} {unit} {number}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise DatasetError(f"{where}: no rows")
    return tuple(items)


def items_with_default_ids(
    rows: Iterable[tuple[int, Any]], prefix: str, where: str, unit: str,
    row_item: Callable[[Any, str, dict[str, int]], Item],
) -> tuple[Item, ...]:
    """``items_from_rows`` where ``row_item(data, default_id, position)`` gets the id for a row
    without its own, ``<prefix>-<index:04d>``, and the position for metadata, ``{unit: number}``."""
    return items_from_rows(rows, where, unit, lambda row, index, number: row_item(
        row, f"{prefix}-{index:04d}", {unit: number}))
