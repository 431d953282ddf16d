"""Rows read strictly from a benchmark's data file (GSM8K, MATH, IFEval formats), and the items
made from them.

The first problem ends loading with a ``DatasetError`` that names the file and the row: bytes that
are not UTF-8, a JSONL line that is not JSON, a JSON file that is not a list, a malformed row, a
duplicate id. Rows come as ``(number, data)``: a JSONL row numbered by its 1-based line, a JSON or
Parquet row by its 0-based index. (The user's own files, whose bad rows may be skipped instead,
are read by ``userturn.data.files``.)

``FILE_FORMATS`` is the one list of data-file suffixes: every reader names the formats it takes
and checks a path with ``file_format``, so a suffix accepted by one reader is accepted by all of
them that take its format. ``json_lines`` is the one JSON Lines reader.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping

from userturn.errors import DatasetError
from userturn.records import Item
from userturn.settings import DocumentError, parse_json

FileFormat = Literal["jsonl", "json", "parquet", "csv", "tsv"]
# Every data-file suffix userturn reads, and the format it names (``.ndjson`` is JSON Lines).
FILE_FORMATS: Mapping[str, FileFormat] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
    ".csv": "csv", ".tsv": "tsv",
}
FILE_SUFFIXES = tuple(FILE_FORMATS)
ALL_FORMATS: tuple[FileFormat, ...] = ("jsonl", "json", "parquet", "csv", "tsv")


def suffixes_of(formats: Iterable[FileFormat]) -> tuple[str, ...]:
    """The suffixes of ``formats``, in ``FILE_FORMATS`` order."""
    wanted = set(formats)
    return tuple(suffix for suffix, kind in FILE_FORMATS.items() if kind in wanted)


def file_format(path: Path, formats: Iterable[FileFormat] = ALL_FORMATS,
                what: str = "data") -> FileFormat:
    """The format ``path``'s suffix names, when it is one of ``formats``; an error naming the
    suffixes accepted otherwise (``what``: whose data, e.g. ``MATH-format``)."""
    formats = tuple(formats)
    kind = FILE_FORMATS.get(path.suffix.lower())
    if kind is None or kind not in formats:
        accepted = suffixes_of(formats)
        raise DatasetError(f"{path}: unsupported file type: {what} must be a "
                           f"{', '.join(accepted[:-1])}{' or ' if len(accepted) > 1 else ''}"
                           f"{accepted[-1]} file")
    return kind


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


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSON Lines file: its 1-based number, and its value or why it has
    none (not JSON, or not UTF-8 text)."""

    number: int
    value: Any = None
    error: str | None = None


def json_lines(path: Path, *, keep_bad_bytes: bool = False) -> Iterator[JsonLine]:
    """The non-blank lines of a JSON Lines file (gzip-compressed when its name ends in ``.gz``),
    parsed. A line that cannot be read comes with its error, for the caller to raise or skip.

    With ``keep_bad_bytes``, bytes that are not UTF-8 survive as lone surrogates
    (``surrogateescape``), so that a reader can name the field they sit in; without it such a line
    is an error. A byte-order mark at the start is dropped; a ``\r\n`` line end is one end."""
    decoding = "surrogateescape" if keep_bad_bytes else "strict"
    for number, raw in enumerate(read_bytes(path).split(b"\n"), start=1):
        try:
            line = raw.rstrip(b"\r").decode("utf-8-sig" if number == 1 else "utf-8", decoding)
        except UnicodeDecodeError as error:
            yield JsonLine(number, error=f"not UTF-8 text (byte 0x{raw[error.start]:02x})")
            continue
        if not line.strip():
            continue
        try:
            yield JsonLine(number, parse_json(line))
        except json.JSONDecodeError as error:
            yield JsonLine(number, error=f"invalid JSON ({error.msg} at column {error.colno})")
        except DocumentError as error:
            yield JsonLine(number, error=f"invalid JSON ({error})")


def read_bytes(path: Path) -> bytes:
    """The bytes of a data file, decompressed when its name ends in ``.gz``."""
    try:
        if path.suffix.lower() == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"file not found: {path}") from None
    except (OSError, EOFError) as error:
        reason = getattr(error, "strerror", None) or error
        raise DatasetError(f"cannot read {path}: {reason}") from None


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """The non-blank lines of a JSONL file, parsed, each with its 1-based line number; the first
    line that cannot be read is an error."""
    for line in json_lines(path):
        if line.error is not None:
            raise DatasetError(f"{path} line {line.number}: {line.error}")
        yield line.number, line.value


def json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON file holding a list, each with its 0-based index."""
    try:
        data = parse_json(read_text(path))
    except ValueError as error:
        raise invalid_json(path, error) from None
    return enumerate(row_list(path, data))


def invalid_json(path: Path, error: ValueError) -> DatasetError:
    """The one line for a JSON file that does not parse (where) or cannot be used (why)."""
    if isinstance(error, json.JSONDecodeError):
        return DatasetError(f"{path} line {error.lineno}: invalid JSON ({error.msg})")
    return DatasetError(f"{path}: invalid JSON ({error})")


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
